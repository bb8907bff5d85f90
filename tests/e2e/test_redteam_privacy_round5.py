"""Red team round 5: what a published trace gives away beyond what its coarsening promises.
Each test asserts the promised behaviour, so each fails until it is fixed."""

from __future__ import annotations

import pytest
from conftest import anonymize, trace, write_jsonl

from transforms.stats import audit as gate

pytestmark = pytest.mark.slow
ROUND5 = "red team round 5"
SYSTEM = {"role": "system", "content": "hello world this is a prompt about caching blocks"}


def _conversation(reply: str) -> list[dict]:
    """Two turns of one session: the second carries the first's reply, as every multi-turn log
    does (the client sends the history back)."""
    first = [SYSTEM, {"role": "user", "content": "the quick brown"}]
    return [
        {"timestamp": 1_700_000_000_000, "session_id": "s", "messages": first,
         "output_length": len(reply.split())},
        {"timestamp": 1_700_000_030_000, "session_id": "s", "output_length": 2,
         "messages": [*first, {"role": "assistant", "content": reply},
                      {"role": "user", "content": "again"}]},
    ]


@pytest.mark.xfail(strict=True, reason=ROUND5)
def test_length_granularity_is_undone_by_the_next_turns_input_length(tiny_tokenizer, tmp_path):
    """--length-granularity N publishes output lengths as multiples of N ("to blur lengths",
    audit's advice), and is refused beside --emit-output-hashes because output block counts
    "would give each length to within a block". But a session's next turn holds the reply in
    its prompt, and input_length stays exact: input_length(turn 2) - input_length(turn 1) is
    the reply's token count plus a constant (the template's and the new user turn's), exact to
    the token, not to within N. Here two logs whose first replies are 3 and 4 tokens (both
    published as output_length 16) give different traces, and the gate passes both without a
    word: the granularity hides nothing in any multi-turn session."""
    outputs = []
    for name, reply in (("three", "fox jumps over"), ("four", "fox jumps over the")):
        log = write_jsonl(tmp_path / f"{name}.jsonl", _conversation(reply))
        out = tmp_path / name
        assert anonymize(tiny_tokenizer, [log], out, "--block-size", "4",
                         "--length-granularity", "16") == 0
        rows = trace(out)
        assert [r["output_length"] for r in rows][0] == 16
        assert gate.audit(str(out), tiny_tokenizer)["publishable"]
        outputs.append([(r["input_length"], r["output_length"]) for r in rows])
    assert outputs[0] == outputs[1], (
        f"replies of 3 and 4 tokens, both published as 16, told apart by the next turn: "
        f"{outputs}")
