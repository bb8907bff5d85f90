"""The Encode composite in a TestPipeline: the pure encoder's batches and dead letters, with the
input's timestamp kind kept in a batch run and left to the windows in a stream."""

from __future__ import annotations

import json

import pytest

from helpers import chat
from kvtrace.transforms.dead_letters import DEAD_LETTER_TAG
from kvtrace.transforms.encode.encode_requests import EncodeOptions, open_encoder
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.encode.timestamp_kinds import TIMESTAMP_KIND_MISMATCH
from kvtrace.transforms.read.records import parse_record

pytestmark = pytest.mark.beam  # imports Beam: its tests share one worker

EPOCH_MS = 1_700_000_000_000
SALT = SaltSource("random", inline=b"a-test-salt-of-enough-bytes-0123456789")
TEMPLATE_ERROR = {"timestamp": EPOCH_MS + 9, "messages": [{"role": "developer", "content": "x"}]}


def requests() -> list:
    records = [chat(i, EPOCH_MS + 1_000 * i) for i in range(5)] + [chat(7, 5), TEMPLATE_ERROR]
    return [parse_record(json.dumps(r).encode(), "in.jsonl") for r in records]


def rows(batch) -> list[tuple[int, int, tuple[int, ...]]]:
    """Each request's timestamp, input length and block hashes, whatever the batching."""
    starts = batch.requests["num_blocks"].cumsum() - batch.requests["num_blocks"]
    return [
        (
            int(r["timestamp_ms"]),
            int(r["input_length"]),
            tuple(batch.block_hashes[start : start + r["num_blocks"]].ravel().tolist()),
        )
        for r, start in zip(batch.requests, starts)
    ]


def encoded_rows(tiny_tokenizer) -> tuple[EncodeOptions, list]:
    """The options, and the rows the pure encoder gives (the template error is its letter too)."""
    options = EncodeOptions(tiny_tokenizer, SALT, block_size=4)
    hashed, letters = open_encoder(options).encode(requests())
    assert [letter.reason for letter in letters] == ["template_error"]
    return options, rows(hashed)


def check_encode(
    options: EncodeOptions, one_timestamp_kind: bool, kept: list, reasons: list[str]
) -> None:
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.transforms.encode.steps import Encode

    with TestPipeline() as pipeline:
        encoded = (
            pipeline
            | beam.Create(requests())
            | Encode(options, one_timestamp_kind=one_timestamp_kind)
        )
        assert_that(encoded["hashed"] | "Rows" >> beam.FlatMap(rows), equal_to(kept))
        assert_that(
            encoded[DEAD_LETTER_TAG] | "Reasons" >> beam.Map(lambda letter: letter.reason),
            equal_to(reasons),
            label="Letters",
        )


@pytest.mark.slow  # over a second: .ci/run runs the slow set (the streaming tests run Encode)
def test_encode_in_a_stream_gives_the_encoders_batches_and_leaves_timestamps_alone(tiny_tokenizer):
    options, expected = encoded_rows(tiny_tokenizer)
    check_encode(options, False, expected, ["template_error"])


def test_encode_in_a_batch_run_keeps_the_inputs_timestamp_kind(tiny_tokenizer):
    options, expected = encoded_rows(tiny_tokenizer)
    check_encode(
        options,
        True,
        [row for row in expected if row[0] >= EPOCH_MS],
        ["template_error", TIMESTAMP_KIND_MISMATCH],
    )


def test_a_worker_whose_backend_or_cache_disagreed_is_refused_never_retried():
    """A Beam worker cannot take back batches it emitted before the difference: the night is
    refused with the one-line way out, as a refusal (an error a remote runner would retry)."""
    from types import SimpleNamespace

    from kvtrace.transforms.encode.steps import _refuse_unrepeatable
    from kvtrace.transforms.errors import JobStopped

    _refuse_unrepeatable(SimpleNamespace(backend_fallback=None, cache_mismatch=None))
    with pytest.raises(JobStopped, match="--tokenizer-backend tokenizers"):
        _refuse_unrepeatable(
            SimpleNamespace(backend_fallback="a sampled text differed", cache_mismatch=None)
        )
    with pytest.raises(JobStopped, match="segment cache disagreed.*--segment-cache-mb 0$"):
        _refuse_unrepeatable(
            SimpleNamespace(backend_fallback=None, cache_mismatch="a sampled text differed")
        )


def test_a_batch_jobs_worker_outputs_the_disagreement_as_its_refusal(tiny_tokenizer, monkeypatch):
    """With refuses (a batch job's), the difference is the bundle's one refusal output, once,
    whether found pushing a batch or flushing the last; nothing is raised."""
    import apache_beam as beam

    from kvtrace.transforms.encode.steps import EncodeRequests
    from kvtrace.transforms.steps import REFUSED_TAG

    dofn = EncodeRequests(EncodeOptions(tiny_tokenizer, SALT, block_size=4), refuses=True)
    dofn.setup()
    monkeypatch.setattr(
        type(dofn._encoder), "cache_mismatch", property(lambda _: "a sampled text differed")
    )
    try:
        dofn.start_bundle()
        outputs = [out for batch in (requests(), requests()) for out in dofn.process(batch)]
        outputs += list(dofn.finish_bundle())
    finally:
        dofn.teardown()
    (refused,) = outputs
    assert isinstance(refused, beam.pvalue.TaggedOutput) and refused.tag == REFUSED_TAG
    assert refused.value.endswith(b"run again with --segment-cache-mb 0")
