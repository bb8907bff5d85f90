"""Run with aiperf's Python: does aiperf replay a kvtrace trace as it is?

Usage: python aiperf_replay.py TRACE.jsonl BLOCK_SIZE TOKENIZER_DIR [sessions]
Checks, for every row: aiperf's MooncakeTrace model accepts it; the loader would not group it
with other rows into an accumulating multi-turn session (no `session_id`; with `sessions`, a
`kvtrace export --to aiperf-sessions` file: turns grouped by session_id, each follow-up's
`delay` read as written, and each turn's tokens only what it adds); the token sequence
aiperf's prompt generator builds for it (the one its loader decodes into the request) has
exactly `input_length` tokens; and rows sharing their first k hash ids share their first
k * BLOCK_SIZE tokens. Prints one JSON summary line; exits 1 on the first failure.
"""

import json
import sys

from aiperf.common import random_generator as rng
from aiperf.common.tokenizer import Tokenizer
from aiperf.dataset.generator.prompt import PromptGenerator
from aiperf.dataset.loader.models import MooncakeTrace


def main(path: str, block_size: int, tokenizer_dir: str, sessions: bool = False) -> int:
    rng.init(0)
    generator = PromptGenerator(
        prompts=None, prefix_prompts=None, tokenizer=Tokenizer.from_pretrained(tokenizer_dir)
    )
    by_prefix: dict[tuple, list[int]] = {}
    rows = 0
    with open(path) as lines:
        for number, line in enumerate(lines, 1):
            row = json.loads(line)
            trace = MooncakeTrace.model_validate(row)
            if sessions and (
                trace.session_id != row.get("session_id")
                or trace.delay != row.get("delay")
                or (trace.delay is not None and trace.timestamp is not None)
            ):
                # a follow-up with a timestamp would be scheduled by it, not by its delay
                print(
                    f"row {number}: aiperf reads session {trace.session_id}, delay "
                    f"{trace.delay}, timestamp {trace.timestamp}",
                    file=sys.stderr,
                )
                return 1
            if trace.session_id is not None and not sessions:
                print(f"row {number}: has session_id, aiperf would accumulate it", file=sys.stderr)
                return 1
            tokens = generator._build_token_sequence(trace.input_length, trace.hash_ids, block_size)
            if len(tokens) != trace.input_length:
                print(
                    f"row {number}: {len(tokens)} tokens, not {trace.input_length}", file=sys.stderr
                )
                return 1
            for k in range(1, len(trace.hash_ids) + 1):
                prefix = tuple(trace.hash_ids[:k])
                span = tokens[: min(k * block_size, len(tokens))]
                seen = by_prefix.setdefault(prefix, span)
                if seen[: len(span)] != span[: len(seen)]:
                    print(
                        f"row {number}: hash ids {list(prefix)} give other tokens than before",
                        file=sys.stderr,
                    )
                    return 1
            rows += 1
    print(json.dumps({"rows": rows, "prefixes": len(by_prefix)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:] == ["sessions"]))
