"""Red team round 16, determinism: reproducers of published output that depends on how the
same records are split, ordered or spelled rather than on what they hold. Each test asserts the
promised behaviour and fails today (issue 33)."""

from __future__ import annotations

import pytest

from helpers import SALT, anonymize, trace, write_jsonl

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "hello world this is a prompt"}]


def _call(call_id: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": "ls", "arguments": "{}"}}


@pytest.mark.xfail(strict=True, reason="red team round 16")
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
