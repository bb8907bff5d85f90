"""Red team round 23, the gate's publishing side: reproducers of what a published folder gives
back beyond the coarsening its options promise. Each asserts the promised behaviour, so each
fails until it is fixed."""

from __future__ import annotations

import pytest

from helpers import anonymize, trace, write_jsonl

pytestmark = pytest.mark.slow
SYSTEM = {"role": "system", "content": "hello world this is a prompt about caching blocks"}


def _conversation(reply: str) -> list[dict]:
    """Two turns of one session 30 s apart: the second carries the first's reply, as every
    multi-turn log does (the client sends the history back)."""
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


def test_length_granularity_above_the_block_size_is_undone_by_the_next_turns_blocks(
    tiny_tokenizer, tmp_path
):
    """--length-granularity N rounds output lengths to multiples of N (PRIVACY.md, "Publishing
    less"); round 5 closed the next turn's exact input_length by rounding its last block's fill
    (write/coarsen.coarse_input_lengths), but only within the last block: the next prompt's
    full blocks stay, and so its hash_ids count. With N above the block size (here 16 over
    blocks of 4; the same with vLLM's 16-token blocks and N = 64), replies of 3 and 13 tokens,
    both published as output_length 16 at the same times, give next turns 3 blocks apart: the
    reply's length to within a block, not to within N, and the gate passes both folders.
    Promised: two replies within one granule publish the same bytes (or a granularity the
    rows cannot hold refused in one line before the work)."""
    published = []
    for name, reply in (("three", "fox jumps over"), ("thirteen", " ".join(["fox"] * 13))):
        log = write_jsonl(tmp_path / f"{name}.jsonl", _conversation(reply))
        out = tmp_path / name
        options = ("--block-size", "4", "--length-granularity", "16", "--quiet")
        if anonymize(tiny_tokenizer, [log], out, *options) != 0:
            assert not out.exists()
            return  # refused: nothing published
        published.append([(r["output_length"], len(r["hash_ids"])) for r in trace(out)])
    assert published[0] == published[1], published
