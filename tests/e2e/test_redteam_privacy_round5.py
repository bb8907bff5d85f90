"""Red team round 5: what a published trace gives away beyond what its coarsening promises.
Each test asserts the promised behaviour, so each fails until it is fixed."""

from __future__ import annotations

import pytest

from helpers import anonymize, trace, write_jsonl
from kvtrace.transforms.stats import audit as gate

pytestmark = pytest.mark.slow
ROUND5 = "red team round 5"
SYSTEM = {"role": "system", "content": "hello world this is a prompt about caching blocks"}


def _conversation(reply: str) -> list[dict]:
    """Two turns of one session: the second carries the first's reply, as every multi-turn log
    does (the client sends the history back)."""
    first = [SYSTEM, {"role": "user", "content": "the quick brown"}]
    return [
        {
            "timestamp": 1_700_000_000_000,
            "session_id": "s",
            "messages": first,
            "output_length": len(reply.split()),
        },
        {
            "timestamp": 1_700_000_030_000,
            "session_id": "s",
            "output_length": 2,
            "messages": [
                *first,
                {"role": "assistant", "content": reply},
                {"role": "user", "content": "again"},
            ],
        },
    ]


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
        assert (
            anonymize(
                tiny_tokenizer, [log], out, "--block-size", "16", "--length-granularity", "16"
            )
            == 0
        )
        rows = trace(out)
        assert [r["output_length"] for r in rows][0] == 16
        assert gate.audit(str(out), tiny_tokenizer)["publishable"]
        outputs.append([(r["input_length"], r["output_length"]) for r in rows])
    assert outputs[0] == outputs[1], (
        f"replies of 3 and 4 tokens, both published as 16, told apart by the next turn: {outputs}"
    )


def test_a_private_tokenizers_files_are_published_as_plain_digests(tiny_tokenizer, tmp_path):
    """Template kwargs are published keyed by the run's salt "so no one without the salt can
    confirm a guessed value (a plain sha256 of 'alice' would be a dictionary lookup away)", and
    a tokenizer kvtrace does not declare is published without its name. But its files are
    published as plain sha256 (tokenizer.sha256, public_tokenizer_sha256), the chat template
    included: an operator's template holding a default system prompt (a customer's name, a
    ward, a patient) is confirmed by anyone who guesses it, e.g. a public template plus one
    line, the guess hashed and compared with the manifest. Digests of a private tokenizer serve
    no outsider (they cannot fetch the files), and the gate passes them."""
    import hashlib
    import json
    import shutil
    from pathlib import Path

    from helpers import chat

    private = tmp_path / "acme-tokenizer"
    shutil.copytree(tiny_tokenizer, private)
    template = Path(private / "chat_template.jinja")
    secret = (
        "{% if messages[0].role != 'system' %}<|im_start|>system\nyou are the triage "
        "assistant of acme ward 7 for patient jane doe<|im_end|>\n{% endif %}"
    )
    template.write_text(secret + template.read_text())
    log = write_jsonl(tmp_path / "night.jsonl", [chat(i, 997 * i) for i in range(4)])
    assert anonymize(str(private), [log], tmp_path / "out", "--block-size", "4") == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["tokenizer"]["name"] is None  # not named: it is the operator's own
    assert gate.audit(str(tmp_path / "out"), str(private))["publishable"]
    guess = hashlib.sha256(template.read_bytes()).hexdigest()  # what an outsider computes
    assert guess not in manifest["tokenizer"]["sha256"].values(), (
        "the guessed private template is confirmed by the published digest"
    )
