"""The encode, write and id-map DoFns and PTransforms in TestPipelines on tiny fixtures."""

from __future__ import annotations

import json

import apache_beam as beam
import numpy as np
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from transforms.dead_letters import DEAD_LETTER_TAG
from transforms.encode.steps import EncodeRequests
from transforms.encode.salt import SaltSource
from transforms.ids.steps import ReadIdMap, WriteSegmentShard
from transforms.ids.dense_ids import NUMBERED
from transforms.read.records import ParseOptions, parse_record
from transforms.write.rows import NO_SESSION, ROW, RowBatch
from transforms.write.steps import WriteShard


def requests(*records):
    return [parse_record(json.dumps(r).encode(), "t.jsonl", ParseOptions()) for r in records]


def test_encode_requests_hashes_batches_and_dead_letters_template_errors(tiny_tokenizer):
    chat = {"timestamp": 1, "messages": [{"role": "user", "content": "hello world"}], "output": "the fox"}
    batch = requests(chat, {**chat, "timestamp": 2},
                     {"timestamp": 3, "messages": [{"role": "developer", "content": "x"}]},
                     {"timestamp": 4, "input_ids": [1, 2, 3, 4, 5]})
    salt = SaltSource("random", inline=b"a-test-salt-of-enough-bytes-0123456789")

    def check(batches):
        (hashed,) = batches
        assert hashed.requests["timestamp_ms"].tolist() == [1, 2, 4]
        assert hashed.requests["output_length"].tolist() == [2, 2, 0]
        assert hashed.requests["num_blocks"].tolist()[2] == 2  # 5 tokens, blocks of 4
        first, second = hashed.block_hashes[:2], hashed.block_hashes[2:4]
        assert hashed.requests["num_blocks"][0] == 2 and (first == second).all()

    with TestPipeline() as pipeline:
        out = (pipeline | beam.Create([batch])
               | beam.ParDo(EncodeRequests(tiny_tokenizer, 4, salt, {})).with_outputs(
                   DEAD_LETTER_TAG, main="hashed"))
        assert_that(out.hashed, check)
        assert_that(out[DEAD_LETTER_TAG] | beam.Map(lambda d: d.reason),
                    equal_to(["template_error"]), label="Rejected")


def test_write_shard_sorts_rows_and_writes_both_formats(tmp_path):
    rows = np.zeros(2, dtype=ROW)
    rows["timestamp_ms"] = [1_000_500, 1_000_000]
    rows["input_length"], rows["output_length"] = [8, 4], [1, 2]
    rows["session_id"], rows["num_ids"] = [NO_SESSION, 0], [2, 1]
    batch = RowBatch(rows, np.array([0, 1, 0], dtype=np.int64))
    with TestPipeline() as pipeline:
        paths = (pipeline | beam.Create([(0, [batch, None])])
                 | beam.ParDo(WriteShard(str(tmp_path)), {0: 0}, 1_000_000, object()))
        assert_that(paths | beam.Map(lambda p: p.rsplit("/", 1)[1]),
                    equal_to(["trace-00000-of-00001.jsonl", "trace-00000-of-00001.parquet"]))
    lines = (tmp_path / "trace-00000-of-00001.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"timestamp": 0, "input_length": 4, "output_length": 2, "hash_ids": [0], "session": 0},
        {"timestamp": 500, "input_length": 8, "output_length": 1, "hash_ids": [0, 1]}]


def test_id_map_segments_written_and_read_back_by_shard(tmp_path):
    table = np.zeros(50, dtype=NUMBERED)
    table["hi"], table["lo"], table["id"] = np.arange(50), np.arange(50) * 7 + 3, np.arange(50)
    with TestPipeline() as pipeline:
        written = (pipeline | "Shards" >> beam.Create([(0, [table[:20]]), (1, [table[20:]])])
                   | beam.ParDo(WriteSegmentShard(str(tmp_path), 1, "run1", "blocks")))
        assert_that(written, equal_to(["segments/000001-run1/blocks-00000.parquet",
                                       "segments/000001-run1/blocks-00001.parquet"]))
    files = ["segments/000001-run1/blocks-00000.parquet", "segments/000001-run1/blocks-00001.parquet"]

    def check(parts):
        assert sorted(i for _, part in parts for i in part["id"].tolist()) == list(range(50))
        assert all((part["lo"] % 4 == shard).all() for shard, part in parts)

    with TestPipeline() as pipeline:
        assert_that(pipeline | ReadIdMap(str(tmp_path), files, shards=4), check)
