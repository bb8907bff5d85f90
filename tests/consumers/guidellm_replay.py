"""Run with guidellm's Python: does guidellm's Mooncake trace format replay a kvtrace trace?

Usage: python guidellm_replay.py TRACE.jsonl BLOCK_SIZE TOKENIZER_DIR
Checks, for every row: guidellm's own row validation (ceil(input_length / hash_id_block_size)
blocks); the token blocks its prompt builder assigns to the row's hash ids add up to exactly
`input_length` tokens; and equal ids always get equal blocks (the prefix structure). Prints
one JSON summary line; exits 1 on the first failure.
"""

import json
import sys

from datasets import Dataset
from faker import Faker
from guidellm.data.deserializers.trace_mooncake import MooncakeTraceFormat
from guidellm.schemas.data.deserializers import MooncakeTraceFormatArgs
from transformers import AutoTokenizer


def main(path: str, block_size: int, tokenizer_dir: str) -> int:
    with open(path) as lines:
        rows = [json.loads(line) for line in lines]
    config = MooncakeTraceFormatArgs.model_construct(hash_id_block_size=block_size)
    trace = MooncakeTraceFormat(config, Dataset.from_list(rows))
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    faker = Faker()
    Faker.seed(0)
    for number, row in enumerate(trace.dataset, 1):
        trace.validate_row(row)
        trace.create_prompt(row, tokenizer, faker)
        tokens = sum(len(trace._hash_id_table[i]) for i in row["hash_ids"])
        if tokens != row["input_length"]:
            print(f"row {number}: {tokens} tokens, not {row['input_length']}", file=sys.stderr)
            return 1
    print(json.dumps({"rows": len(rows), "blocks": len(trace._hash_id_table)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
