"""A log of production junk, one category per kind of damage, run through `kvtrace anonymize`:
prints, per category, how many records went in, were exported and were dead-lettered, and the
dead letters' reasons. Every record must be exported or dead-lettered; the job must finish.

    python benchmarks/hostile_logs.py --tokenizer ../shared/tokenizers/deepseek-r1
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

T = 1_763_700_000_000
USER = [{"role": "user", "content": "How do I rotate my API key?"}]
CALL = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "key"}'}}


def categories() -> dict[str, list[bytes]]:
    """category -> JSONL lines (bytes, as a log would hold them)."""

    def j(*records):
        return [json.dumps(r).encode() for r in records]

    return {
        "valid chat, prompt, tokens": j(
            {"timestamp": T, "messages": USER, "output": "Open Settings."},
            {"timestamp": T + 1, "prompt": "Summarize: keys rotate daily."},
            {"timestamp": T + 2, "input_ids": [1, 2, 3, 4, 5]},
        ),
        "not JSON / not an object": [b"not json", b"[1, 2]", b'"a string"', b'{"unterminated": '],
        "invalid UTF-8 bytes": [b'{"timestamp": 1, "prompt": "caf\xe9"}', b"\xff\xfe{}"],
        "lone surrogates (content, prompt, session, key)": [
            b'{"timestamp": 1, "prompt": "a\\ud800b"}',
            b'{"timestamp": 1, "messages": [{"role": "user", "content": "\\udfff"}]}',
            b'{"timestamp": 1, "prompt": "p", "session_id": "\\ud83d"}',
            b'{"timestamp": 1, "prompt": "p", "\\ud800": 1}',
        ],
        "integers beyond int64, floats out of range": [
            b'{"timestamp": 1, "prompt": "p", "output_length": 123456789012345678901234567890}',
            b'{"timestamp": 99999999999999999999999999, "prompt": "p"}',
            b'{"timestamp": 1e308, "prompt": "p"}',
            b'{"timestamp": 1e400, "prompt": "p"}',
            b'{"timestamp": NaN, "prompt": "p"}',
            b'{"timestamp": 1, "prompt": "p", "session_id": 99999999999999999999}',
        ],
        "timestamps: missing, negative, not ISO, epoch s/us/ns": j(
            {"prompt": "no timestamp"},
            {"timestamp": -5, "prompt": "p"},
            {"timestamp": "yesterday", "prompt": "p"},
            {"timestamp": "2025-13-01T00:00:00Z", "prompt": "p"},
            {"timestamp": 1_763_700_000, "prompt": "epoch seconds"},
            {"timestamp": 1_763_700_000_000_000, "prompt": "epoch us"},
            {"timestamp": 1_763_700_000_000_000_000, "prompt": "epoch ns"},
        ),
        "wrong types and empty inputs": j(
            {"timestamp": T, "messages": []},
            {"timestamp": T, "messages": 5},
            {"timestamp": T, "messages": json.dumps(USER)},
            {"timestamp": T, "prompt": ""},
            {"timestamp": T, "prompt": 42},
            {"timestamp": T, "input_ids": [1, "two"]},
            {"timestamp": T, "input_ids": [1, -2]},
            {"timestamp": T, "messages": USER, "output": 5},
            {"timestamp": T, "messages": USER, "output_length": -1},
            {"timestamp": T},
            {"timestamp": T, "messages": [{"role": "wizard", "content": "x"}]},
            {"timestamp": T, "messages": [{"role": "user"}]},
        ),
        "deep nesting": [
            b"[" * 5000 + b"]" * 5000,
            json.dumps(
                {"timestamp": T, "prompt": "p", "x": json.loads("[" * 80 + "]" * 80)}
            ).encode(),
        ],
        "tool calling, Responses, Anthropic, streamed": j(
            {
                "timestamp": T,
                "messages": [
                    *USER,
                    {"role": "assistant", "content": None, "tool_calls": [CALL]},
                    {"role": "tool", "tool_call_id": "c1", "content": "found"},
                ],
            },
            {
                "timestamp": T,
                "instructions": "be brief",
                "input": [
                    {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                    {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "ok"},
                ],
            },
            {
                "timestamp": T,
                "system": "be brief",
                "messages": [
                    *USER,
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "lookup", "input": {}}],
                    },
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}],
                    },
                ],
            },
            {
                "request": {"messages": USER},
                "response": [
                    {"created": 1763700000, "choices": [{"delta": {"content": "Open "}}]},
                    {"choices": [{"delta": {"content": "Settings."}}]},
                ],
            },
        ),
        "non-text parts": j(
            {
                "timestamp": T,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what is this"},
                            {"type": "image_url", "image_url": {"url": "x"}},
                        ],
                    }
                ],
            },
            {"timestamp": T, "messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
        ),
        "long request (300k tokens)": j({"timestamp": T, "input_ids": list(range(1000)) * 300}),
        "oversized record (> --max-record-bytes)": j({"timestamp": T, "prompt": "x" * 3_000_000}),
    }


def damaged_files(directory: Path) -> dict[str, list[Path]]:
    lines = b"".join(
        json.dumps({"timestamp": T + i, "prompt": f"request {i} " * 50}).encode() + b"\n"
        for i in range(20_000)
    )
    gz, bz = gzip.compress(lines), bz2.compress(lines)
    (directory / "truncated.jsonl.gz").write_bytes(gz[: len(gz) // 2])
    (directory / "corrupt.jsonl.bz2").write_bytes(bz[:100] + b"\0" * 64 + bz[164:])
    (directory / "bom.jsonl").write_bytes(
        b"\xef\xbb\xbf" + json.dumps({"timestamp": T, "prompt": "after a BOM"}).encode() + b"\n"
    )
    table = pa.table({"timestamp": [T] * 10, "prompt": ["parquet row"] * 10})
    pq.write_table(table, directory / "whole.parquet")
    (directory / "truncated.parquet").write_bytes((directory / "whole.parquet").read_bytes()[:-100])
    return {
        "damaged files (truncated .gz, corrupt .bz2, truncated Parquet)": [
            directory / "truncated.jsonl.gz",
            directory / "corrupt.jsonl.bz2",
            directory / "truncated.parquet",
        ],
        "BOM, whole Parquet": [directory / "bom.jsonl", directory / "whole.parquet"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        groups: dict[str, list[Path]] = {}
        for index, (name, lines) in enumerate(categories().items()):
            path = tmp / f"{index:02d}.jsonl"
            path.write_bytes(b"\n".join(lines) + b"\n")
            groups[name] = [path]
        groups.update(damaged_files(tmp))
        inputs = [a for paths in groups.values() for p in paths for a in ("--input", str(p))]
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "kvtrace.cli",
                "anonymize",
                *inputs,
                "--output",
                str(tmp / "out"),
                "--tokenizer",
                args.tokenizer,
                "--block-size",
                "16",
                "--max-record-bytes",
                "2000000",
            ],
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            print(run.stderr, file=sys.stderr)
            return 1
        letters = [
            json.loads(line)
            for f in (tmp / "out-rejected").glob("*.jsonl")
            for line in f.read_text().splitlines()
        ]
        manifest = json.loads((tmp / "out" / "manifest.json").read_text())["records"]
        print("| category | dead letters by reason |\n|---|---|")
        for name, paths in groups.items():
            reasons = Counter(
                letter["error"] for letter in letters if letter["source"] in {str(p) for p in paths}
            )
            print(
                f"| {name} | {', '.join(f'{r} {n}' for r, n in sorted(reasons.items())) or '-'} |"
            )
        print(f"\nmanifest records: {json.dumps(manifest)}")
        ok = (
            manifest["read"]
            == manifest["exported"] + manifest["rejected"]
            == (manifest["exported"] + len(letters))
        )
        print("every record exported or dead-lettered:", ok)
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
