"""Run with guidellm's Python: does guidellm's WEKA trace format read a `kvtrace export --to
weka` file as conversations of chained turns?

Usage: python guidellm_weka.py FILE.jsonl BLOCK_SIZE TOKENIZER_DIR
Builds every conversation's graph with guidellm's own reader (WEKATraceFormat): each
conversation one agent's chain, every turn but the first the child of the one before it with
its whole history, its prompt `in` tokens long, at its `t` from the trace's start. Prints one
JSON summary line; exits 1 on the first failure.
"""

import json
import sys

from datasets import Dataset
from faker import Faker
from guidellm.data.deserializers.trace_weka import WEKATraceFormat
from guidellm.schemas.data.deserializers import WEKATraceFormatArgs
from transformers import AutoTokenizer


def main(path: str, block_size: int, tokenizer_dir: str) -> int:
    with open(path) as lines:
        conversations = [json.loads(line) for line in lines]
    config = WEKATraceFormatArgs.model_construct(hash_id_block_size=block_size)
    trace = WEKATraceFormat(config, Dataset.from_list(conversations))
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    faker = Faker()
    Faker.seed(0)
    turns = 0
    origin = min(r["t"] for c in conversations for r in c["requests"])
    for stub, conversation in zip(trace, conversations):
        graph = trace.build_conversation_graph(stub, tokenizer, faker)
        for index, (turn, request) in enumerate(zip(graph.turns, conversation["requests"])):
            parents = [(p.parent_node_id, p.history_context) for p in turn.parents]
            expected = [] if index == 0 else [(graph.turns[index - 1].node_id, "full")]
            columns = turn.columns
            seen = (
                parents,
                columns["prompt_tokens_count_column"][0],
                round(columns["relative_timestamp_column"][0], 6),
            )
            if seen != (expected, request["in"], round(request["t"] - origin, 6)):
                print(f"{conversation['id']} turn {index}: {seen}", file=sys.stderr)
                return 1
        if len(graph.turns) != len(conversation["requests"]):
            print(f"{conversation['id']}: {len(graph.turns)} turns", file=sys.stderr)
            return 1
        turns += len(graph.turns)
    print(json.dumps({"conversations": len(conversations), "turns": turns}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
