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


@pytest.mark.xfail(strict=True, reason="red team round 15")
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
