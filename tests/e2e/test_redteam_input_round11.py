"""Red team round 11, hostile input: reproducers of the holes found past the round-1..10 fixes
(test_redteam_input*.py). Each asserts the promised behaviour (a flag or an input kvtrace cannot
honour is a one-line error or a dead letter, never a run whose memory grows until the machine
runs out) and fails today (2026-11-27)."""

from __future__ import annotations

import shutil

import pytest

from helpers import KVTRACE, kvtrace_child, peak_rss_mb, read_jsonl, trace, write_jsonl

pytestmark = pytest.mark.slow

# The child's address space: far above what synthesize needs for the small trace below (its
# whole run peaks under 200 MB), far below what the machine holds, so a run that holds every
# drawn request ends here within seconds instead of meeting the OOM killer.
_ADDRESS_SPACE = 3 << 30


def test_an_absurd_num_requests_is_refused_in_one_line_not_run_out_of_memory(tmp_path):
    """docs/ANALYSIS.md: synthesize's knobs are bounded "so timestamps and lengths stay within
    their int64 columns" and out of range is "refused with one line before any work"; reshape
    refuses a request whose own part "would take N blocks". `--num-requests N` has no bound:
    synth/sample.sample_requests draws N rows into one Python list (each a copy of its source
    row's ids) before anything is written, so the local engine's memory grows with N until the
    machine runs out (a trace of two 20,000-id rows, N = 10^6: 2 x 10^10 ids, ~1 TB as Python
    lists; unbounded, a typo's extra zeros are an OOM kill with no line at all; here, under a
    3 GiB cap, "the job failed: MemoryError" after ~8 s, exit 1). The promise: refused in one
    line naming the flag (exit 2), as every other knob is."""
    ids = 20_000
    trace = write_jsonl(
        tmp_path / "trace.jsonl",
        [
            {
                "timestamp": row,
                "input_length": ids * 4,
                "output_length": 1,
                "hash_ids": list(range(row * ids, (row + 1) * ids)),
            }
            for row in range(2)
        ],
    )
    done = kvtrace_child(
        "synthesize",
        str(trace),
        "--block-size",
        "4",
        "-o",
        str(tmp_path / "out"),
        "--num-requests",
        "1000000",
        prelude=(
            "import resource; "
            f"resource.setrlimit(resource.RLIMIT_AS, ({_ADDRESS_SPACE}, {_ADDRESS_SPACE}))"
        ),
        timeout=120,
    )
    assert "MemoryError" not in done.stderr
    assert done.returncode == 2, done.stderr
    assert "--num-requests" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "out").exists()


def _chunked_log(path, list_type: str) -> None:
    """A Parquet log of one chat whose `response` holds two streamed chunks, each with its
    arrival time as timestamp[ns] (a digit of nanoseconds, as a ns clock writes), the chunks
    stored as a list (list_type "list") or, as Polars' Array type and numpy exports write one,
    a fixed-size list ("fixed")."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    start = 1_735_689_600_000
    chunk = pa.struct([("timestamp", pa.timestamp("ns")), ("text", pa.string())])
    chunks = pa.array(
        [
            {"timestamp": (start + 1_500) * 1_000_000 + 7, "text": "a"},
            {"timestamp": (start + 2_500) * 1_000_000 + 7, "text": "b"},
        ],
        type=chunk,
    )
    if list_type == "fixed":
        response = pa.FixedSizeListArray.from_arrays(chunks, 2)
    else:
        response = pa.ListArray.from_arrays(pa.array([0, 2], pa.int32()), chunks)
    messages = pa.array([[{"role": "user", "content": "hello"}]])
    # The generated count beside: chunks of no shape a reader reads say none (unread_response).
    columns = {"timestamp": pa.array([start]), "output_length": pa.array([2])}
    pq.write_table(pa.table({**columns, "messages": messages, "response": response}), path)


def _published_response_ms(tokenizer: str, log, out) -> tuple[list, list[str]]:
    """The response_ms of the rows a run of a worker without pandas publishes from log, and
    its letters' reasons."""
    done = kvtrace_child(
        "anonymize",
        "--input",
        str(log),
        "--output",
        str(out),
        "--tokenizer",
        tokenizer,
        "--block-size",
        "4",
        "--quiet",
        "--max-rejected-fraction",
        "1",
        prelude="import sys; sys.modules['pandas'] = None  # a worker without pandas",
        timeout=120,
    )
    letters = [
        row["error"]
        for path in sorted(out.parent.glob(f"{out.name}-rejected/rejected-*.jsonl"))
        for row in read_jsonl(path)
    ]
    rows = [row.get("response_ms") for row in trace(out)] if done.returncode == 0 else []
    return rows, letters


