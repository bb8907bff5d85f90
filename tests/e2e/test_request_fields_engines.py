"""Requests carrying the per-API fields (cache_salt, truncation, add_special_tokens) publish the
same bytes on every engine and on every night of an id map: the fields are read once by the
reader, applied once by the encoder, whichever engine runs them (round 24's review)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import SALT, anonymize, assert_same_output, write_jsonl

SYSTEM = "the quick brown fox jumps over the lazy dog again and again " * 8


def _records() -> list[dict]:
    """Two tenants' chats on one system prompt, salted apart, and one unsalted; a truncated
    prompt from each side, and a chat asking for special tokens."""
    records = []
    for i in range(12):
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"hello world {i}"},
        ]
        fields = {"cache_salt": f"tenant-{i % 2}"} if i % 3 else {}
        records.append({"timestamp": 1_000 * i, "messages": messages, "output_length": 3, **fields})
    records.append(
        {"timestamp": 20_000, "prompt": SYSTEM, "truncate_prompt_tokens": 9, "output_length": 1}
    )
    records.append(
        {
            "timestamp": 21_000,
            "prompt": SYSTEM,
            "truncate_prompt_tokens": 9,
            "truncation_side": "right",
            "output_length": 1,
        }
    )
    records.append(
        {
            "timestamp": 22_000,
            "messages": [{"role": "user", "content": "hello"}],
            "add_special_tokens": True,
            "output_length": 1,
        }
    )
    return records


def _run(tokenizer: str, tmp_path: Path, out: str, *extra: str) -> Path:
    source = tmp_path / "in.jsonl"
    if not source.exists():
        write_jsonl(source, _records())
        (tmp_path / "salt").write_text(SALT)
    flags = ("--block-size", "4", "--salt-file", str(tmp_path / "salt"), "--quiet")
    assert anonymize(tokenizer, [source], tmp_path / out, *flags, *extra) == 0
    return tmp_path / out


def _rows(out: Path) -> list[dict]:
    return [
        json.loads(line)
        for path in sorted(out.glob("trace-*.jsonl"))
        for line in path.read_text().splitlines()
    ]


@pytest.mark.slow  # three whole runs, one on Beam
@pytest.mark.beam
def test_the_request_fields_publish_alike_on_every_engine(tiny_tokenizer, tmp_path):
    local = _run(tiny_tokenizer, tmp_path, "local", "--engine", "local")
    workers = _run(tiny_tokenizer, tmp_path, "workers", "--engine", "local", "--processes", "2")
    beam = _run(tiny_tokenizer, tmp_path, "beam", "--engine", "beam")
    assert_same_output(local, workers)
    assert_same_output(local, beam)
    rows = _rows(local)
    assert len(rows) == 15
    tenant = {i: set(rows[i]["hash_ids"]) for i in (1, 2)}  # tenant-1 and tenant-0
    assert not tenant[1] & tenant[2]
    assert [row["input_length"] for row in rows[12:14]] == [9, 9]
    assert rows[12]["hash_ids"][0] != rows[13]["hash_ids"][0]  # the last 9 and the first 9


@pytest.mark.slow
def test_the_request_fields_give_the_same_ids_on_every_night_of_an_id_map(tiny_tokenizer, tmp_path):
    flags = ("--id-map", str(tmp_path / "map"), "--id-map-marks", str(tmp_path / "marks"))
    nights = [_run(tiny_tokenizer, tmp_path, f"night{n}", *flags) for n in (1, 2)]
    assert _rows(nights[0]) == _rows(nights[1])
