"""Shared fixtures: a tiny trained tokenizer, the real tokenizers and traces from ../shared."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tiny_tokenizer import build_tiny_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network

# ../shared sits beside the checkout, on developers' machines and in CI alike.
SHARED = Path(os.environ.get("KVTRACE_SHARED", Path(__file__).resolve().parents[2] / "shared"))


def shared_path(*parts: str) -> Path:
    """A file from ../shared; the test is skipped where ../shared is absent (a fresh machine)."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not present (../shared is only on the project's machines)")
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory) -> str:
    return str(build_tiny_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer")))


@pytest.fixture(scope="session")
def deepseek_tokenizer() -> str:
    return str(shared_path("tokenizers", "deepseek-r1"))


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> str:
    return str(shared_path("tokenizers", "qwen3"))


def write_jsonl(path: Path, records: list) -> Path:
    """Records as JSONL; a str or bytes record is written as the raw line."""
    with open(path, "wb") as f:
        for record in records:
            if isinstance(record, bytes):
                f.write(record + b"\n")
            elif isinstance(record, str):
                f.write(record.encode() + b"\n")
            else:
                f.write(json.dumps(record).encode() + b"\n")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]


WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "again"]


def chat(i: int, ts: int, session: str | None = None, rotate: int = 0) -> dict:
    """A chat request in the tiny tokenizer's vocabulary. All share a system prompt, so blocks
    recur; i picks the user turn's length and rotate its words, so new blocks appear too."""
    words = WORDS[rotate:] + WORDS[:rotate]
    record = {"timestamp": ts, "messages": [
        {"role": "system", "content": "hello world this is a prompt about caching blocks"},
        {"role": "user", "content": " ".join(words[: 1 + i % len(words)])},
    ], "output_length": i}
    if session:
        record["session_id"] = session
    return record