def test_parquet_times_in_a_fixed_size_list_are_read_from_storage(tiny_tokenizer, tmp_path):
    """paths.without_views: times are "read from their storage, never through the worker's
    packages" (UTC microseconds, nanoseconds floored), so a run is the same on a worker with
    pandas and one without. _plain_type (and sources._ns_kept) reach timestamps in lists,
    large lists, list views and structs only: in a fixed_size_list (a Polars Array column,
    restored by the file's ARROW:schema) a timestamp[ns] stays one, and to_pylist converts it
    through pandas when pandas imports, else refuses it. So the same Parquet log publishes a
    row (response_ms 2500) on a worker with pandas and is a malformed_record letter ("install
    pandas") on one without: the output depends on the worker's packages. The same chunks
    stored as a list read from storage either way (checked first: it passes today)."""
    _chunked_log(tmp_path / "list.parquet", "list")
    _chunked_log(tmp_path / "fixed.parquet", "fixed")
    as_list = _published_response_ms(tiny_tokenizer, tmp_path / "list.parquet", tmp_path / "a")
    assert as_list == ([2500], [])
    fixed = _published_response_ms(tiny_tokenizer, tmp_path / "fixed.parquet", tmp_path / "b")
    assert fixed == as_list


def test_a_namespace_holding_itself_is_refused_by_its_size_not_by_the_budget(
    tiny_tokenizer, tmp_path
):
    """bounded_sandbox.py: a value turned into text is "sized by walking what it holds" before
    it is printed, a container met again counted from its first walk; over the bound it is a
    ValueTooLarge template_error "that depends only on the template and the record, not on the
    machine's speed"; and render_budget.py: an overrun "never lands in code after the render".
    A template may set a namespace's attribute to the namespace itself (`{% set x.a = x %}`:
    the immutable sandbox forbids list.append, not namespace assignment), and `{{ x }}` then
    prints a few dozen characters in Jinja (repr's recursion guard). _text_length records a
    container as known only once its walk ends, so a cycle is walked again at every level: the
    walk pushes a frame per level for 5 s of CPU (~560 MB) until the watchdog stops it. The
    record's letter then says "went over the render budget", which depends on the machine's
    speed. Worse, the watchdog raises RenderOverrun again each tick until the render is left,
    and the first one's unwinding frees the walk's millions of frames (longer than a tick, as
    far as we can tell): the next lands in Watchdog.run's `except` or `finally`
    before _leave unregisters the render, and escapes run() bare (the letter then reads "the
    chat template went " and nothing more); the render never unregistered, every later tick
    lands in whatever the thread runs next: in 2 runs of 3 (`--processes 1`) encode_requests'
    thread start or the dead letters' close, a traceback, exit 1, nothing published (with
    workers, a worker's traceback at exit). The promise: the record is a template_error letter,
    decided by the value (a cycle printed, or refused, at once), the rest of the night
    published, no traceback. The peak asserted last fails on every run today, whichever way
    the overrun lands."""
    folder = tmp_path / "tokenizer"
    shutil.copytree(tiny_tokenizer, folder)
    (folder / "chat_template.jinja").write_text(
        '{% if messages[0].content == "odd" %}{% set x = namespace(a=1) %}{% set x.a = x %}'
        "{{ x }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    log = write_jsonl(
        tmp_path / "logs.jsonl",
        [
            {"timestamp": 1_735_689_600_000 + i, "messages": [{"role": "user", "content": text}]}
            for i, text in enumerate(["hi", "odd"])
        ],
    )
    out = tmp_path / "out"
    code, peak, stderr = peak_rss_mb(
        [
            *KVTRACE,
            "anonymize",
            "--input",
            str(log),
            "--output",
            str(out),
            "--tokenizer",
            str(folder),
            "--quiet",
            "--processes",
            "1",
            "--max-rejected-fraction",
            "1",
        ]
    )
    assert code == 0, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-2000:]
    letters = [
        row["error"]
        for path in sorted((tmp_path / "out-rejected").glob("rejected-*.jsonl"))
        for row in read_jsonl(path)
    ]
    # Fixed (f11) by printing the cycle as jinja's repr does (`<Namespace {...}>`, what the
    # serving engine's render holds), sized at once: both records published, no letter.
    assert letters == []
    assert [row["input_length"] for row in trace(out)][0] == 1
    assert len(trace(out)) == 2
    # A value of one namespace is sized at once: the run costs what a one-line run does (~100
    # MB), not the walk's ~560 MB of frames pushed until the budget's 5 s of CPU.
    assert peak < 300, peak
