"""Red team round 2: privacy and precision beyond the gate's byte checks (streaming's published
figures, time, determinism)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

HOUR = 3_600_000


def test_cumulative_json_publishes_the_first_requests_time_within_the_hour(tmp_path):
    """Streaming windows start on epoch multiples of --window-ms (by_window: ts // W * W), and
    cumulative.json's published_until_ms is the last window's end minus the trace's zero: so
    (-published_until_ms) mod W is the zero's epoch mod W. With the defaults (1 h windows, 1 ms
    granularity) the first request's minute, second and millisecond are published exactly, and
    with them every row's wall-clock time within the hour; docs/STREAMING.md promises "the zero's
    epoch is never published"."""
    from kvtrace.pipelines.anonymize_config import AnonymizeConfig
    from kvtrace.pipelines.anonymize_streaming import Progress, StreamingConfig, cumulative_summary
    from kvtrace.transforms.encode.salt import SaltSource

    job = AnonymizeConfig(
        inputs=(),
        output=str(tmp_path / "stream"),
        staging=str(tmp_path / "staging"),
        tokenizer="x",
        salt=SaltSource("env", "KVTRACE_SALT"),
        dead_letter=str(tmp_path / "rejected"),
        block_size=4,
    )
    config = StreamingConfig(job, "pubsub:projects/p/subscriptions/s")  # default 1 h windows
    origin = 1_767_225_600_000 + 37 * 60_000 + 12_345  # 2026-01-01 00:37:12.345
    window = origin // HOUR * HOUR
    summary = cumulative_summary(
        config, Progress(origin_ms=origin, published_ms=window, windows=1, rows=1)
    )
    recovered = -summary["published_until_ms"] % HOUR
    assert recovered != origin % HOUR, "the zero's minute:second.ms within the hour is published"


def test_row_order_within_a_coarse_timestamp_publishes_the_finer_order(tiny_tokenizer, tmp_path):
    """--timestamp-granularity-ms 1000 rounds two requests 200 ms apart to the same published
    time, yet the rows (and the block ids numbered in their order) still follow the raw
    timestamps: which of the two came first, sub-granularity precision, is published. Two logs
    that differ only within a granule must give the same bytes (with an hour's granularity the
    whole order within each hour is published)."""
    from helpers import anonymize, chat, write_jsonl

    (tmp_path / "salt").write_bytes(b"k" * 32)
    start = 1_700_000_000_000
    published = []
    for first, second in ((100, 300), (300, 100)):
        a, b = chat(1, start + first, rotate=0), chat(5, start + second, rotate=2)
        log = write_jsonl(tmp_path / f"log-{first}.jsonl", [a, b, chat(2, start + 5000, rotate=1)])
        out = tmp_path / f"out-{first}"
        assert (
            anonymize(
                tiny_tokenizer,
                [log],
                out,
                "--block-size",
                "4",
                "--salt-file",
                str(tmp_path / "salt"),
                "--timestamp-granularity-ms",
                "1000",
            )
            == 0
        )
        published.append((out / "trace-00000-of-00001.jsonl").read_bytes())
    assert published[0] == published[1]


def test_an_id_map_begun_on_relative_times_publishes_a_later_nights_epoch(tiny_tokenizer, tmp_path):
    """Within one input a relative time among epoch dates is a dead letter
    (timestamp_kind_mismatch), but an id map keeps only its origin, not its kind: a map begun on
    a replay log's relative offsets (5 s) and extended by a night of epoch dates publishes that
    night's wall-clock time (1699999995000: the epoch ms minus 5 s) as every timestamp. Exit 0,
    the folder written; only the gate's 2^40 bound stops it from being published."""
    from helpers import anonymize, chat, write_jsonl

    (tmp_path / "salt").write_bytes(b"k" * 32)
    mapped = (
        "--id-map",
        str(tmp_path / "map"),
        "--salt-file",
        str(tmp_path / "salt"),
        "--block-size",
        "4",
    )
    replay = write_jsonl(tmp_path / "replay.jsonl", [chat(i, 5_000 + 1_000 * i) for i in range(4)])
    dated = write_jsonl(
        tmp_path / "dated.jsonl", [chat(i, 1_700_000_000_000 + 1_000 * i) for i in range(4)]
    )
    assert anonymize(tiny_tokenizer, [replay], tmp_path / "night1", *mapped) == 0
    code = anonymize(tiny_tokenizer, [dated], tmp_path / "night2", *mapped)
    shard = tmp_path / "night2" / "trace-00000-of-00001.jsonl"
    published = shard.read_text() if code == 0 and shard.exists() else ""
    assert "16999999" not in published, published[:200]
