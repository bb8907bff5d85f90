"""Red team round 19, hostile input (Parquet and the letters' weighing): reproducers of the holes
found past the round-1..18 fixes (test_redteam_input*.py). Each asserts the promised behaviour
(bad input: a one-line error or a dead letter saying why; nothing lost: read = exported +
rejected, and --max-rejected-fraction sees what a letter held) and fails today (2026-11-28)."""

from __future__ import annotations

import gzip
import json
import random

import pytest

from helpers import WORDS, anonymize, chat

pytestmark = pytest.mark.slow


def _prompts_beside_a_wrapped_token_log() -> list[dict]:
    """10 chats sharing one 3,000-word system prompt (a Parquet dictionary stores it once), and
    one row `{"object": "list", "data": [300 token-id requests of 100 ids]}`: a log wrapped in
    a record, which holds 95% of the Parquet file's bytes and 63% of the JSONL's."""
    rng = random.Random(19)
    system = " ".join(rng.choice(WORDS) for _ in range(3_000))
    rows = []
    for i in range(10):
        row = chat(i, 1_000 * i)
        row["messages"][0]["content"] = system
        rows.append(row)
    data = [
        {
            "timestamp": 20_000 + i,
            "input_ids": [rng.randrange(100_000, 150_000) for _ in range(100)],
            "output_length": 5,
        }
        for i in range(300)
    ]
    return [*rows, {"object": "list", "data": data}]


def test_a_parquet_row_of_numbers_wrapping_a_log_weighs_its_bytes(tiny_tokenizer, tmp_path):
    """Round 18 weighs a Parquet row's letter by its size as JSON at its file's share
    (sources.RowShare, dead_letters.Tally), but the size is arrow_sizes' JSON size, a
    memory lower bound: a number counts 1 byte (its JSON and its stored int64 are ~7 and ~5)
    and a key 0, while a string counts every byte. So a row of numbers weighs a fraction of
    its bytes beside rows of text: the wrapper above, 155 KB of the file's 163 KB (its
    `input_ids` chunk alone), weighs 27 KB; "11 read = 10 exported + 1 rejected", exit 0, the
    night publishes 10 of 310 requests under the default --max-rejected-fraction 0.5. The
    same records as JSONL.gz (weighed by their decoded bytes) are refused, 62.9% lost: the
    Parquet form of a log must weigh a letter no less than its JSON form does."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _prompts_beside_a_wrapped_token_log()
    same = tmp_path / "log.jsonl.gz"
    same.write_bytes(gzip.compress(b"".join(json.dumps(r).encode() + b"\n" for r in rows), mtime=0))
    assert anonymize(tiny_tokenizer, [same], tmp_path / "gz", "--quiet") != 0  # weighed: refused
    source = tmp_path / "log.parquet"
    pq.write_table(pa.Table.from_struct_array(pa.array(rows)), source)
    wrapper = pq.ParquetFile(source).metadata.row_group(0).column(6)
    assert wrapper.path_in_schema == "data.list.element.input_ids.list.element"
    assert wrapper.total_compressed_size > 0.9 * source.stat().st_size
    out = tmp_path / "out"
    code = anonymize(tiny_tokenizer, [source], out, "--quiet")
    assert code != 0 and not (out / "manifest.json").exists()
