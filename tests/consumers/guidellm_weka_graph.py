"""Run with guidellm's Python: the conversation graph guidellm's own WEKA reader
(WEKATraceFormat) builds from a `kvtrace export --to weka` file, subagent entries included.

Usage: python guidellm_weka_graph.py FILE.jsonl BLOCK_SIZE TOKENIZER_DIR
Prints one JSON line: per turn, its play, node, agent, prompt tokens and parents (each the
parent node and the history it carries: "new" for a spawned chain, "full" for the previous
turn, "last" for a join).
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
        plays = [json.loads(line) for line in lines]
    config = WEKATraceFormatArgs.model_construct(hash_id_block_size=block_size)
    trace = WEKATraceFormat(config, Dataset.from_list(plays))
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    Faker.seed(0)
    faker = Faker()
    turns = []
    for stub, play in zip(trace, plays):
        graph = trace.build_conversation_graph(stub, tokenizer, faker)
        for turn in graph.turns:
            turns.append(
                {
                    "play": play["id"],
                    "node": turn.node_id,
                    "agent": turn.agent_id,
                    "prompt": int(turn.columns["prompt_tokens_count_column"][0]),
                    "parents": [[p.parent_node_id, p.history_context] for p in turn.parents],
                }
            )
    print(json.dumps({"turns": turns}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
