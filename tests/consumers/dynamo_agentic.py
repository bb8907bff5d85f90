"""Run with Dynamo's Python: does Dynamo read a `kvtrace export --to dynamo-agentic|weka` file
with its structure intact?

Usage: python dynamo_agentic.py FILE FORMAT BLOCK_SIZE EXPECTED.json
FORMAT is agentic_mooncake or weka. EXPECTED holds the conversations, each a list of turns:
the prompt length, the ms from which it may start (not_before: from the trace's start for
agentic_mooncake, from its conversation's first turn for weka, which replays each conversation
from 0) and, for a follow-up turn, the wait after the previous turn's completion. Replays
offline (Dynamo's own reader and simulated engine) and checks every request: each conversation
is one chain, in order, and each follow-up starts at max(not_before, previous end + wait).
Prints one JSON summary line, with the prompt tokens the engine found cached for conversations'
first turns (blocks another conversation left); exits 1 on the first failure.
"""

import json
import sys
from collections import defaultdict

from dynamo.replay import run_trace_replay


def conversation_of(request: dict, trace_format: str) -> str:
    if trace_format == "weka":  # "weka:<play>:request:outer:<n>"
        return request["request_id"].split(":request:")[0]
    return request["session_id"]


def turn_of(request: dict, trace_format: str) -> int:
    if trace_format == "weka":
        return int(request["request_id"].rsplit(":", 1)[1])
    return int(request["request_id"][1:])  # r<rank>: rank in time order


def main(path: str, trace_format: str, block_size: int, expected_path: str) -> int:
    with open(expected_path) as handle:
        expected = json.load(handle)["conversations"]
    report = run_trace_replay(
        path,
        trace_format=trace_format,
        trace_block_size=block_size,
        capture_per_request=True,
        execution_model="MODEL",
    )
    chains = defaultdict(list)
    for request in report.per_request:
        chains[conversation_of(request, trace_format)].append(request)
    by_prompts = {tuple(t["prompt"] for t in turns): turns for turns in expected}
    waits = first_turns_reused = 0
    for chain in chains.values():
        chain.sort(key=lambda r: turn_of(r, trace_format))
        turns = by_prompts.pop(tuple(r["input_length"] for r in chain), None)
        if turns is None:
            print(f"a chain of prompts {[r['input_length'] for r in chain]}", file=sys.stderr)
            return 1
        start = chain[0]["dispatched_at_ms"] - turns[0]["not_before"]
        first_turns_reused += chain[0]["reused_input_tokens"]
        for before, request, turn in zip([None, *chain], chain, turns):
            due = start + turn["not_before"]
            if turn["wait"] is not None:
                due = max(due, before["terminal_time_ms"] + turn["wait"])
                waits += 1
            if abs(request["dispatched_at_ms"] - due) > 1e-6:
                print(f"{request['request_id']} at {request['dispatched_at_ms']}, not {due}")
                return 1
    if by_prompts:
        print(f"conversations not replayed: {list(by_prompts)}", file=sys.stderr)
        return 1
    summary = {"rows": len(report.per_request), "chains": len(chains), "waits": waits}
    print(json.dumps({**summary, "first_turns_reused": first_turns_reused}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
