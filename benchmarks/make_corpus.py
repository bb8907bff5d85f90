"""Deterministic benchmark corpora of chat requests (English-like text, seeded).

long:  Mooncake-like long prompts, ~10k tokens each: one of a few shared documents (the reusable
       prefix) followed by a unique question, as in document QA.
short: short multi-turn chats, ~300 tokens each, sharing a few system prompts.
agent: tool-calling agent sessions of 10-60 turns (tool definitions, tool calls and results),
       each request carrying its session's whole history, sessions interleaved in time.
streamed: multi-turn chats whose responses are logged as streamed chunks (bytes >> tokens).
single: unique single-turn prompts (100-1,500 words), nothing shared.
rendered: production rows logged after templating: prompt text (~14k tokens, DeepSeek-R1's chat
       markers around a shared document and a unique question) and the response text.

    python benchmarks/make_corpus.py long 3000 benchmarks/corpora/long.jsonl
    python benchmarks/make_corpus.py rendered 1500 benchmarks/corpora/rendered.jsonl
    python benchmarks/make_corpus.py agent 2000 benchmarks/corpora/agent.jsonl
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

WORDS = (
    "the of and to in is was that for on with as by at from it his an were are which this be "
    "has had one their not but all its they been who more have about when than there would into "
    "system model request cache memory token prefix block server latency throughput benchmark "
    "user assistant document summary question answer report data value result table figure "
    "market price growth policy energy water climate city river mountain history science art "
    "music language network security privacy storage compute cluster region service customer "
    "account invoice billing support ticket update release version feature library function "
    "quickly slowly carefully roughly nearly almost often never always usually sometimes today "
    "large small early late new old high low long short first last next previous final major"
).split()


def sentence(rng: random.Random, words: int) -> str:
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    return text[0].upper() + text[1:] + "."


def paragraph(rng: random.Random, words: int) -> str:
    out, left = [], words
    while left > 0:
        n = min(left, rng.randint(8, 24))
        out.append(sentence(rng, n))
        left -= n
    return " ".join(out)


def long_requests(count: int, rng: random.Random) -> list[dict]:
    # ~1.1 tokens per word with DeepSeek-R1: 9,000 words is ~10k tokens of shared document.
    documents = [paragraph(rng, 9_000) for _ in range(8)]
    requests = []
    for i in range(count):
        doc = rng.choice(documents)
        question = paragraph(rng, rng.randint(100, 600))
        requests.append(
            {
                "timestamp": i * 250,
                "messages": [
                    {"role": "system", "content": "Answer from the document below.\n\n" + doc},
                    {"role": "user", "content": question},
                ],
                "output_length": rng.randint(50, 500),
            }
        )
    return requests


def short_requests(count: int, rng: random.Random) -> list[dict]:
    systems = [paragraph(rng, 100) for _ in range(4)]
    requests = []
    for i in range(count):
        turns = [{"role": "system", "content": rng.choice(systems)}]
        for _ in range(rng.randint(1, 3)):
            turns.append({"role": "user", "content": paragraph(rng, rng.randint(30, 90))})
            turns.append({"role": "assistant", "content": paragraph(rng, rng.randint(20, 60))})
        turns.pop()
        requests.append(
            {
                "timestamp": i * 20,
                "session_id": f"s{i // 3}",
                "messages": turns,
                "output": paragraph(rng, rng.randint(10, 80)),
            }
        )
    return requests


def rendered_requests(count: int, rng: random.Random) -> list[dict]:
    documents = [paragraph(rng, 12_000) for _ in range(8)]
    requests = []
    for i in range(count):
        prompt = (
            "<｜begin▁of▁sentence｜>Answer from the document below.\n\n"
            + rng.choice(documents)
            + "<｜User｜>"
            + paragraph(rng, rng.randint(100, 600))
            + "<｜Assistant｜><think>\n"
        )
        requests.append(
            {"timestamp": i * 250, "prompt": prompt, "output": paragraph(rng, rng.randint(50, 300))}
        )
    return requests


def agent_requests(count: int, rng: random.Random) -> list[dict]:
    """Tool-calling agent sessions of 10-60 turns, interleaved in time: every request re-sends
    the shared system prompt, the session's tool definitions and its whole history."""
    system = paragraph(rng, 800)
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{t}",
                "description": sentence(rng, 25),
                "parameters": {
                    "type": "object",
                    "required": ["query"],
                    "properties": {
                        "query": {"type": "string", "description": sentence(rng, 12)},
                        "limit": {"type": "integer", "description": sentence(rng, 8)},
                    },
                },
            },
        }
        for t in range(12)
    ]
    sessions = []
    while sum(len(s) for s in sessions) < count:
        chosen = rng.sample(tools, rng.randint(4, 8))
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": paragraph(rng, rng.randint(40, 200))},
        ]
        turns = []
        for turn in range(rng.randint(10, 60)):
            if turn % 3 == 2:
                answer = paragraph(rng, rng.randint(30, 150))
                turns.append((list(messages), chosen, answer))
                messages += [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": paragraph(rng, rng.randint(10, 80))},
                ]
                continue
            call = {
                "id": f"call_{len(sessions)}_{turn}",
                "type": "function",
                "function": {
                    "name": rng.choice(chosen)["function"]["name"],
                    "arguments": json.dumps({"query": sentence(rng, rng.randint(5, 15))}),
                },
            }
            turns.append((list(messages), chosen, None))
            messages += [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "content": paragraph(rng, rng.randint(50, 400)),
                },
            ]
        sessions.append(turns)
    requests, clock = [], 0
    cursors = [0] * len(sessions)
    while len(requests) < count:
        live = [i for i, turns in enumerate(sessions) if cursors[i] < len(turns)][:24]
        i = rng.choice(live)
        messages, chosen, answer = sessions[i][cursors[i]]
        cursors[i] += 1
        clock += rng.randint(50, 400)
        request = {
            "timestamp": clock,
            "session_id": f"agent-{i}",
            "messages": messages,
            "tools": chosen,
        }
        request.update({"output": answer} if answer else {"output_length": rng.randint(20, 80)})
        requests.append(request)
    return requests


