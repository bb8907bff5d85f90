"""Red team round 6 (rt6-det): determinism and row order. Each test asserts a promise and fails
today."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import anonymize, trace, write_jsonl
from kvtrace.cli import main

pytestmark = pytest.mark.slow

ROUND6 = "red team round 6"
SALT = b"keyed-map-test-salt-of-32-bytes!"
ZERO = 1_700_000_000_000

# Four answers of ten tokens each in the tiny tokenizer's vocabulary: the same output_length.
ANSWERS = [
    "the quick brown fox jumps over the lazy dog again",
    "again dog lazy the over jumps fox brown quick the",
    "hello world this is a prompt about caching blocks again",
    "over the lazy dog the quick brown fox jumps again",
]


def _same_question(latency: bool) -> list[dict]:
    records = []
    for i, answer in enumerate(ANSWERS):
        record = {
            "timestamp": ZERO,
            "messages": [{"role": "user", "content": "What is the capital of France ?"}],
            "output": answer,
        }
        if latency:
            record["latency_ms"] = 100 * (len(ANSWERS) - i)
        records.append(record)
    return records


@pytest.mark.xfail(strict=True, reason=ROUND6)
@pytest.mark.parametrize("latency", [True, False], ids=["with-response-ms", "without"])
def test_requests_alike_but_for_their_answers_publish_what_the_gate_passes(
    tiny_tokenizer, tmp_path, latency
):
    """Promise: the gate accepts the bytes kvtrace writes (docs/ORDERING.md: ids 'numbered
    first-seen in this same order ... so the rows' order and their ids agree in every engine').
    With --emit-output-hashes, requests of one millisecond, one prompt and one output_length
    (a retried or sampled question) tie on time, tie key and fingerprint (the fingerprint has
    the prompt, the output LENGTH and the session: not the answer). Their rows then sort by
    response_ms and the ids' digest (rows.RowBatch.sorted), but the blocks only their answers
    hold are numbered by (ts, key, fp, pos, HASH) (dense_ids.number): two tie-breaks that
    disagree. Rows come out with output ids [6, 8], [3, 9], [4, 7], [5, 10], and
    `kvtrace audit` refuses kvtrace's own folder ('output_hash_ids only outputs hold not
    numbered in first-seen order'). The same in both engines and every input order."""
    (tmp_path / "salt").write_bytes(SALT)
    night = write_jsonl(tmp_path / "night.jsonl", _same_question(latency))
    out = tmp_path / "out"
    code = anonymize(
        tiny_tokenizer,
        [night],
        out,
        "--block-size",
        "4",
        "--salt-file",
        str(tmp_path / "salt"),
        "--emit-output-hashes",
    )
    assert code == 0
    firsts: list[int] = []
    for row in trace(out):
        firsts += [i for i in row["output_hash_ids"] if i >= 3 and i not in firsts]
    assert firsts == sorted(firsts), f"output ids first seen as {firsts}"
    assert main(["audit", str(out)]) == 0
