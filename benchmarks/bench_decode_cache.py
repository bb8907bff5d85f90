"""How much hit rate caching outputs adds on multi-turn chat logs, per chat template.

Generates multi-turn conversations (a system prompt shared by a third of them, user turns,
answers; reasoning models also generate reasoning, which clients do not send back), anonymizes
them with --emit-output-hashes under each template, and simulates with and without
--decode-cache. The answer depends on whether the template renders an earlier answer exactly
as the engine generated it.

    python benchmarks/bench_decode_cache.py [--conversations 200] [--turns 6]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared"
# (label, tokenizer, template file, chat template kwargs, reasoning: how the engine's output
# starts, or None for a model that does not reason)
SETUPS = [
    (
        "Qwen2.5-7B-Instruct template (history verbatim)",
        "qwen3",
        "Qwen-Qwen2.5-7B-Instruct.jinja",
        {},
        None,
    ),
    (
        "Qwen3 template, thinking off",
        "qwen3",
        "Qwen-Qwen3-0.6B.jinja",
        {"enable_thinking": False},
        None,
    ),
    ("Qwen3 template, thinking on", "qwen3", "Qwen-Qwen3-0.6B.jinja", {}, "<think>\n"),
    (
        "DeepSeek-R1-Distill template (reasoning stripped)",
        "deepseek-r1",
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
        {},
        "",
    ),
]
BLOCK = 16
CAPACITY = 200_000  # tokens: a small GPU cache, where eviction matters


def words(rng: random.Random, n: int) -> str:
    vocabulary = (
        "cache block token prefix model answer question data system user time value "
        "result server request memory layer batch queue window count order graph "
        "energy market river planet music history language number"
    ).split()
    return " ".join(rng.choice(vocabulary) for _ in range(n)) + "."


def chat_logs(path: Path, conversations: int, turns: int, reasoning: str | None, seed: int = 0):
    rng = random.Random(seed)
    systems = [words(rng, 300) for _ in range(3)]
    rows = []
    for c in range(conversations):
        messages = [{"role": "system", "content": systems[c % 3]}] if c % 3 == 0 else []
        clock = c * 7_000
        for turn in range(turns):
            messages.append({"role": "user", "content": words(rng, rng.randint(20, 200))})
            answer = words(rng, rng.randint(50, 400))
            output = (
                answer
                if reasoning is None
                else (f"{reasoning}{words(rng, rng.randint(100, 800))}\n</think>\n\n{answer}")
            )
            rows.append(
                {
                    "timestamp": clock,
                    "session_id": f"c{c}",
                    "messages": list(messages),
                    "output": output,
                }
            )
            messages.append({"role": "assistant", "content": answer})  # clients send content
            clock += rng.randint(20_000, 90_000)
    rows.sort(key=lambda r: r["timestamp"])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def tokenizer_with(template: str, tokenizer: str, folder: Path) -> str:
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SHARED / "tokenizers" / tokenizer / name, folder / name)
    shutil.copy(SHARED / "templates" / template, folder / "chat_template.jinja")
    return str(folder)


def main() -> None:
    from kvtrace.cli import main as kvtrace
    from kvtrace.pipelines.simulate import SimulateConfig, run_simulate
    from kvtrace.transforms.cache.capacity import Capacity

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--turns", type=int, default=6)
    args = parser.parse_args()
    print(
        f"{args.conversations} conversations x {args.turns} turns, block size {BLOCK}; "
        f"token-weighted hit rates\n"
    )
    print("| template | infinite cache | + decode cache | LRU 200k tokens | + decode cache |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for i, (label, tokenizer, template, kwargs, reasoning) in enumerate(SETUPS):
            logs = work / f"logs{i}.jsonl"
            chat_logs(logs, args.conversations, args.turns, reasoning)
            folder = tokenizer_with(template, tokenizer, work / f"tok{i}")
            out = work / f"out{i}"
            code = kvtrace(
                [
                    "anonymize",
                    "--input",
                    str(logs),
                    "--output",
                    str(out),
                    "--tokenizer",
                    folder,
                    "--block-size",
                    str(BLOCK),
                    "--emit-output-hashes",
                    "--chat-template-kwargs",
                    json.dumps(kwargs),
                ]
            )
            assert code == 0, label
            files = tuple(str(p) for p in sorted(out.glob("trace-*.jsonl")))
            rates = [
                run_simulate(
                    SimulateConfig(
                        files, (Capacity(CAPACITY, None),), ("lru",), BLOCK, decode_cache=decode
                    )
                )
                for decode in (False, True)
            ]
            print(
                f"| {label} | {rates[0]['infinite_cache']['token_weighted']:.4f} | "
                f"{rates[1]['infinite_cache']['token_weighted']:.4f} | "
                f"{rates[0]['policies']['lru'][0]['hit_rate']:.4f} | "
                f"{rates[1]['policies']['lru'][0]['hit_rate']:.4f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
