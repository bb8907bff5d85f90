"""The encode, write and id-map DoFns and PTransforms in TestPipelines on tiny fixtures."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from kvtrace.transforms.dead_letters import DEAD_LETTER_TAG
from kvtrace.transforms.encode.encode_requests import EncodeOptions
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.ids.dense_ids import FIRST, NUMBERED
from kvtrace.transforms.ids.segments import (
    SegmentFile,
    checksum,
    index_path,
    parquet_checksum,
    write_segment,
)
from kvtrace.transforms.read.records import ParseOptions, parse_record
from kvtrace.transforms.trace_format import NO_RESPONSE_MS
from kvtrace.transforms.write.rows import NO_SESSION, ROW, RowBatch

pytestmark = pytest.mark.beam  # imports Beam: its tests share one worker


def requests(*records):
    return [parse_record(json.dumps(r).encode(), "t.jsonl", ParseOptions()) for r in records]


def test_encode_requests_hashes_batches_and_dead_letters_template_errors(tiny_tokenizer):
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.transforms.encode.steps import EncodeRequests

    chat = {
        "timestamp": 1,
        "messages": [{"role": "user", "content": "hello world"}],
        "output": "the fox",
    }
    batch = requests(
        chat,
        {**chat, "timestamp": 2},
        {"timestamp": 3, "messages": [{"role": "developer", "content": "x"}]},
        {"timestamp": 4, "input_ids": [1, 2, 3, 4, 5]},
    )
    salt = SaltSource("random", inline=b"a-test-salt-of-enough-bytes-0123456789")

    def check(batches):
        (hashed,) = batches
        assert hashed.requests["timestamp_ms"].tolist() == [1, 2, 4]
        assert hashed.requests["output_length"].tolist() == [2, 2, 0]
        assert hashed.requests["num_blocks"].tolist()[2] == 2  # 5 tokens, blocks of 4
        first, second = hashed.block_hashes[:2], hashed.block_hashes[2:4]
        assert hashed.requests["num_blocks"][0] == 2 and (first == second).all()

    with TestPipeline() as pipeline:
        out = (
            pipeline
            | beam.Create([batch])
            | beam.ParDo(
                EncodeRequests(EncodeOptions(tiny_tokenizer, salt, block_size=4))
            ).with_outputs(DEAD_LETTER_TAG, main="hashed")
        )
        assert_that(out.hashed, check)
        assert_that(
            out[DEAD_LETTER_TAG] | beam.Map(lambda d: d.reason),
            equal_to(["template_error"]),
            label="Rejected",
        )


def test_encode_requests_instances_of_a_process_share_one_segment_cache(tiny_tokenizer):
    """A runner deserializes a DoFn once per thread: those copies share one cache (and its
    budget), as the threads of one Dataflow worker process would."""
    from kvtrace.transforms.encode.steps import EncodeRequests

    salt = SaltSource("random", inline=b"a-test-salt-of-enough-bytes-0123456789")
    dofn = EncodeRequests(
        EncodeOptions(tiny_tokenizer, salt, block_size=4, segment_cache_bytes=1 << 20)
    )
    copies = [pickle.loads(pickle.dumps(dofn)) for _ in range(2)]
    for copy in copies:
        copy.setup()
    try:
        assert copies[0]._segment_cache is copies[1]._segment_cache
        other = EncodeRequests(EncodeOptions(tiny_tokenizer, salt, block_size=4))  # another run's
        other.setup()
        assert other._segment_cache is not copies[0]._segment_cache
        other.teardown()
    finally:
        for copy in copies:
            copy.teardown()


def test_encode_requests_refusing_at_setup_outputs_its_line_once_per_bundle(tiny_tokenizer):
    """A worker whose tokenizer files are not the run's: with refuses (a batch job's), no raise
    (a remote runner would retry it), its one line out once per bundle and no batch encoded;
    without, raised as before (a stream's)."""
    import apache_beam as beam

    from kvtrace.transforms.encode.steps import EncodeRequests
    from kvtrace.transforms.errors import JobStopped
    from kvtrace.transforms.steps import REFUSED_TAG

    salt = SaltSource("random", inline=b"a-test-salt-of-enough-bytes-0123456789")
    options = EncodeOptions(
        tiny_tokenizer, salt, block_size=4, tokenizer_sha256={"tokenizer.json": "0" * 64}
    )
    dofn = EncodeRequests(options, refuses=True)
    dofn.setup()
    dofn.start_bundle()
    outputs = [out for batch in ([], []) for out in dofn.process(batch)]
    assert list(dofn.finish_bundle()) == []
    dofn.teardown()
    (refused,) = outputs
    assert isinstance(refused, beam.pvalue.TaggedOutput) and refused.tag == REFUSED_TAG
    assert refused.value.startswith(b"the tokenizer files of ")
    with pytest.raises(JobStopped, match="not the ones this run began with"):
        EncodeRequests(options).setup()


def test_write_shard_sorts_rows_and_writes_both_formats(tmp_path):
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.transforms.write.steps import WriteShard

    rows = np.zeros(2, dtype=ROW)
    rows["timestamp_ms"] = [1_000_500, 1_000_000]
    rows["input_length"], rows["output_length"] = [8, 4], [1, 2]
    rows["session_id"], rows["num_ids"] = [NO_SESSION, 0], [2, 1]
    rows["response_ms"] = NO_RESPONSE_MS
    batch = RowBatch(rows, np.array([0, 1, 0], dtype=np.int64))
    with TestPipeline() as pipeline:
        paths = (
            pipeline
            | beam.Create([(0, [batch, None])])
            | beam.ParDo(WriteShard(str(tmp_path)), np.array([0]), 1_000_000, object())
        )
        assert_that(
            paths | beam.MapTuple(lambda p, sha: (p.rsplit("/", 1)[1], len(sha))),
            equal_to([("trace-00000-of-00001.jsonl", 64), ("trace-00000-of-00001.parquet", 64)]),
        )
    lines = (tmp_path / "trace-00000-of-00001.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"timestamp": 0, "input_length": 4, "output_length": 2, "hash_ids": [0], "session": 0},
        {"timestamp": 500, "input_length": 8, "output_length": 1, "hash_ids": [0, 1]},
    ]


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_id_map_segments_written_and_read_back_by_shard(tmp_path):
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.transforms.ids.steps import ReadIdMap, WriteSegmentShard

    table = np.zeros(50, dtype=NUMBERED)
    table["hi"], table["lo"], table["id"] = np.arange(50), np.arange(50) * 7 + 3, np.arange(50)
    paths = [str(tmp_path / f"segments/000001-run1/blocks-0000{i}.parquet") for i in (0, 1)]
    with TestPipeline() as pipeline:
        written = (
            pipeline
            | "Shards"
            >> beam.Create(
                [(0, {"added": [table[:20]], "runs": []}), (1, {"added": [table[20:]], "runs": []})]
            )
            | beam.ParDo(WriteSegmentShard(str(tmp_path), 1, "run1", "blocks"))
        )
        assert_that(written | beam.Map(lambda segment: segment.path), equal_to(paths))
    files = [
        SegmentFile(
            path,
            parquet_checksum(Path(path).read_bytes()),
            checksum(Path(index_path(path)).read_bytes()),
        )
        for path in paths
    ]

    def check(parts):
        assert sorted(i for _, part in parts for i in part["id"].tolist()) == list(range(50))
        assert all((part["lo"] % 4 == shard).all() for shard, part in parts)

    with TestPipeline() as pipeline:
        assert_that(pipeline | ReadIdMap(files, shards=4), check)


def _firsts(keys: np.ndarray, ts: int = 5) -> np.ndarray:
    firsts = np.zeros(len(keys), dtype=FIRST)
    firsts["hi"], firsts["lo"], firsts["ts"] = keys["hi"], keys["lo"], ts
    return firsts


def test_look_up_shard_splits_tonights_keys_into_unseen_and_known(tmp_path):
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.transforms.ids.steps import LookUpShard

    mapped = np.zeros(3000, dtype=NUMBERED)
    mapped["hi"], mapped["lo"], mapped["id"] = (
        np.arange(3000) * 7919,
        np.arange(3000) * 2,
        np.arange(3000),
    )
    segment = write_segment(str(tmp_path / "blocks-00000.parquet"), [mapped])
    fresh = np.zeros(4, dtype=NUMBERED)
    fresh["hi"], fresh["lo"] = np.arange(4) * 7919 + 1, 2  # between the map's keys: not in it
    tonight = _firsts(np.concatenate([mapped[[10, 2500]], fresh]))
    with TestPipeline() as pipeline:
        split = (
            pipeline
            | beam.Create([(0, {"firsts": [tonight], "files": [segment]})])
            | beam.ParDo(LookUpShard()).with_outputs("known", main="unseen")
        )
        assert_that(
            split.unseen | beam.Map(lambda kv: sorted(kv[1]["hi"].tolist())),
            equal_to([sorted(fresh["hi"].tolist())]),
            label="unseen",
        )
        assert_that(
            split.known | beam.Map(lambda kv: sorted(kv[1]["id"].tolist())),
            equal_to([[10, 2500]]),
            label="known",
        )


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_split_known_carries_every_map_row_on_a_compaction_night():
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.transforms.ids.steps import SplitKnown

    mapped = np.zeros(3, dtype=NUMBERED)
    mapped["hi"], mapped["lo"], mapped["id"] = [1, 2, 3], [1, 2, 3], [7, 8, 9]
    fresh = np.zeros(1, dtype=NUMBERED)
    fresh["hi"], fresh["lo"] = 4, 4
    tonight = _firsts(np.concatenate([mapped[[1]], fresh]))
    with TestPipeline() as pipeline:
        split = (
            pipeline
            | beam.Create([(0, {"firsts": [tonight], "existing": [mapped]})])
            | beam.ParDo(SplitKnown()).with_outputs("known", "carried", main="unseen")
        )
        assert_that(
            split.unseen | beam.Map(lambda kv: kv[1]["hi"].tolist()),
            equal_to([[4]]),
            label="unseen",
        )
        assert_that(
            split.known | beam.Map(lambda kv: kv[1]["id"].tolist()), equal_to([[8]]), label="known"
        )
        assert_that(
            split.carried | beam.Map(lambda kv: kv[1]["id"].tolist()),
            equal_to([[7, 8, 9]]),
            label="carried",
        )


def test_a_folding_night_merges_a_shards_old_files_with_its_new_rows(tmp_path):
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.transforms.ids.steps import WriteSegmentShard

    old = np.zeros(3000, dtype=NUMBERED)
    old["hi"], old["lo"], old["id"] = np.arange(3000) * 7, np.arange(3000), np.arange(3000)
    new = np.zeros(10, dtype=NUMBERED)
    new["hi"], new["lo"], new["id"] = np.arange(10) * 7 + 3, 1, np.arange(3000, 3010)
    runs = [
        write_segment(str(tmp_path / "a.parquet"), [old[:1000]]),
        write_segment(str(tmp_path / "b.parquet"), [old[1000:]]),
    ]
    with TestPipeline() as pipeline:
        written = (
            pipeline
            | beam.Create([(5, {"added": [new], "runs": runs})])
            | beam.ParDo(WriteSegmentShard(str(tmp_path), 2, "run2", "blocks"))
        )
        assert_that(
            written | beam.Map(lambda segment: (segment.path, segment.rows)),
            equal_to([(str(tmp_path / "segments/000002-run2/blocks-00005.parquet"), 3010)]),
        )
    folded = tmp_path / "segments" / "000002-run2" / "blocks-00005.parquet"
    write_segment(str(tmp_path / "whole.parquet"), [old, new])
    assert folded.read_bytes() == (tmp_path / "whole.parquet").read_bytes()
