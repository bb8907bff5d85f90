"""Red team round 19, determinism: reproducers of the same records publishing differently by the
form they come in. Each test asserts the promised behaviour and fails today (issue 33)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import SALT, anonymize, shared_path, trace_bytes, write_jsonl

pytestmark = pytest.mark.slow

DAY0 = 1_763_703_600_000


def _tool(unit_first: bool) -> list[dict]:
    """One tool whose JSON schema names its two properties in either order, as two clients of
    one fleet may send the same tool."""
    properties = {"city": {"type": "string"}, "unit": {"type": "string"}}
    if unit_first:
        properties = dict(reversed(properties.items()))
    parameters = {"type": "object", "properties": properties}
    function = {"name": "weather", "description": "get weather", "parameters": parameters}
    return [{"type": "function", "function": function}]


@pytest.mark.xfail(strict=True, reason="red team round 19")
def test_a_tool_schemas_key_order_publishes_alike_as_jsonl_and_parquet(tmp_path: Path):
    """Promise (docs/ANONYMIZE.md, Input: JSONL 'and Parquet with the same fields ... so the
    same records read alike in both'; docs/BOUNDS.md: 'a real writer's file reads as its JSONL
    twin'): four chat requests whose one tool names its properties city-then-unit or
    unit-then-city, as JSONL and as the Parquet file pyarrow writes of them. The chat template
    renders a tool as JSON (Qwen3: `tool | tojson`), so key order is prompt text; JSONL keeps
    each record's order, while a Parquet struct column holds one field order for the whole
    file (the first row's, by pyarrow's inference), so every unit-first request renders
    city-first. Today the traces differ (hit rate 59.1% as JSONL, 70.5% as Parquet): the same
    records publish different prefixes by the file's form, and by which row a Parquet file
    happens to hold first."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [
        {
            "timestamp": DAY0 + 1000 * i,
            "messages": [{"role": "user", "content": f"hello world number {i}"}],
            "tools": _tool(unit_first=bool(i % 2)),
            "max_tokens": 5,
        }
        for i in range(4)
    ]
    jsonl = write_jsonl(tmp_path / "in.jsonl", records)
    parquet = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(records), parquet)
    salt = tmp_path / "salt"
    salt.write_text(SALT)
    tokenizer = str(shared_path("tokenizers", "qwen3"))
    outs = []
    for source in (jsonl, parquet):
        out = tmp_path / f"out-{source.suffix[1:]}"
        args = ("--block-size", "4", "--salt-file", str(salt), "--quiet")
        assert anonymize(tokenizer, [source], out, *args) == 0
        outs.append(trace_bytes(out))
    assert outs[0] == outs[1]
