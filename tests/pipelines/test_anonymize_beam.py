"""The Beam pipeline's dead letters: staged where they are made, merged into one file whose
bytes do not depend on the order Beam hands them over in; its night's steps against the
night's functions."""

from __future__ import annotations

import random

import pytest
from test_anonymize_night import BLOCK_SIZE, SALT, night, request

from kvtrace.pipelines.anonymize_config import AnonymizeConfig
from kvtrace.pipelines.anonymize_night import kind_keys, number_ids
from kvtrace.transforms.combiners import fold
from kvtrace.transforms.dead_letters import DeadLetter, StagedLetters, merge_runs
from kvtrace.transforms.encode.hashed_batch import HashedBatch
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.write.rows import request_room
from kvtrace.transforms.write.shards import shard_plan

pytestmark = pytest.mark.beam  # imports Beam: its tests share one worker

LETTERS = [
    DeadLetter(f"in-{i % 3}.jsonl", b"\x01" * (i % 11), "invalid_json", f"line {i}")
    for i in range(500)
]


def merged(folder, letters: list[DeadLetter]) -> bytes:
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.pipelines.anonymize_beam import StageLetters

    path = str(folder / "rejected.jsonl")
    with TestPipeline() as pipeline:
        staged = (
            pipeline
            | beam.Create(letters, reshuffle=True)
            | beam.ParDo(StageLetters(str(folder)))
            | beam.CombineGlobally(lambda parts: sum(parts, StagedLetters()))
        )
        written = (
            pipeline
            | "Path" >> beam.Create([path])
            | beam.Map(merge_runs, beam.pvalue.AsSingleton(staged))
        )
        assert_that(written, equal_to([path]))
        assert_that(
            staged | beam.Map(lambda s: s.tally.count), equal_to([len(letters)]), label="Counted"
        )
    return (folder / "rejected.jsonl").read_bytes()


def test_the_letters_file_is_the_same_bytes_whatever_the_order(tmp_path):
    """Handed over shuffled and reshuffled, written as runs per bundle: the file is every
    letter's line, sorted, and nothing else is left in the folder."""
    shuffled = LETTERS[:]
    random.Random(7).shuffle(shuffled)
    expected = b"".join(sorted(letter.to_json().encode() + b"\n" for letter in LETTERS))
    assert merged(tmp_path, shuffled) == expected
    assert [p.name for p in tmp_path.iterdir()] == ["rejected.jsonl"]  # no run left behind


@pytest.mark.slow  # over a second (two id assignments): .ci/run runs the slow set
def test_the_night_steps_on_beam_give_what_the_nights_functions_give(tmp_path):
    """NumberIds and PlanShards (the Beam steps of anonymize_night's number_ids and the plan of
    its write_shards): the same unique totals and new ids per kind, the same shard plan."""
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.pipelines.anonymize_beam import NumberIds, PlanShards

    job = AnonymizeConfig(
        inputs=(),
        output=str(tmp_path / "out"),
        staging=str(tmp_path / "staging"),
        tokenizer="owner/model",
        salt=SaltSource("random", inline=SALT),
        dead_letter=str(tmp_path),
        block_size=BLOCK_SIZE,
    )
    parts = [
        night(request(1_000, [1, 2, 3, 4], b"s" * 16), request(70_000, [1, 2, 5])),
        night(request(500, [1, 2, 3, 4, 6, 6], b"t" * 16)),
    ]
    whole = HashedBatch.concat(parts)
    expected = {kind: number_ids(job, kind, keys(whole)) for kind, keys in kind_keys(job).items()}
    origin = whole.earliest_ms()
    plan = fold(
        shard_plan(),
        [request_room(whole.requests["timestamp_ms"], whole.blocks_per_request(), origin)],
    )
    with TestPipeline() as pipeline:
        batches = pipeline | beam.Create(list(enumerate(parts)))
        origin_ms = beam.pvalue.AsSingleton(pipeline | "Origin" >> beam.Create([origin]))
        for kind, numbered in expected.items():
            ids = batches | f"{kind}Ids" >> NumberIds(job, kind)
            assert_that(ids["unique"], equal_to([numbered.unique]), label=f"{kind}Unique")
            assert_that(ids["added_count"], equal_to([numbered.added_count]), label=f"{kind}Added")
        planned = (
            batches
            | beam.Values()
            | PlanShards(origin_ms)
            | beam.Map(lambda beam_plan: beam_plan.tolist())
        )
        assert_that(planned, equal_to([plan.tolist()]), label="Plan")
