"""Red team round 17, hostile input: reproducers of the holes found past the round-1..16 fixes
(test_redteam_input*.py). Each asserts the promised behaviour (bad input: a one-line error or a
dead letter saying why, never a crash, a hang or memory that grows without bound; nothing lost:
read = exported + rejected) and fails today (2026-11-28)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import CLEAN_CHAT_MS, ROOT, anonymize, chat, trace, under_rlimit, write_jsonl

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
    write_batch_size=1; 170 KB) costs over 60 CPU-s an open (11 CPU-s with 300 pages of an
    8 MB entry, 23 CPU-s for a whole anonymize of it); the page walk promises a file's
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


def test_a_parquet_row_wrapping_a_log_weighs_its_bytes(tiny_tokenizer, tmp_path):
    """Round 16's list response (a record wrapping a log: one letter) now weighs its bytes in
    a JSONL line and at its decoded share in a compressed file, but a Parquet row weighs its
    row group's stored bytes shared evenly among its rows (sources.row_share), whatever the
    row holds. 10 chats and one row `{"object": "list", "data": [2,000 chats]}` in one row
    group: the wrapper is one no_input letter weighing 1/11 of the file, though it holds
    over 99% of its bytes; "11 read = 10 exported + 1 rejected", exit 0, the night publishes
    10 of 2,010 requests under the default --max-rejected-fraction 0.5. A row's letter must
    weigh its share by the row's own size (its bytes as sized before decoding, over the
    group's), as a compressed line's does by its decoded bytes. (Round 17's fix: the table is
    built from a struct array, whose type unites every row's keys; `Table.from_pylist` takes
    the first row's keys alone, so the file held no wrapped chat at all.)"""
    import pyarrow as pa
    import pyarrow.parquet as pq

    wrapped = {"object": "list", "data": [chat(i, 1_000 * i + 500) for i in range(2_000)]}
    rows = [chat(i, 1_000 * i) for i in range(10)] + [wrapped]
    source = tmp_path / "log.parquet"
    pq.write_table(pa.Table.from_struct_array(pa.array(rows)), source)
    assert len(pq.read_table(source, columns=["data"]).column(0)[10].values) == 2_000
    out = tmp_path / "out"
    code = anonymize(tiny_tokenizer, [source], out, "--quiet")
    assert code != 0 and not (out / "manifest.json").exists()


@pytest.mark.beam
@pytest.mark.slow  # a Beam run: .ci/run runs the slow set
def test_a_parquet_rows_letter_weighs_alike_on_both_engines(tiny_tokenizer, tmp_path, capsys):
    """The fix of the reproducer above on both engines: the wrapper's letter carries its bytes
    as JSON and the file's share record its rows' bytes (sources.RowShare), tallied at the
    end; the share is no record (read = exported + rejected) and both engines weigh alike."""
    import re

    import pyarrow as pa
    import pyarrow.parquet as pq

    wrapped = {"object": "list", "data": [chat(i, 1_000 * i + 500) for i in range(50)]}
    rows = [chat(i, 1_000 * i) for i in range(40)] + [wrapped]
    source = tmp_path / "log.parquet"
    pq.write_table(pa.Table.from_struct_array(pa.array(rows)), source)  # one group
    said = {}
    for engine in ("local", "beam"):
        args = ("--max-rejected-fraction", "0.9", "--engine", engine)
        assert anonymize(tiny_tokenizer, [source], tmp_path / engine, *args) == 0
        said[engine] = "".join(capsys.readouterr())
        assert "41 read = 40 exported + 1 rejected" in said[engine]
    lost = [re.search(r"([\d,]+) input bytes became no record", said[e]) for e in said]
    assert lost[0] and lost[1] and lost[0].group(1) == lost[1].group(1)
    weighed, stored = int(lost[0].group(1).replace(",", "")), source.stat().st_size
    assert 0.15 * stored < weighed < stored  # an even share of its one group: a 41st of it


def test_dictionaries_with_entries_no_row_names_hold_no_memory_per_row_group(tmp_path):
    """Bounded memory. paths._check_chunks adds each chunk's dictionary to
    parquet_payload.Entries, which keeps every Dictionary with an entry not yet named
    (`_partial`: its entries' sizes, int64, and a named flag each, ~9 bytes an entry) until
    the whole file is walked, one per chunk even when the dictionary is the identical one a
    chunk before held. A trace Parquet of 30 row groups of one row, each carrying the same
    dictionary of 1,000,000 short strings in an unread column (`zz`, a pyarrow
    DictionaryArray, only entry 0 indexed; 19 MB, zstd): `kvtrace analyze` refuses it in one
    line ("dictionary entries no row names"), but only after holding ~8.7 MB per group:
    165 MB at 2 groups, 252 MB at 12, 417 MB at 30, and on with the file (docs/BOUNDS.md: a
    Parquet read stays within ~9 x the 16 MiB trace bound). Entries must keep one record per
    distinct dictionary (the union of its named entries, a bit each), not one per chunk.
    Round 17 accepts entries no row names (docs/BOUNDS.md), so nothing is tracked and the
    file is read: exit 0, not the refusal this reproducer first expected."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from helpers import peak_rss_mb

    dictionary = pa.array([f"{i:x}" for i in range(1_000_000)])
    schema = pa.schema(
        [
            ("timestamp", pa.int64()),
            ("input_length", pa.int64()),
            ("output_length", pa.int64()),
            ("hash_ids", pa.list_(pa.int64())),
            ("zz", pa.dictionary(pa.int32(), pa.string())),
        ]
    )
    source = tmp_path / "trace.parquet"
    with pq.ParquetWriter(
        source, schema, compression="zstd", dictionary_pagesize_limit=64 << 20
    ) as w:
        for group in range(30):
            zz = pa.DictionaryArray.from_arrays(pa.array([0], pa.int32()), dictionary)
            row = {"timestamp": [group], "input_length": [10], "output_length": [1]}
            w.write_table(pa.table({**row, "hash_ids": [[group]], "zz": zz}, schema=schema))
    code, peak, _ = peak_rss_mb([sys.executable, "-m", "kvtrace.cli", "analyze", str(source)])
    assert code == 0 and peak < 250, peak


def test_a_pandas_categorical_with_an_unused_category_is_not_damage(tiny_tokenizer, tmp_path):
    """No false refusal. Round 16 counts dictionary entries no index names as stray bytes
    (parquet_payload.Entries -> paths._check_chunks: a `damaged_file` letter for a log, the
    file refused for a trace). pandas keeps a categorical's categories when rows are filtered
    (`df[df.model == "a"]` still lists "b"), and pyarrow writes the whole category list as the
    chunk's dictionary: an ordinary export of 4 chats with a categorical `model` column of
    one unused category is "5 read = 4 exported + 1 rejected", a `damaged_file` letter
    ("13 bytes ... lie in dictionary entries no row names") for bytes that are the file's own
    schema, and with --max-rejected-fraction 0 the night is refused. An entry no row names is
    not a hidden row group when it is as small as a value its column holds; what a writer's
    dictionary declares is the file's own data, to be weighed only past what one value may
    be (or read as a value)."""
    import pandas as pd

    rows = [chat(i, 1_000 * i) for i in range(4)]
    frame = pd.DataFrame(
        {key: [row[key] for row in rows] for key in ("timestamp", "messages", "output_length")}
    )
    frame["model"] = pd.Categorical(["a", "a", "b", "b"], categories=["a", "b", "c"])
    source = tmp_path / "log.parquet"
    frame.to_parquet(source)
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, [source], out, "--max-rejected-fraction", "0", "--quiet") == 0
    assert len(trace(out)) == 4
