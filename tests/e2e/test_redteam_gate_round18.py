"""Red team round 18, the gate (nothing private published, nothing lost): reproducers of what
the Parquet body check still costs or lets through after round 17. Each asserts the promised
behaviour, so each fails until it is fixed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import CLEAN_CHAT_MS, ROOT, chat, under_rlimit, write_jsonl

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


@pytest.mark.xfail(strict=True, reason="red team round 18")
def test_distinct_page_statistics_searched_in_a_large_dictionary_cost_no_more_than_the_files_bytes(
    tiny_tokenizer, tmp_path
):
    """No hang (a variant of round 17's, which still breaks). Round 17 searches each DISTINCT
    bound once a chunk (paths._ChunkValues._starts_an_entry: `form in data` over the
    dictionary's decompressed bytes, the answer kept per bound), but a page's min and max are
    its own values: pages whose values differ name as many distinct bounds, and each is
    searched through the dictionary anew, pages x dictionary bytes as before. The zstd file
    pyarrow writes (data_page_size=1, write_batch_size=1: one row a page, as round 17's) of
    1,000 chats, an unread column `zz` of one 30 MB run of `x` then `xxxxxxxy<i>` distinct per
    row: a 0.3 MB file, ~20 CPU-s an open (100 rows: 46 KB, 2.0 CPU-s; the same rows with
    one `xxxxxxxy` repeated: 0.12). A statistic must cost its page's bytes or the chunk's
    dictionary's once (found by the entries' offsets, or all of a chunk's bounds in one pass),
    not once per distinct bound."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {**chat(i, 1_000 * i), "zz": "x" * 30_000_000 if i == 0 else f"xxxxxxxy{i:05d}"}
        for i in range(1_000)
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
