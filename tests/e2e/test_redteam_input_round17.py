"""Red team round 17, hostile input: reproducers of the holes found past the round-1..16 fixes
(test_redteam_input*.py). Each asserts the promised behaviour (bad input: a one-line error or a
dead letter saying why, never a crash, a hang or memory that grows without bound; nothing lost:
read = exported + rejected) and fails today (2026-11-28)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import CLEAN_CHAT_MS, ROOT, anonymize, chat, under_rlimit, write_jsonl

pytestmark = pytest.mark.slow


def _night_under_cpu(tokenizer: str, tmp_path: Path, source: Path, seconds: int) -> int:
    """anonymize's exit code on source beside a clean log of one chat, the CLI allowed
    `seconds` of CPU (SIGXCPU past them)."""
    clean = tmp_path / "clean.jsonl"
    write_jsonl(clean, [chat(6, CLEAN_CHAT_MS)])
    command = [sys.executable, "-m", "kvtrace.cli", "anonymize", "--tokenizer", tokenizer]
    command += ["--input", str(source), "--input", str(clean), "--output", str(tmp_path / "out")]
    command += ["--max-rejected-fraction", "1", "--processes", "1", "--quiet"]
    done = subprocess.run(
        under_rlimit(command, "RLIMIT_CPU", seconds),
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
    )
    return done.returncode


@pytest.mark.xfail(strict=True, reason="red team round 17")
def test_page_statistics_searched_in_a_large_dictionary_cost_no_more_than_the_files_bytes(
    tiny_tokenizer, tmp_path
):
    """No hang. Round 16 holds a BYTE_ARRAY page's statistics (min, max) to bytes its values
    or the chunk's dictionary hold by a substring search (paths._ChunkValues.holds: `value in
    self.data(p)` over the page, then every dictionary page), once per data page and bound,
    at every open. The dictionary is decompressed once but searched once per page: pages x
    dictionary bytes, and CPython's search of an 8-byte needle `xxxxxxxy` in a run of `x`
    costs ~9 ms a MB. A zstd file of 400 rows (an unread column `zz`: one 30 MB value of `x`
    then `xxxxxxxy` 399 times, one row a page, as pyarrow writes with data_page_size=1,
    write_batch_size=1; ~300 KB) costs minutes of CPU per open (11 CPU-s an open with 300
    pages of an 8 MB entry, 23 s for a whole anonymize); the page walk promises a file's
    walks cost at most its bytes. A statistic must be found once per chunk (each distinct
    bound searched once, or found by the entries' offsets), not once per page."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {**chat(i, 1_000 * i), "zz": "x" * 30_000_000 if i == 0 else "x" * 7 + "y"}
        for i in range(400)
    ]
    source = tmp_path / "log.parquet"
    pq.write_table(
        pa.Table.from_pylist(rows),
        source,
        compression="zstd",
        data_page_size=1,
        write_batch_size=1,
        dictionary_pagesize_limit=64 << 20,
    )
    assert source.stat().st_size < 1 << 20
    assert _night_under_cpu(tiny_tokenizer, tmp_path, source, 10) == 0


@pytest.mark.xfail(strict=True, reason="red team round 17")
def test_a_parquet_row_wrapping_a_log_weighs_its_bytes(tiny_tokenizer, tmp_path):
    """Round 16's list response (a record wrapping a log: one letter) now weighs its bytes in
    a JSONL line and at its decoded share in a compressed file, but a Parquet row weighs its
    row group's stored bytes shared evenly among its rows (sources.row_share), whatever the
    row holds. 10 chats and one row `{"object": "list", "data": [2,000 chats]}` in one row
    group: the wrapper is one no_input letter weighing 1/11 of the file, though it holds
    over 99% of its bytes; "11 read = 10 exported + 1 rejected", exit 0, the night publishes
    10 of 2,010 requests under the default --max-rejected-fraction 0.5. A row's letter must
    weigh its share by the row's own size (its bytes as sized before decoding, over the
    group's), as a compressed line's does by its decoded bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    wrapped = {"object": "list", "data": [chat(i, 1_000 * i + 500) for i in range(2_000)]}
    rows = [chat(i, 1_000 * i) for i in range(10)] + [wrapped]
    source = tmp_path / "log.parquet"
    pq.write_table(pa.Table.from_pylist(rows), source)
    out = tmp_path / "out"
    code = anonymize(tiny_tokenizer, [source], out, "--quiet")
    assert code != 0 and not (out / "manifest.json").exists()
