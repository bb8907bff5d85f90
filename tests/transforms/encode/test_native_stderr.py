"""Native stderr's last words: kept for whoever sees a process die (the local engine's parent,
whose forked workers write to its pipe), read up to the moment they are asked for."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import ROOT
from kvtrace.transforms.encode.native_stderr import KEPT_LINE_CHARS, KEPT_LINES

# A forked child writes as Rust does when an allocation fails, then aborts; the parent asks for
# the last words at once (no wait for the relay to have read them), as anonymize_local does.
DIES = """
import json, logging, os, sys
from kvtrace.transforms.encode.native_stderr import capture_native_stderr, last_words
logging.basicConfig(format="%(name)s: %(message)s", level=sys.argv[1])
capture_native_stderr()
child = os.fork()
if child == 0:
    for i in range(int(sys.argv[2])):
        os.write(2, b"earlier line %d " % i + b"x" * int(sys.argv[3]) + b"\\n")
    os.write(2, b"memory allocation of 80 bytes failed\\n")
    os.abort()
_, status = os.waitpid(child, 0)
print(json.dumps([os.WTERMSIG(status), last_words(), last_words()]), flush=True)
os._exit(0)
"""


def died(level: str, earlier: int = 0, width: int = 1) -> tuple[list, str]:
    done = subprocess.run(
        [sys.executable, "-c", DIES, level, str(earlier), str(width)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return json.loads(done.stdout), done.stderr


def test_a_forked_child_s_last_native_words_are_read_before_they_are_given():
    (signum, words, again), said = died("CRITICAL")
    assert signum == 6 and words == again == ["memory allocation of 80 bytes failed"]
    assert "read-to-here" not in said  # the marks that drain the pipe are never logged


def test_the_words_kept_are_the_last_lines_each_cut_to_a_line():
    (_, words, _), said = died("INFO", earlier=20, width=10_000)
    assert len(words) == KEPT_LINES and words[-1] == "memory allocation of 80 bytes failed"
    assert words[0].startswith(f"earlier line {20 - KEPT_LINES + 1} ")
    assert max(len(w) for w in words) == KEPT_LINE_CHARS
    assert said.count("native: earlier line") == 20 and "read-to-here" not in said
