"""Red team round 13, determinism: reproducers of a dead letter that depends on which step
refused its record, for the same record and configuration. Each test asserts the promised
behaviour and fails today (issue 33)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import SALT, anonymize, chat, published_letters, write_jsonl

pytestmark = pytest.mark.slow

DAY0_S = 1_763_703_600  # 2025-11-21T05:40:00Z
HASH = 918_273_645_546_372_819  # an engine's block hash, as a capture logs it


def test_a_batch_line_holding_engine_hashes_withholds_its_letter_as_any_record_does(
    tiny_tokenizer, tmp_path
):
    """Promise (docs/CAPTURES.md, 'Never published, never written': in a text run 'a record any
    of whose keys, decoded, names a field engines keep hashes in withholds its letter, whether
    it is refused as it is parsed or later'). An OpenAI Batch line is decoded to find its
    custom_id, yet the join's letters (a custom_id on two lines: `duplicate_custom_id`; an
    answer to no request: `unjoined_batch`) are made by read/batch_join._letter without
    ParseOptions.withholds: the same line given as a log record is withheld, given as a Batch
    line its raw engine hashes are written into the letter. The letter's fate depends on the
    step that refused it, not on the record. Fixed by construction: the Half keeps the decision
    batch_half made when it decoded the line, and every letter of a Half carries it."""
    requests = [
        {
            "custom_id": "twice",
            "method": "POST",
            "body": {"model": "m", "messages": chat(i, 0)["messages"], "sequence_hashes": [HASH]},
        }
        for i in range(2)
    ]
    answer = {"created": DAY0_S, "usage": {"completion_tokens": 3}, "sequence_hashes": [HASH]}
    stray = {"id": "b0", "custom_id": "stray", "response": {"status_code": 200, "body": answer}}
    inputs = [write_jsonl(tmp_path / "input.jsonl", requests)]
    inputs.append(write_jsonl(tmp_path / "output.jsonl", [stray]))
    inputs.append(
        write_jsonl(tmp_path / "logs.jsonl", [chat(i, (DAY0_S + i) * 1000) for i in range(4)])
    )
    salt = tmp_path / "salt"
    salt.write_text(SALT)
    out = tmp_path / "out"
    extra = ("--salt-file", str(salt), "--max-rejected-fraction", "1")
    assert anonymize(tiny_tokenizer, inputs, out, *extra) == 0
    letters = published_letters(Path(f"{out}-rejected")).read_text()
    assert letters.count("duplicate_custom_id") == 2 and "unjoined_batch" in letters
    assert str(HASH) not in letters
