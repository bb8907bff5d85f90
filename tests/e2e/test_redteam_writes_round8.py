"""Red team round 8, the write protocol, stops and readers: reproducers of holes left after the
seventh round's fixes. Each asserts the promised behaviour, so each fails until it is fixed.

A stop is injected as an operator sends it (a prelude wraps one of kvtrace's own steps and
signals right before or after it); the CLI's own handlers then do what they do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import chat, write_jsonl

pytestmark = pytest.mark.slow
ROUND8 = "red team round 8"
ROOT = Path(__file__).resolve().parents[2]
NOTHING = "stopped: nothing published"


def _kvtrace(
    *args: str, prelude: str = "", timeout: int = 300, env: dict | None = None, **kwargs
) -> subprocess.CompletedProcess:
    """kvtrace in a child process (prelude: Python run first, to inject a stop)."""
    code = prelude + "\nimport sys\nfrom kvtrace.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        timeout=timeout,
        text=True,
        check=False,
        **kwargs,
    )


def _said(done: subprocess.CompletedProcess) -> list[str]:
    """What the run said on stderr, its progress log (INFO lines, transformers') aside."""
    return [
        line
        for line in done.stderr.splitlines()
        if " INFO " not in line and "PyTorch was not found" not in line
    ]


def _night(tmp_path: Path, tokenizer: str, n: int, letters: bool = True) -> list[str]:
    """An anonymize run's arguments on a log of n chats (and two dead letters, if letters)."""
    src = write_jsonl(
        tmp_path / f"in{n}.jsonl",
        [chat(i, 1000 * i) for i in range(n)] + ([b"{broken", b"[]"] if letters else []),
    )
    salt = tmp_path / "salt"
    salt.write_text("round-eight-salt-of-thirty-two-b")
    return [
        "--input",
        str(src),
        "--tokenizer",
        tokenizer,
        "--block-size",
        "4",
        "--salt-file",
        str(salt),
    ]


# `kill PARENT` (SIGTERM) sent right after the trace was published, by whichever process
# published it: as an operator's signal landing while it publishes. (Round 8's fix publishes in
# the parent, the process that reports: the child stages; before, the child published.)
_TERM_PARENT_AFTER_CHILD_PUBLISHED = """
import os, signal, time
from kvtrace.transforms.write import publish
_parent = os.getpid()
_publish = publish.publish_in_place
def _publish_then_stop(*args, **kwargs):
    _publish(*args, **kwargs)
    os.kill(_parent, signal.SIGTERM)
    if os.getpid() != _parent:
        time.sleep(1)
publish.publish_in_place = _publish_then_stop
"""


@pytest.mark.beam
def test_a_stop_after_the_beam_child_published_never_says_nothing_was(tiny_tokenizer, tmp_path):
    """--engine beam runs its job in a child (pipelines/child_process.run_in_child), and the
    child publishes the trace (anonymize_night.publish_trace). What a stop says comes from
    publish.published_here(), a record of the process it is read in: the parent's, empty. A
    SIGTERM to the CLI once the child has published exits 143 with "stopped: nothing
    published" beside a whole, fresh output (with dead letters, it names the letters alone).
    Round 6's fix (a stop after publication says so) holds only where the publication ran in
    the process that reports: the record does not cross the child's boundary."""
    out = tmp_path / "out"
    night = _night(tmp_path, tiny_tokenizer, 6, letters=False)
    stopped = _kvtrace(
        "anonymize",
        *night,
        "--engine",
        "beam",
        "--output",
        str(out),
        prelude=_TERM_PARENT_AFTER_CHILD_PUBLISHED,
    )
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert (out / "manifest.json").is_file()  # published whole by the stopped run's child
    assert NOTHING not in _said(stopped), _said(stopped)


# The Beam job's child, once started, stops the CLI (SIGTERM, as `kill PID`) and then itself
# (SIGSTOP: as a child busy in a native call, a tokenizer's encode of a long prompt, that cannot
# unwind within the parent's UNWIND_S).
_TERM_PARENT_WHILE_CHILD_IS_BUSY = """
import os, signal, time
from kvtrace.pipelines import anonymize_beam
_parent = os.getpid()
_run_here = anonymize_beam._run_here
def _busy(*args, **kwargs):
    time.sleep(1)  # the parent waiting on the child (child_process._wait_for)
    os.kill(_parent, signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGSTOP)
    return _run_here(*args, **kwargs)
anonymize_beam._run_here = _busy
"""


@pytest.mark.beam
def test_a_stop_while_the_beam_child_is_busy_removes_the_standard_input_spool(
    tiny_tokenizer, tmp_path
):
    """`--input -` is spooled to a private folder of $TMPDIR, "removed when the run ends"
    (decompress.spooled_standard_input: a finally block). A stop while the Beam child cannot
    unwind at once: the parent's main thread waits UNWIND_S (1.5 s) in child_process._stop,
    the CLI's watcher waits STOP_DEADLINE_S (1.5 s) and then ends the process with os._exit
    (cli._Stop.end): the finally blocks never run. The copy of the whole private log stays in
    $TMPDIR (kvtrace-stdin-*/stdin.jsonl) for good, with the letters' staging folder and the
    lock file; the run said "stopped: nothing published" (abandon_staged knows no spool)."""
    night = _night(tmp_path, tiny_tokenizer, 6)
    night[night.index("--input") + 1] = "-"
    left: list[str] = []
    for attempt in range(8):  # the deadline and the unwinding race: either may win a run
        if left:
            break
        tmp = tmp_path / f"tmp{attempt}"
        tmp.mkdir()
        with open(tmp_path / "in6.jsonl", "rb") as log:
            stopped = _kvtrace(
                "anonymize",
                *night,
                "--engine",
                "beam",
                "--output",
                str(tmp_path / f"out{attempt}"),
                prelude=_TERM_PARENT_WHILE_CHILD_IS_BUSY,
                stdin=log,
                timeout=120,
                env={"TMPDIR": str(tmp)},
            )
        assert stopped.returncode == 143, stopped.stderr[-2000:]
        left += [p.name for p in tmp.iterdir() if p.name.startswith("kvtrace-stdin-")]
    assert left == [], left  # the log's copy gone with the run, every time (seen: 3 runs in 4)


# SIGTERM arriving while the Beam job's child is forked: the first of the parent's after-fork
# hooks (registered first, as a C call: no Python of its own) delivers it, so the CLI's handler
# runs in the hooks, as a signal landing mid-fork does (seen unprompted in logging's
# _releaseLock, "Exception ignored in: <function _releaseLock ...>").
_TERM_DURING_THE_CHILDS_FORK = """
import functools, os, signal
os.register_at_fork(after_in_parent=functools.partial(os.kill, os.getpid(), signal.SIGTERM))
"""


@pytest.mark.beam
def test_a_stop_while_the_beam_child_forks_prints_no_traceback(tiny_tokenizer, tmp_path):
    """The local engine blocks SIGINT and SIGTERM around its forks (local_workers: pthread_sigmask
    SIG_BLOCK), the Beam engine's child_process.run_in_child does not. A stop landing while the
    child is forked runs the CLI's handler inside an after-fork hook, where CPython prints the
    KeyboardInterrupt's traceback ("Exception ignored in: ... Traceback ... raise
    KeyboardInterrupt") and drops it: the stop is lost, the run goes on until the watcher's
    deadline ends it with os._exit, its finally blocks unrun (the stdin spool and the Beam
    temporary folder may stay in $TMPDIR). Bad input or a stop: a one-line error, never a
    traceback."""
    night = _night(tmp_path, tiny_tokenizer, 6)
    stopped = _kvtrace(
        "anonymize",
        *night,
        "--engine",
        "beam",
        "--output",
        str(tmp_path / "out"),
        prelude=_TERM_DURING_THE_CHILDS_FORK,
        timeout=120,
    )
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert not any("Traceback" in line for line in _said(stopped)), _said(stopped)


# The Beam job's child killed (SIGKILL: the OOM killer) right after it published the trace, or
# (round 8's fix: the child stages, the parent publishes) after its job, the output staged
# whole, before its outcome is sent: the last moment it could die in.
_KILL_CHILD_AFTER_IT_PUBLISHED = """
import os, signal
from kvtrace.pipelines import anonymize_beam
from kvtrace.transforms.write import publish
_parent = os.getpid()
def _then_die(step):
    def _step(*args, **kwargs):
        done = step(*args, **kwargs)
        if os.getpid() != _parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return done
    return _step
publish.publish_in_place = _then_die(publish.publish_in_place)
anonymize_beam._run_here = _then_die(anonymize_beam._run_here)
"""


@pytest.mark.beam
def test_a_beam_run_that_fails_has_published_nothing(tiny_tokenizer, tmp_path):
    """The child publishes, then dies before it can send its outcome: the parent takes the
    closed pipe for a death mid-job (child_process._wait_for: _DIED, JobStopped) and exits 1,
    "error: a worker process died by SIGKILL", beside a fresh output and its letters, whole.
    A run that fails publishes nothing (the local engine publishes in the process that
    reports, so its failure and its publication never disagree)."""
    out = tmp_path / "out"
    night = _night(tmp_path, tiny_tokenizer, 6)
    failed = _kvtrace(
        "anonymize",
        *night,
        "--engine",
        "beam",
        "--output",
        str(out),
        prelude=_KILL_CHILD_AFTER_IT_PUBLISHED,
    )
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert "died by SIGKILL" in failed.stderr
    assert not out.exists(), sorted(p.name for p in out.iterdir())


def test_a_refused_run_makes_no_id_map_folder(tiny_tokenizer, tmp_path):
    """anonymize opens --id-map (kvtrace/commands/anonymize.py _open_id_map, which makes the
    folder) before it checks --emit-block-hashes (_block_hashes_directory: a keyed scheme, a
    folder holding foreign files): the run is refused in one line, exit 2, and leaves a new,
    empty, owner-only id map folder behind. Every check is made before the work writes."""
    night = _night(tmp_path, tiny_tokenizer, 6)
    refused = _kvtrace(
        "anonymize",
        *night,
        "--output",
        str(tmp_path / "out"),
        "--id-map",
        str(tmp_path / "map"),
        "--emit-block-hashes",
        str(tmp_path / "hashes"),
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "--emit-block-hashes writes engine hashes" in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in6.jsonl", "salt"]


def test_storage_running_out_while_standard_input_is_spooled_is_a_stopped_job(
    tiny_tokenizer, tmp_path
):
    """kvtrace/cli.py: storage running out (ENOSPC, EDQUOT, EFBIG) "is a job that stopped (1, as
    the Beam engine's wrapped error is), never a refusal (2)", and so it is for every output.
    The spool of `--input -` (decompress._spool) turns the same OSError into a ConfigError:
    exit 2, the code that tells a scheduler the command line is wrong and retrying is useless."""
    night = _night(tmp_path, tiny_tokenizer, 300)
    night[night.index("--input") + 1] = "-"
    code = "import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))"
    with open(tmp_path / "in300.jsonl", "rb") as log:
        full = _kvtrace(
            "anonymize",
            *night,
            "--output",
            str(tmp_path / "out"),
            prelude=code,
            stdin=log,
            timeout=120,
            env={"TMPDIR": str(tmp_path)},
        )
    assert "File too large" in full.stderr, full.stderr[-2000:]
    assert full.returncode == 1, _said(full)
