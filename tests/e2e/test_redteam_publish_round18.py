"""Red team round 18, the gate's publishing side (nothing private published; the audit fails
closed, and passes what kvtrace itself writes): reproducers of what anonymize publishes and
`kvtrace audit` refuses. Each asserts the promised behaviour, so each fails until it is fixed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import anonymize, chat, dynamo_request_end, kvtrace_token_ids, write_jsonl
from kvtrace.cli import main
from kvtrace.transforms.trace_format import MAX_BLOCK_SIZE

pytestmark = pytest.mark.slow


def _audited(folder: Path, tokenizer: str, capsys) -> tuple[int, list[str]]:
    """audit's exit code and flags on folder, as the run was given (no option but the tokenizer)."""
    report = folder.parent / "audit.json"
    code = main(["audit", str(folder), "--tokenizer", tokenizer, "--json", str(report)])
    capsys.readouterr()
    return code, json.loads(report.read_text())["flags"]


@pytest.mark.parametrize("log", [b"", b"\n\n"], ids=["empty", "blank-lines"])
def test_a_night_of_no_records_is_refused_by_anonymize_or_passed_by_audit(
    tiny_tokenizer, tmp_path, capsys, log
):
    """What anonymize publishes, the audit passes (AUDIT.md: "passes only what kvtrace itself
    writes"). A night whose log holds no record at all (a quiet night's empty file) exits 0 and
    publishes a whole folder (manifest `records.exported: 0`, stats of zeros, empty shards);
    `kvtrace audit` of it, given the run's own options, refuses it: "no trace rows: nothing to
    publish, or not a kvtrace output". A nightly job that gates on the audit stops on kvtrace's
    own output. A night whose every record is rejected already fails (ANONYMIZE.md: "nothing to
    publish"); a night of none read must agree with one or the other: anonymize fails it the
    same way (exit 1, no folder), or the audit passes the folder it wrote."""
    src = tmp_path / "in.jsonl"
    src.write_bytes(log)
    out = tmp_path / "out"
    code = anonymize(tiny_tokenizer, [src], out, "--quiet")
    capsys.readouterr()
    if code != 0:
        assert not out.exists()
        return
    assert _audited(out, tiny_tokenizer, capsys) == (0, [])


def _rounded_past_the_range(tokenizer: str, folder: Path, field: str) -> tuple[Path, list[str]]:
    """A log of five requests, one whose `field` is 2^31 - 1 (the largest the reader takes), and
    the run's rounding options: output lengths rounded to 1000 (a chat log), or response times
    to 1000 ms with the timestamps (a Dynamo request trace, whose response time is its
    request_end's event time less its receipt)."""
    records = [chat(i, 1_000 * i) for i in range(5)]
    if field == "output_length":
        records[1]["output_length"] = 2**31 - 1
        options = ["--block-size", "1024", "--length-granularity", "1000"]  # a step within a block
        return write_jsonl(folder / "in.jsonl", records), options
    ids = kvtrace_token_ids(tokenizer, records)
    captured = [dynamo_request_end(r["timestamp"], t, 4, 3) for r, t in zip(records, ids)]
    captured[1]["event_time_unix_ms"] = captured[1]["request"]["request_received_ms"] + 2**31 - 1
    options = ["--capture", "dynamo-request-trace", "--block-size", "4"]
    return write_jsonl(folder / "in.jsonl", captured), [
        *options,
        "--timestamp-granularity-ms",
        "1000",
    ]


@pytest.mark.parametrize("field", ["output_length", "response_ms"])
def test_a_value_rounded_up_past_the_published_range_is_not_published(
    tiny_tokenizer, tmp_path, capsys, field
):
    """What anonymize publishes, the audit passes. The reader takes a count up to 2^31 - 1
    (records.MAX_COUNT, the published range trace_format.MAX_OUTPUT_LENGTH and MAX_RESPONSE_MS);
    coarsen.round_to then rounds half up with no bound, so 2^31 - 1 at a step of 1000 is
    published as 2,147,484,000, outside the range the audit holds every row to: anonymize exits
    0 and `kvtrace audit`, given the run's own options, flags the whole night ("integers outside
    [0, 2147483647]"). Promised: the row published within the range (rounded down at the bound,
    or the record a dead letter), and the folder passes."""
    src, options = _rounded_past_the_range(tiny_tokenizer, tmp_path, field)
    out = tmp_path / "out"
    run = ["anonymize", "--input", str(src), "--output", str(out), "--quiet", *options]
    tokenizer = [] if field == "response_ms" else ["--tokenizer", tiny_tokenizer]  # a capture's
    assert main([*run, *tokenizer]) == 0
    capsys.readouterr()
    report = tmp_path / "audit.json"
    assert main(["audit", str(out), "--json", str(report), *tokenizer, *options]) == 0, json.loads(
        report.read_text()
    )["flags"]


@pytest.mark.parametrize(
    "options",
    [
        # the largest length step: the largest block (coarsen.granularity_problem), a length
        # of 2^31 - 1 rounding down to the last multiple within the range
        ("--block-size", str(MAX_BLOCK_SIZE), "--length-granularity", str(MAX_BLOCK_SIZE)),
        ("--timestamp-granularity-ms", str(2**40 - 1)),
    ],
)
def test_a_granularity_the_cli_takes_publishes_what_the_audit_passes(
    tiny_tokenizer, tmp_path, capsys, options
):
    """Any step the CLI accepts, up to the manifest schema's largest, publishes rows within
    their ranges (a length rounded within [0, 2^31 - 1], never up to the step) and a manifest
    the audit takes."""
    records = [chat(i, 1_000 * i) for i in range(5)]
    records[1]["output_length"] = 2**31 - 1
    src = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, [src], out, "--quiet", *options) == 0
    capsys.readouterr()
    report = tmp_path / "audit.json"
    audit = ["audit", str(out), "--json", str(report), "--tokenizer", tiny_tokenizer]
    assert main([*audit, *options]) == 0, json.loads(report.read_text())["flags"]


@pytest.mark.parametrize(
    "option, highest",
    [("--length-granularity", 2**31 - 1), ("--timestamp-granularity-ms", 2**40 - 1)],
)
def test_a_granularity_past_the_manifest_schema_is_refused_in_one_line(
    tiny_tokenizer, tmp_path, capsys, option, highest
):
    """A step past what the manifest's granularity may hold (the audit would refuse it; a
    length step past the longest length would round every length to 0): the CLI refuses it
    before reading, naming the option and its range, and writes nothing."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0)])
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, [src], out, option, str(highest + 1)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{option} must be a whole number in [1, {highest}]" in err[0]
    assert not out.exists()
