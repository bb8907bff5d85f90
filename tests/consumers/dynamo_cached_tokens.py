"""Run with Dynamo's Python: replay a Mooncake trace through Dynamo's mocker (its KV block
manager is the engine's own) with a cache of a given number of blocks, and log each request as
a provider logs a request to an OpenAI-compatible server: its arrival, its token ids (block id
h of the trace as the block_size tokens h * block_size + j, so anonymizing the log at that
block size gives the trace's blocks back) and its response's usage.prompt_tokens_details
.cached_tokens, the prefix tokens the mocker found cached (its per-request report's
reused_input_tokens). The trace's timestamps must be distinct: they match rows to requests.

Usage: python dynamo_cached_tokens.py TRACE.jsonl BLOCK_SIZE GPU_BLOCKS OUT.jsonl
Prints one JSON summary line (requests, the mocker's reused-token ratio).
"""

import json
import sys

from dynamo.replay import run_trace_replay


def main(path: str, block_size: int, gpu_blocks: int, out: str) -> int:
    report = run_trace_replay(
        path,
        trace_format="mooncake",
        trace_block_size=block_size,
        capture_per_request=True,
        extra_engine_args={
            "engine": {"num_gpu_blocks": gpu_blocks, "block_size": block_size},
            "num_gpu_blocks_is_explicit": True,
        },
    )
    with open(path) as handle:
        rows = {float(row["timestamp"]): row for row in map(json.loads, handle)}
    with open(out, "w") as handle:
        for request in report.per_request:
            row = rows[request["arrival_time_ms"]]
            ids = [h * block_size + j for h in row["hash_ids"] for j in range(block_size)]
            usage = {
                "prompt_tokens": request["input_length"],
                "prompt_tokens_details": {"cached_tokens": request["reused_input_tokens"]},
            }
            line = {
                "timestamp": row["timestamp"],
                "input_ids": ids[: row["input_length"]],
                "output_length": row["output_length"],
                "response": {"usage": usage},
            }
            handle.write(json.dumps(line) + "\n")
    ratio = report.summary["prefix_cache_reused_ratio"]
    print(json.dumps({"requests": len(report.per_request), "reused_ratio": ratio}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