def streamed_requests(count: int, rng: random.Random) -> list[dict]:
    """Multi-turn chats logged as OpenAI envelopes whose response is the list of streamed
    chunks (a few words each, ~200 bytes of JSON per chunk): bytes dwarf tokens."""
    system = paragraph(rng, 150)
    histories: dict[int, list[dict]] = {}
    requests = []
    for i in range(count):
        session = rng.randrange(max(1, count // 12))
        history = histories.setdefault(session, [{"role": "system", "content": system}])
        history.append({"role": "user", "content": paragraph(rng, rng.randint(10, 80))})
        words = paragraph(rng, rng.randint(60, 400)).split(" ")
        pieces = [" ".join(words[j : j + 3]) + " " for j in range(0, len(words), 3)]
        chunks = [
            {
                "id": f"chatcmpl-{i}",
                "object": "chat.completion.chunk",
                "created": 1_767_225_600 + i,
                "model": "deepseek-r1",
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": piece},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
            for piece in pieces
        ]
        chunks[-1]["choices"][0]["finish_reason"] = "stop"
        requests.append(
            {
                "request": {
                    "model": "deepseek-r1",
                    "stream": True,
                    "messages": list(history),
                    "session_id": f"c{session}",
                },
                "response": chunks,
                "timestamp": 1_767_225_600_000 + i * 200,
            }
        )
        history.append({"role": "assistant", "content": "".join(pieces)})
    return requests


def single_requests(count: int, rng: random.Random) -> list[dict]:
    """Single-turn prompts with nothing in common: nothing for a cache to reuse."""
    return [
        {
            "timestamp": i * 50,
            "prompt": paragraph(rng, rng.randint(100, 1500)),
            "output_length": rng.randint(20, 400),
        }
        for i in range(count)
    ]


def main() -> None:
    kind, count, path = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    rng = random.Random(20261121)
    requests = {
        "long": long_requests,
        "short": short_requests,
        "rendered": rendered_requests,
        "agent": agent_requests,
        "single": single_requests,
        "streamed": streamed_requests,
    }[kind](count, rng)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for request in requests:
            f.write(json.dumps(request) + "\n")


if __name__ == "__main__":
    main()
