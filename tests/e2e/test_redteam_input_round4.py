"""Red-team round 4: hostile input to `kvtrace anonymize` and the reading commands, past the
round-1..3 fixes (test_redteam_input*.py). Each test asserts a promise the tool makes and fails
today (2026-11-27)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, chat, write_jsonl

pytestmark = [pytest.mark.slow]
ROUND4 = "red team round 4"


def _template_folder(tiny_tokenizer, tmp_path, template: str):
    folder = tmp_path / "tok"
    shutil.copytree(tiny_tokenizer, folder)
    (folder / "chat_template.jinja").write_text(template + "{{ messages[0].content }}")
    return folder


def _anonymize_child(folder, src, out, address_space: int | None = None, *extra: str):
    """anonymize in a child (its address space capped when asked): (exit code, stderr)."""
    def cap():
        if address_space:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    proc = subprocess.run(
        [sys.executable, "-m", "kvtrace.cli", "anonymize", "--input", str(src), "--output",
         str(out), "--tokenizer", str(folder), "--block-size", "4", "--processes", "1", *extra],
        cwd=ROOT, capture_output=True, timeout=300, preexec_fn=cap,
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return proc.returncode, proc.stderr.decode(errors="replace")


def _letters(out) -> list[dict]:
    folder = out.parent / f"{out.name}-rejected"
    return [json.loads(line) for f in sorted(folder.glob("rejected-*.jsonl"))
            for line in f.read_text().splitlines() if line]


BOOM = {"timestamp": 5, "messages": [{"role": "user", "content": "boom"}], "output_length": 1}


# ---- bytes are not sized: `"x".encode() * n` builds any size in one C call -------------------

@pytest.mark.xfail(strict=True, reason=ROUND4)
def test_a_template_cannot_build_bytes_past_the_value_bound(tiny_tokenizer, tmp_path):
    """bounded_sandbox.py promises no value a template builds exceeds MAX_VALUE_LENGTH (256 Mi)
    and every `*` is sized from its operands first. But its sizes know only str, list and tuple
    (_sized, _checked, _SIZED): `str.encode` is a safe method, and `bytes * n` is sized as 0
    (_check_binop's `*` branch: `_sized(bytes) * count`), so `"x".encode() * 400_000_000`
    builds 400 MB in one memset and the record is exported (measured: 479 MB peak, rc 0).
    With n = 4e9 it is 4 GB in one C call, past the 1 GiB render budget, which only looks
    between steps. The same holds for `bytes % (...)` widths, bytes.replace/center/join, and
    `{{ b }}` (repr of bytes, up to 4x)."""
    folder = _template_folder(
        tiny_tokenizer, tmp_path,
        '{% if messages[0].content == "boom" %}{% set b = "x".encode() * 400000000 %}'
        '{{ b|length }}{% endif %}')
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0), chat(1, 1), chat(2, 2), BOOM])
    out = tmp_path / "out"
    code, said = _anonymize_child(folder, src, out)
    assert code == 0, said[-2000:]
    assert [letter["error"] for letter in _letters(out)] == ["template_error"]


# ---- repr of what the walk does not know: dict views printed whole before they are sized -----

@pytest.mark.xfail(strict=True, reason=ROUND4)
def test_a_dict_view_is_sized_before_it_is_printed(tiny_tokenizer, tmp_path):
    """_text_length (bounded_sandbox.py) walks lists, tuples, dicts and namespaces, and sizes
    anything else as `len(repr(value))`: it builds the text to measure it. `d.values()` is a
    safe dict method returning a dict_values view; a dict literal naming one list 10 times,
    that list naming one 1 MB string 200 times (each step sized and within bounds: 200 M),
    prints as 2 GB. `{{ d.values() }}`, `|string`, `~` and `"%s" %` all size it by building
    it: one C call, past the 1 GiB render budget and MAX_VALUE_LENGTH. Run here under a 1.8 GB
    address-space cap so the machine survives: the record's dead letter says `MemoryError`
    (which depends on the machine's memory, where the docs promise a template_error that
    depends only on the template and the record) instead of a refusal from its size (or, on a
    loaded machine, an overrun of the render budget: the C call's time is the machine's)."""
    folder = _template_folder(
        tiny_tokenizer, tmp_path,
        '{% if messages[0].content == "boom" %}{% set s = "x" * 1000000 %}'
        '{% set L = [s] * 200 %}{% set d = {"a": L, "b": L, "c": L, "d": L, "e": L, "f": L, '
        '"g": L, "h": L, "i": L, "j": L} %}{% set t = d.values()|string %}{% endif %}')
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0), chat(1, 1), chat(2, 2), BOOM])
    out = tmp_path / "out"
    code, said = _anonymize_child(folder, src, out, 1_800_000_000)
    assert code == 0, said[-2000:]
    (letter,) = _letters(out)
    assert letter["error"] == "template_error"
    assert letter["message"].startswith("ValueTooLarge"), letter["message"]


# ---- dead letters: the merge holds one line of every run, and a large letter is a run --------

@pytest.mark.xfail(strict=True, reason=ROUND4)
@pytest.mark.parametrize("engine", ["local", "beam"])
def test_merging_dead_letters_holds_one_line_not_one_per_run(tiny_tokenizer, tmp_path, engine):
    """dead_letters.py promises letters in bounded memory: SortedRuns holds at most
    SORT_RUN_BYTES (16 MiB) before it spills a run, and merge_runs holds "one line of each run
    at a time" (MERGE_FAN_IN 64 runs open). But a letter keeps its whole line, escaped: a line
    of control characters is 6x its bytes as JSON (`\\u0001`), invalid UTF-8 5x (`\\\\xff`), so
    one letter of a line at --max-record-bytes is ~6x the bound, over SORT_RUN_BYTES alone:
    each is a run of its own, and heapq.merge holds the head line of every run at once. 24
    lines of 3 MiB (a 74 KB .gz) peak at 549 MB (local; Beam 746 MB) where 1 such line peaks
    at 137 MB: ~18 MB per letter, growing with the count of bad lines up to 64 x 6 x the bound
    (~6 GiB at the default 16 MiB bound), none of it in docs/BOUNDS.md (nor the letters' disk:
    453 MB of letters from 75 MB of input)."""
    import gzip

    from test_redteam_input import _peak_rss_mb

    src = tmp_path / "in.jsonl.gz"
    with gzip.open(src, "wb", compresslevel=9) as handle:
        for i in range(24):
            handle.write(b"\x01" * (3 << 20) + bytes([65 + i]) + b"\n")
        for i in range(3):
            handle.write(json.dumps(chat(i, i)).encode() + b"\n")
    code, peak, said = _peak_rss_mb(
        [sys.executable, "-m", "kvtrace.cli", "anonymize", "--input", str(src), "--output",
         str(tmp_path / "out"), "--tokenizer", tiny_tokenizer, "--block-size", "4",
         "--max-rejected-fraction", "1", "--max-record-bytes", "4000000", "--engine", engine,
         *(["--processes", "1"] if engine == "local" else [])], ROOT)
    assert code == 0, said[-2000:]
    assert peak < 300, f"{peak} MB peak for 24 rejected lines of 3 MiB"
