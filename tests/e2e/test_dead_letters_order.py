"""The local engine publishes its dead letters in the declared order (dead_letters.py), whatever
the order of the records that make them: letters of every stage (reading, parsing, rendering,
the timestamp check after hashing) merged into one sorted file."""

from __future__ import annotations

import json
import random

from helpers import anonymize, chat, published_letters, write_jsonl

DAY_S = 86_400
# One letter of each stage: too large to read, not JSON, not a request, a template that raises,
# a timestamp years from the bulk of the input's.
BAD = [
    b'{"pad": "' + b"z" * 1100 + b'"}',
    b"zz not json",
    b"aa not json",
    {"messages": []},
    {"timestamp": 1_700_000_000, "messages": [{"role": "developer", "content": "raises"}]},
    chat(3, 1_700_000_000 - 900 * DAY_S),
]
REASONS = {
    "too_large",
    "invalid_json",
    "invalid_request",
    "template_error",
    "implausible_timestamp",
}


def test_letters_are_sorted_bytes_whatever_the_record_order(tiny_tokenizer, tmp_path):
    salt = tmp_path / "salt"
    salt.write_text("a-salt-for-tests-that-is-long-enough\n")
    salt.chmod(0o600)
    # The oversized record stays first: its letter names its byte offset.
    oversized, records = BAD[0], [chat(i, 1_700_000_000 + i) for i in range(12)] + BAD[1:]
    published = []
    for run, order in enumerate((records, random.Random(7).sample(records, len(records)))):
        (tmp_path / f"in{run}").mkdir()
        src = write_jsonl(tmp_path / f"in{run}" / "in.jsonl", [oversized, *order])
        out = tmp_path / f"out{run}"
        assert (
            anonymize(
                tiny_tokenizer,
                [src],
                out,
                "--block-size",
                "4",
                "--salt-file",
                str(salt),
                "--max-record-bytes",
                "1024",
                "--max-rejected-fraction",
                "0.9",
            )
            == 0
        )
        lines = published_letters(tmp_path / f"out{run}-rejected").read_bytes().splitlines()
        assert lines == sorted(lines)
        assert {json.loads(line)["error"] for line in lines} == REASONS
        published.append([json.loads(line) | {"source": ""} for line in lines])
    assert published[0] == published[1]
