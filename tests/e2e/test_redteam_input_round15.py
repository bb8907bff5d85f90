"""Red team round 15, hostile input: reproducers of the holes found past the round-1..14 fixes
(test_redteam_input*.py). Each asserts the promised behaviour (bad input: a one-line error or a
dead letter saying why, never a crash, a hang or memory that grows without bound; nothing lost
past --max-rejected-fraction) and fails today (2026-11-28)."""

from __future__ import annotations

import json

import pytest

from helpers import anonymize, chat

pytestmark = pytest.mark.slow


@pytest.mark.xfail(strict=True, reason="red team round 15")
def test_a_line_of_many_records_under_the_record_bound_weighs_its_bytes(tiny_tokenizer, tmp_path):
    """Round 14 made a line refused unread (over --max-record-bytes) weigh its bytes in
    --max-rejected-fraction (sources._oversized): "a writer that left out the newlines". The
    same line under the bound is read, is not JSON, and is one invalid_json letter weighing
    one record and no byte (records.load_json_line; docs/ANONYMIZE.md "a record read and then
    refused weighs one record, no byte"): its bytes decoded to no record all the same. With
    the default bound (16 MiB) and fraction (0.5), 10 good lines and one 400 KB line of 2,000
    requests are "11 read = 10 exported + 1 rejected", and the night publishes 10 of its
    2,010 requests, exit 0. 99.5% of the input's bytes in no record must fail it."""
    good = [json.dumps(chat(i, 1_000 * i)) for i in range(10)]
    joined = "".join(json.dumps(chat(i, 1_000 * i + 500)) for i in range(2_000))
    source = tmp_path / "log.jsonl"
    source.write_text("\n".join(good) + "\n" + joined + "\n")
    out = tmp_path / "out"
    code = anonymize(tiny_tokenizer, [source], out, "--quiet")
    assert code != 0 and not (out / "manifest.json").exists()


@pytest.mark.xfail(strict=True, reason="red team round 15")
def test_a_json_array_file_beside_a_log_weighs_its_bytes(tiny_tokenizer, tmp_path):
    """The same rule, by the commonest careless shape: an export written as one JSON array
    (`json.dump(records, f)`: the whole file one line, well under 16 MiB) given beside a
    JSONL log. It is one not_an_object letter weighing one record, so 10 good lines and a
    2,000-request array are "11 read = 10 exported + 1 rejected" and the night publishes 10
    of its 2,010 requests, exit 0; the one-line hint kvtrace has for this shape (jq -c
    '.[]') is said only when the run fails. A file none of whose bytes became a record must
    weigh its bytes, as the same file over the bound does."""
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(chat(i, 1_000 * i)) + "\n" for i in range(10)))
    export = tmp_path / "export.jsonl"
    export.write_text(json.dumps([chat(i, 1_000 * i + 500) for i in range(2_000)]))
    out = tmp_path / "out"
    code = anonymize(tiny_tokenizer, [log, export], out, "--quiet")
    assert code != 0 and not (out / "manifest.json").exists()
