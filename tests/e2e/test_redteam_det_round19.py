"""Red team round 19, determinism: reproducers of the same records publishing differently by the
form they come in. Each test asserts the promised behaviour and fails today (issue 33)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import SALT, anonymize, letters, shared_path, trace_bytes, write_jsonl

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


# Accepted residual (docs/ANONYMIZE.md, Input): a Parquet struct column holds one field order,
# the writer's, where a JSONL line keeps each object's own; sorting every object instead would
# move JSONL input away from the prompt the engine rendered. Kept strict: an XPASS flags a fix.
@pytest.mark.xfail(strict=True, reason="accepted residual: docs/ANONYMIZE.md")
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


# A template that reads the request's documents (as Granite's and Command R's do), one loop step
# a document; the rest Qwen3's shape.
DOCUMENTS_TEMPLATE = (
    "{%- if documents %}<|im_start|>system\n{%- for d in documents %}[{{ loop.index }}] "
    "{{ d.text }}\n{%- endfor %}<|im_end|>\n{%- endif %}{%- for m in messages %}<|im_start|>"
    "{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def test_a_request_of_more_documents_than_a_render_steps_through_is_too_large(tmp_path: Path):
    """Promise (docs/BOUNDS.md, templates: 'A request of over 128 Ki messages and tools is a
    too_large dead letter before it is rendered: a template's loop steps per item ... would put
    it over the budget on a slow machine only'; the same record's fate on any machine): since
    round 18 a request's own `documents` reach the template, one loop step each, but are not
    counted with its messages and tools. A request of 128 Ki + 1 one-letter documents (2 MB,
    well within --max-record-bytes) renders today (about 1 CPU-s here; exit 0, 2 exported,
    1,068,569 tokens); within the 16 MiB a record may be, ~1 M documents take the 5 CPU-s
    budget on a fast machine and miss it on a slow one, so whether the request is exported or
    a template_error is the machine's speed, not the input's."""
    import json

    from kvtrace.transforms.encode.tokenize import MAX_RENDERED_ITEMS

    qwen3 = shared_path("tokenizers", "qwen3")
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    for path in qwen3.iterdir():
        (tokenizer / path.name).write_bytes(path.read_bytes())
    config = json.loads((tokenizer / "tokenizer_config.json").read_text())
    config["chat_template"] = DOCUMENTS_TEMPLATE
    (tokenizer / "tokenizer_config.json").write_text(json.dumps(config))
    hello = [{"role": "user", "content": "hi"}]
    records = [
        {"timestamp": DAY0, "messages": hello, "max_tokens": 3},
        {
            "timestamp": DAY0 + 1000,
            "messages": hello,
            "documents": [{"text": "x"}] * (MAX_RENDERED_ITEMS + 1),
            "max_tokens": 3,
        },
    ]
    log = write_jsonl(tmp_path / "log.jsonl", records)
    salt = tmp_path / "salt"
    salt.write_text(SALT)
    out = tmp_path / "out"
    # the letter weighs most of the log's bytes: the gate off, the letter is the point
    args = ("--block-size", "4", "--salt-file", str(salt), "--quiet")
    args += ("--max-rejected-fraction", "1")
    assert anonymize(str(tokenizer), [log], out, *args) == 0
    assert [letter["error"] for letter in letters(Path(f"{out}-rejected"))] == ["too_large"]
