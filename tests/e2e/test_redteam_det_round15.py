"""Red team round 15, determinism: reproducers of output that depends on how the same records
are written (JSON escapes, the form of the file) rather than on what they hold. Each test
asserts the promised behaviour and fails today (issue 33)."""

from __future__ import annotations

import json

import pytest

from helpers import SALT, anonymize, trace_bytes, write_jsonl

pytestmark = pytest.mark.slow

DAY0_MS = 1_763_703_600_000  # 2025-11-21T05:40:00Z


def _streamed_then_continued() -> list[dict]:
    """A streamed chat whose text chunks carry its response's id (the first chunk, the role,
    carries none), then a request continuing that response (`previous_response_id`)."""
    text_chunk = {"id": "resp_1", "choices": [{"index": 0, "delta": {"content": " world"}}]}
    return [
        {
            "timestamp": DAY0_MS,
            # 19 digits in a row (an id, a nanosecond time) and a non-ASCII letter: nothing read
            "request_id": "1234567890123456789",
            "user": "jos\u00e9",
            "messages": [{"role": "user", "content": "hello world this is a prompt"}],
            "response": [
                {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
                text_chunk,
                text_chunk,
            ],
            "output_length": 2,
        },
        {
            "timestamp": DAY0_MS + 1_000,
            "previous_response_id": "resp_1",
            "messages": [{"role": "user", "content": "about caching blocks"}],
            "output_length": 2,
        },
    ]


def test_a_streams_links_read_alike_whatever_json_escapes_its_line_uses(tiny_tokenizer, tmp_path):
    """Promise: the same input and configuration give byte-identical output; JSONL is read as
    its JSON values (an escape `\\u00e9` and the letter it names are one string). A streamed
    response's text chunks are merged before its record is read (read/streamed.py: a text chunk
    'holds ... nothing any reader reads'), but links.names reads every chunk's `id`, so a text
    chunk's id names its request only when the whole list is read. records._streamed_chunks
    condenses only a line whose strings need no check (load_json_line: orjson read it, or it
    holds no `\\u`), and orjson declines any line with 19 digits in a row: the same records,
    written by Python's json.dumps (ASCII escapes) or by a writer keeping UTF-8, publish
    different `parent_row` (the continuing row names row 0, or no row). Fixed by construction:
    links read from the chunks as logged (names before condensing), or a chunk whose id is not
    the kept chunk's before it is no text chunk (streamed.TEXT_CHUNK_FIELDS)."""
    records = _streamed_then_continued()
    escaped = write_jsonl(tmp_path / "escaped.jsonl", records)  # json.dumps: ASCII escapes
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in records))
    assert b"\\u00e9" in escaped.read_bytes() and b"\\u" not in plain.read_bytes()
    (tmp_path / "salt").write_text(SALT)
    flags = ("--block-size", "4", "--salt-file", str(tmp_path / "salt"), "--emit-parents")
    for source in (escaped, plain):
        assert anonymize(tiny_tokenizer, [source], tmp_path / source.stem, *flags) == 0
    assert trace_bytes(tmp_path / "escaped") == trace_bytes(tmp_path / "plain")


def test_a_streams_links_read_alike_from_jsonl_and_parquet(tiny_tokenizer, tmp_path):
    """The same cause, through the form of the file (docs/ANONYMIZE.md, Input: JSONL 'and
    Parquet with the same fields'): a Parquet row is read by request_from_object with
    check_strings left True, so its chunks are never condensed and every chunk's id names the
    request, while the same records as JSONL (orjson reads them) are condensed and the text
    chunks' id names nothing: the continuing row has `parent_row` 0 from Parquet, none from
    JSONL."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [
        {k: v for k, v in r.items() if k not in ("request_id", "user")}
        for r in _streamed_then_continued()
    ]
    records[0]["previous_response_id"] = None  # the column, in the schema the first row gives
    log = write_jsonl(tmp_path / "log.jsonl", records)
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "log.parquet")
    (tmp_path / "salt").write_text(SALT)
    flags = ("--block-size", "4", "--salt-file", str(tmp_path / "salt"), "--emit-parents")
    for source, out in ((log, "jsonl"), (tmp_path / "log.parquet", "parquet")):
        assert anonymize(tiny_tokenizer, [source], tmp_path / out, *flags) == 0
    assert trace_bytes(tmp_path / "jsonl") == trace_bytes(tmp_path / "parquet")


def test_rows_whose_links_differ_only_in_where_a_nul_falls_publish_alike_in_any_order(
    tiny_tokenizer, tmp_path
):
    """Promise (docs/ORDERING.md, step 3): rows alike in all else are ordered by 'an unsalted
    digest of the request's links ... (`parent_row` numbers are positions in this order, so
    rows alike in all else must not fall in input order)'; the same records in any order give
    byte-identical output. encode/hashed_batch.links_digest joins the link it continues and the
    links naming it with NUL, and an id may hold NUL (a client's `previous_response_id`, JSON
    `\\u0000`): a request continuing `resp_a\\0call:c` and one continuing `resp_a` whose answer
    calls `c` feed the digest the same bytes. The two rows tie through step 3 and fall in input
    order, and with them the `parent_row` of the tool result answering `c` (and their own).
    Fixed by construction: the links encoded unambiguously, each length first, by the encoder
    the fingerprint uses (encode/fingerprint.py). Since round 24 a request naming a
    `previous_response_id` is a `stored_context` letter (its prompt is a stored conversation
    the log does not hold), so the two are letters, each order publishes the same rows, and the
    digest's encoding is held by tests/transforms/encode/test_link_keys.py."""
    ask = [{"role": "user", "content": "hello world this is a prompt"}]
    call = {"id": "c", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    named = {
        "timestamp": 0,
        "input": [{"role": "user", "content": "about caching blocks"}],
        "response": {"id": "resp_a", "output": [], "usage": {"output_tokens": 2}},
    }
    nul = {"timestamp": 1000, "previous_response_id": "resp_a\0call:c", "messages": ask}
    calls = {
        "timestamp": 1000,
        "previous_response_id": "resp_a",
        "messages": ask,
        "response": {"choices": [{"message": {"role": "assistant", "tool_calls": [call]}}]},
    }
    result = {
        "timestamp": 2000,
        "messages": [
            *ask,
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c", "content": "a.txt"},
        ],
        "output_length": 1,
    }
    nul["output_length"] = calls["output_length"] = 3
    (tmp_path / "salt").write_text(SALT)
    flags = ("--block-size", "4", "--salt-file", str(tmp_path / "salt"), "--emit-parents")
    flags += ("--max-rejected-fraction", "1")
    for name, order in (
        ("first", [named, nul, calls, result]),
        ("second", [named, calls, nul, result]),
    ):
        log = write_jsonl(tmp_path / f"{name}.jsonl", order)
        assert anonymize(tiny_tokenizer, [log], tmp_path / name, *flags) == 0
    assert trace_bytes(tmp_path / "first") == trace_bytes(tmp_path / "second")
