"""Red team round 3: privacy and precision beyond the gate's byte checks (what kvtrace itself
writes: stream windows, cumulative.json). Each test asserts the promised behaviour, so each
fails until it is fixed."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow
HOUR = 3_600_000


def test_stream_windows_cut_finer_than_the_published_times(tmp_path):
    """A stream cuts windows by flooring raw times from the zero (by_window) but publishes each
    row's time rounded half up (coarsen.round_to). With --timestamp-granularity-ms 3600000 and
    the default 1 h windows, requests 45 and 75 min after the zero both publish 3600000, yet
    land in window-000000 and window-000001: which folder a row is in says whether it came
    before or after the 60th minute, half a granule finer than its time (and with --window
    10m, which 10 minutes of the hour: nothing ties --window to the granularity). The batch
    job keeps one published time in one shard (docs/ORDERING.md); concatenated, the windows
    may differ from the batch bytes (rows of one time ordered by raw window, not the tie key)."""
    from kvtrace.pipelines.anonymize_streaming import by_window
    from kvtrace.transforms.encode.hashed_batch import HashedBatch, HashedRequest
    from kvtrace.transforms.write.coarsen import Coarsening, round_to

    zero = 1_767_225_600_000
    raw = [zero, zero + 45 * 60_000, zero + 75 * 60_000]
    published = round_to(np.array(raw, np.int64) - zero, HOUR).tolist()
    assert published == [0, HOUR, HOUR]
    batch = HashedBatch.pack([HashedRequest(ts, i, 1, 1, b"", None) for i, ts in enumerate(raw)])
    window_of = {
        ts: start
        for start, part in by_window(batch, zero, HOUR, Coarsening(HOUR))
        for ts in part.requests["timestamp_ms"].tolist()
    }
    assert window_of[raw[1]] == window_of[raw[2]], (
        "rows of one published time in two windows: the cut publishes the finer time"
    )


def test_cumulative_json_publishes_the_rejected_count_the_manifest_stopped_publishing(tmp_path):
    """Round 2 reduced the manifest's records to `exported` ("only counts the rows prove; the
    run's others are the operator's, never published": write/manifest.RUN_COUNTS). A stream's
    cumulative.json, written into the same --output beside the windows, still publishes
    `rejected` (every dead letter: malformed, late, oversize requests), a count no row proves,
    and no audit ever reads the file (auditing the stream's folder skipped it). Now the count is
    the operator's (run-counts.json beside the stream's letters) and the audit checks the file
    against the windows (tests/transforms/stats/test_audit_stream_totals.py)."""
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
    config = StreamingConfig(job, "pubsub:projects/p/subscriptions/s")
    summary = cumulative_summary(
        config, Progress(origin_ms=0, published_ms=0, windows=1, rows=5, rejected=3)
    )
    assert "rejected" not in summary, summary
