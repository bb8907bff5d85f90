"""Red team round 20, determinism: reproducers of the same records publishing differently by the
form they come in. Each test asserts the promised behaviour and fails today (issue 33)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import SALT, anonymize, chat, trace_bytes, write_jsonl

pytestmark = pytest.mark.slow

DAY0 = 1_763_703_600_000


def test_messages_whose_always_null_field_parquet_types_as_null_publish_as_their_jsonl(
    tiny_tokenizer, tmp_path: Path
):
    """Promise (docs/ANONYMIZE.md, Input: JSONL 'and Parquet with the same fields ... so the
    same records read alike in both'; docs/BOUNDS.md: 'a real writer's file reads as its JSONL
    twin'): chats of one to three messages, each message with `"name": null` (as OpenAI-style
    logs write `name`, `refusal`, `tool_calls`, `function_call` on every message), as JSONL and
    as the Parquet file pyarrow writes of them. A field null in every row gets Arrow's `null`
    type, so `messages` is list<struct<role, content, name: null>>; converting a row group
    (sources._as_python's casts) fails ('Struct child array #2 has length smaller than expected
    for struct array (1 < 6)'), and so does each row alone: every row a malformed_record letter,
    the night refused ('too much input rejected: 6 of 6'), where the JSONL publishes every row.
    The same holds for a streamed response's chunks (`logprobs`, `tool_calls`: null)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = []
    for i in range(6):
        record = chat(i, DAY0 + 1000 * i, f"u{i % 2}")
        turns = [{**m, "name": None} for m in record["messages"]]
        record["messages"] = turns[: 1 + i % 2] + [{"role": "user", "content": "hi", "name": None}]
        records.append(record)
    jsonl = write_jsonl(tmp_path / "in.jsonl", records)
    parquet = tmp_path / "in.parquet"
    table = pa.Table.from_pylist(records)
    assert pa.types.is_null(table.schema.field("messages").type.value_type.field("name").type)
    pq.write_table(table, parquet)
    salt = tmp_path / "salt"
    salt.write_text(SALT)
    outs = []
    for source in (jsonl, parquet):
        out = tmp_path / f"out-{source.suffix[1:]}"
        args = ("--block-size", "4", "--salt-file", str(salt), "--quiet")
        assert anonymize(tiny_tokenizer, [source], out, *args) == 0, source.name
        outs.append(trace_bytes(out))
    assert outs[0] == outs[1]
