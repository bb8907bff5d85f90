"""A stream's block hashes: each window's published as HASHES/KEY-window-*/ (KEY: the stream's
output's, as its letters are named) right after the window's trace (OUT/window-*/), naming it,
never one folder that every window overwrites."""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from kvtrace.pipelines.anonymize_config import AnonymizeConfig
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.encode.schemes import HashScheme
from kvtrace.transforms.write.publish import STAGING_MARK
from kvtrace.transforms.write.shards import BLOCK_HASHES_OUTPUT

pytestmark = pytest.mark.beam  # imports Beam: its tests share one worker

MINUTE = 60_000


def _request(ts: int, i: int) -> bytes:
    return json.dumps(
        {
            "timestamp": ts,
            "output_length": 3,
            "messages": [
                {"role": "user", "content": f"question {i} hello world prompt about caching"}
            ],
        }
    ).encode()


@pytest.mark.slow  # a streaming pipeline: ~10 s
def test_each_windows_hashes_are_published_beside_it_and_name_it(
    tiny_tokenizer, tmp_path, monkeypatch
):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
    from apache_beam.testing.test_stream import TestStream

    from kvtrace.pipelines.anonymize_streaming import StreamingConfig, build

    monkeypatch.setenv("KVTRACE_SALT", "a-streaming-test-salt-0123456789abcdef")
    output, hashes = tmp_path / "stream", tmp_path / "hashes"
    output.mkdir()
    (tmp_path / "staging").mkdir()
    job = AnonymizeConfig(
        inputs=(),
        output=str(output),
        staging=str(tmp_path / "staging"),
        tokenizer=tiny_tokenizer,
        salt=SaltSource("env", "KVTRACE_SALT"),
        dead_letter=str(tmp_path / "stream-rejected"),
        block_size=4,
        hash_scheme=HashScheme("dynamo"),
        block_hashes=str(hashes),
    )
    config = StreamingConfig(job, "pubsub:projects/p/subscriptions/s", MINUTE, 0, 3_600_000)
    arrived = int(time.time()) + 120
    stream = (
        TestStream()
        .add_elements([_request(20_000 * i, i) for i in range(3)])  # window 0
        .advance_watermark_to(arrived)
        .add_elements([_request(MINUTE + 20_000 * i, i) for i in range(2)])  # window 1
        .advance_watermark_to_infinity()
    )
    with beam.Pipeline(
        runner=BundleBasedDirectRunner(), options=PipelineOptions(["--streaming"])
    ) as pipeline:
        build(pipeline | stream, config)
    windows = sorted(p.name for p in output.iterdir() if p.is_dir())
    assert len(windows) == 2
    # Named by the stream's output and the window, as its letters are: no leftover staging.
    assert sorted(p.name for p in hashes.iterdir()) == [config.run_name(w) for w in windows]
    for window in windows:
        assert sorted(p.name for p in (hashes / config.run_name(window)).iterdir()) == [
            "block-hashes-00000-of-00001.parquet",
            BLOCK_HASHES_OUTPUT,
        ]
        digest, name = (hashes / config.run_name(window) / BLOCK_HASHES_OUTPUT).read_text().split()
        assert hashlib.sha256((output / window / name).read_bytes()).hexdigest() == digest
    assert not list(tmp_path.rglob(f"*{STAGING_MARK}*"))
    for path in (hashes, *hashes.rglob("*")):
        assert path.stat().st_mode & 0o077 == 0, path
