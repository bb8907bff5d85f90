"""Red team round 15, hostile input: reproducers of the holes found past the round-1..14 fixes
(test_redteam_input*.py). Each asserts the promised behaviour (bad input: a one-line error or a
dead letter saying why, never a crash, a hang or memory that grows without bound; nothing lost
past --max-rejected-fraction) and fails today (2026-11-28)."""

from __future__ import annotations

import json

import pytest

from helpers import anonymize, chat, kvtrace_child

pytestmark = pytest.mark.slow

# logrotate's copytruncate as the run reads: the log cut to its first tenth once its ranges are
# planned (sized) and before they are read, at a line's end.
COPYTRUNCATE = """
import os
from kvtrace.transforms.read import sources
_open_stream = sources.open_stream
def _rotated(path):
    if path.endswith("live.jsonl") and not os.path.exists(path + ".rotated"):
        open(path + ".rotated", "w").close()
        with open(path, "r+b") as log:
            data = log.read()
            log.truncate(data.index(b"\\n", len(data) // 10) + 1)
    return _open_stream(path)
sources.open_stream = _rotated
"""


def test_a_line_of_many_records_under_the_record_bound_weighs_its_bytes(tiny_tokenizer, tmp_path):
    """Round 14 made a line refused unread (over --max-record-bytes) weigh its bytes in
    --max-rejected-fraction (sources._oversized): "a writer that left out the newlines". The
    same line under the bound is read, is not JSON, and is one invalid_json letter weighing
    one record and no byte (records.load_json_line; docs/ANONYMIZE.md "a record read and then
    refused weighs one record, no byte"): its bytes decoded to no record all the same. With
    the default bound (16 MiB) and fraction (0.5), 10 good lines and one 400 KB line of 2,000
    requests are "11 read = 10 exported + 1 rejected", and the night publishes 10 of its
    2,010 requests, exit 0; the letter keeps the line's first 256 KiB only
    (dead_letters.LETTER_LINE_BYTES: its size and sha256 for the rest), so ~700 of the
    requests are in no file at all. 99.5% of the input's bytes in no record must fail it."""
    good = [json.dumps(chat(i, 1_000 * i)) for i in range(10)]
    joined = "".join(json.dumps(chat(i, 1_000 * i + 500)) for i in range(2_000))
    source = tmp_path / "log.jsonl"
    source.write_text("\n".join(good) + "\n" + joined + "\n")
    out = tmp_path / "out"
    code = anonymize(tiny_tokenizer, [source], out, "--quiet")
    assert code != 0 and not (out / "manifest.json").exists()


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


def test_synthesize_of_a_trace_with_ids_near_int64_is_no_unanticipated_failure(tmp_path):
    """The trace readers take other Mooncake traces' 64-bit ids (trace_io.HIGHEST: any id
    below 2^63; analyze, reuse, simulate, render and export all read this trace), but
    synthesize numbers fresh blocks from the largest id on (synth/sample.py
    `next_id = max + 1`) into an int64 array: one id of 2^63 - 1 ends the run in the CLI's
    catch-all, "the job failed: OverflowError: Python int too large to convert to C long",
    the message kept for bugs, naming neither the trace nor its ids. A trace the readers
    accept must synthesize, or be refused in one line saying why."""
    rows = [
        {"timestamp": 0, "input_length": 9, "output_length": 3, "hash_ids": [0]},
        {"timestamp": 1000, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]},
        {"timestamp": 2000, "input_length": 600, "output_length": 3, "hash_ids": [2**63 - 1, 0]},
        {"timestamp": 3000, "input_length": 9, "output_length": 3, "hash_ids": [0]},
    ]
    source = tmp_path / "trace.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "synth"
    run = kvtrace_child("synthesize", str(source), "-o", str(out), "--num-requests", "10")
    assert "the job failed" not in run.stderr and "OverflowError" not in run.stderr


@pytest.mark.parametrize("engine", ["local", "beam"])
def test_a_log_cut_short_as_it_is_read_loses_no_record_silently(tiny_tokenizer, tmp_path, engine):
    """Nothing lost: a compressed log that ends before its end is a damaged_file letter
    weighing its unread bytes (sources._damaged_tail, unread_bytes). A plain log is planned
    in byte ranges from its size (sources.file_ranges) and read by paths.read_lines, which
    simply stops at the end of the file, wherever the range said it ends. A live log cut
    as the run reads it (logrotate's copytruncate, run between the plan and the read) loses
    89 of its 100 requests with no letter and no byte weighed: "exported 11 of 11
    records", the progress at "100% 19.9kB of 19.9kB", exit 0. A range that ends short of
    its planned end must be a letter weighing what it did not read."""
    log = tmp_path / "live.jsonl"
    log.write_text("".join(json.dumps(chat(i, 1_000 * i)) + "\n" for i in range(100)))
    out = tmp_path / "out"
    run = kvtrace_child(
        "anonymize", "--input", str(log), "--output", str(out), "--tokenizer", tiny_tokenizer,
        "--quiet", "--engine", engine, prelude=COPYTRUNCATE,
    )  # fmt: skip
    assert log.stat().st_size < 3_000  # the cut happened
    assert run.returncode != 0 and not (out / "manifest.json").exists()
