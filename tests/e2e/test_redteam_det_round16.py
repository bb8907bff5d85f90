"""Red team round 16, determinism: reproducers of published output that depends on how the
same records are split, ordered or spelled rather than on what they hold. Each test asserts the
promised behaviour and fails today (issue 33)."""

from __future__ import annotations

import pytest

from helpers import SALT, anonymize, chat, trace, write_jsonl

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "hello world this is a prompt"}]


def _call(call_id: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": "ls", "arguments": "{}"}}


def test_a_tool_result_never_links_to_a_call_of_another_session(tiny_tokenizer, tmp_path):
    """Promise (docs/ANONYMIZE.md, links: 'Call ids are matched within the request's session';
    read/links.py: 'within its session'). encode/hashed_batch.link_key keys a call link as
    f"{session}\\0{link}", and both the session id and the call id are client strings that may
    hold NUL: session "a\\0call:x" naming call "y" and session "a" answering call "x\\0call:y"
    key the same bytes, so the second conversation's row gets the first's row as its
    `parent_row` (and so would a response id "r\\0call:c" against call "c" in session
    "\\0response:r"). Fixed by construction: the scope and the link encoded unambiguously
    (each length first, the fingerprint's encoder, as links_digest already does)."""
    first = {
        "timestamp": 0,
        "session_id": "a\0call:x",
        "messages": ASK,
        "response": {"choices": [{"message": {"role": "assistant", "tool_calls": [_call("y")]}}]},
        "output_length": 3,
    }
    odd = "x\0call:y"
    second = {
        "timestamp": 1000,
        "session_id": "a",
        "messages": [
            *ASK,
            {"role": "assistant", "content": "", "tool_calls": [_call(odd)]},
            {"role": "tool", "tool_call_id": odd, "content": "a.txt"},
        ],
        "output_length": 1,
    }
    log = write_jsonl(tmp_path / "log.jsonl", [first, second])
    (tmp_path / "salt").write_text(SALT)
    flags = ("--block-size", "4", "--salt-file", str(tmp_path / "salt"), "--emit-parents")
    assert anonymize(tiny_tokenizer, [log], tmp_path / "out", *flags) == 0
    rows = trace(tmp_path / "out")
    assert [row["session"] for row in rows] == [0, 1]  # two conversations
    assert "parent_row" not in rows[1]


def test_a_compressed_log_publishes_or_not_whatever_the_order_of_its_lines(
    tiny_tokenizer, tmp_path
):
    """Promise: the same records in any order give the same output, and a night publishes whole
    or not at all by --max-rejected-fraction (docs/BOUNDS.md: a compressed file's line that
    becomes no record weighs 'its decoded bytes at the share of stored bytes its reader had
    reached'; RecordCounts.rejected_fraction: 'may weigh more, never less, than it was'). The
    share is the file's so far (paths.stored_share), so a line weighs by what was read before
    it, not by what it is: two lines of incompressible junk (~97% of the gzip's stored bytes)
    before ten compressible records weigh 63% of the file and the night is refused; the same
    lines after the records weigh 7.5% (the records' ~1000:1 share) and the night publishes.
    Fixed by construction: a compressed range's lost decoded bytes summed and scaled once, at
    the range's end, by its whole share (or weighed in decoded bytes throughout), so no order
    of the lines changes a weight."""
    import base64
    import gzip
    import json
    import random

    draw = random.Random(1)
    junk = [base64.b64encode(draw.randbytes(150_000)) for _ in range(2)]  # not JSON
    good = [
        json.dumps({**chat(i, 1_763_703_600_000 + 1000 * i), "pad": "a" * 400_000}).encode()
        for i in range(10)  # a field no reader reads: compressible bytes
    ]
    (tmp_path / "salt").write_text(SALT)
    flags = ("--block-size", "4", "--salt-file", str(tmp_path / "salt"))
    codes = {}
    for name, lines in (("junk-first", junk + good), ("junk-last", good + junk)):
        log = tmp_path / f"{name}.jsonl.gz"
        log.write_bytes(gzip.compress(b"".join(line + b"\n" for line in lines), mtime=0))
        codes[name] = anonymize(tiny_tokenizer, [log], tmp_path / name, *flags)
    assert codes["junk-first"] == codes["junk-last"]
