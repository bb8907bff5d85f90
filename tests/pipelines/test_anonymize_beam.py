"""The Beam pipeline's dead letters: staged where they are made, merged into one file whose
bytes do not depend on the order Beam hands them over in; its night's steps against the
night's functions."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from test_anonymize_night import BLOCK_SIZE, SALT, night, request

from kvtrace.pipelines.anonymize_config import AnonymizeConfig, IdMapRun
from kvtrace.pipelines.anonymize_night import kind_keys, number_ids
from kvtrace.transforms.combiners import fold
from kvtrace.transforms.dead_letters import DeadLetter, StagedLetters, merge_runs
from kvtrace.transforms.encode.hashed_batch import HashedBatch
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.errors import JobStopped
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


@pytest.mark.slow  # a whole night's pipeline, over a second: .ci/run runs the slow set
def test_the_pipeline_only_stages_the_night_and_its_launcher_commits_the_id_map(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """No step of the job commits (on a remote runner a step's commit is told to no one): after
    the pipeline ran, the map has no new version and the staging no manifest, only the night's
    owner-only record beside the letters; the launcher's finish_staged then commits version 1
    and stages the manifest, whose trace the run's segments and ids are the ones committed."""
    import dataclasses
    import json
    import stat

    from apache_beam.testing.test_pipeline import TestPipeline

    from kvtrace.pipelines.anonymize_beam import build
    from kvtrace.pipelines.anonymize_night import (
        NIGHT_RECORD,
        finish_staged,
        publish_staged,
        run_segments,
    )
    from kvtrace.transforms.ids.id_map import current_version_number
    from kvtrace.transforms.write.manifest import manifest_path

    job = night_with_a_map(tiny_tokenizer, tmp_path, monkeypatch)
    directory = str(tmp_path / "map")
    with run_segments(job):
        with TestPipeline() as pipeline:
            build(pipeline, job)
        assert current_version_number(directory) == 0  # the job committed nothing
        assert not (tmp_path / "staging" / "manifest.json").exists()
        record = tmp_path / "letters" / NIGHT_RECORD
        assert stat.S_IMODE(record.stat().st_mode) == 0o600
        staged = json.loads(record.read_text())
        assert staged["added"]["blocks"] > 0 and staged["earliest_ms"] == 1_000
        assert sorted(staged["segments"]) == ["blocks", "sessions"]

        night = finish_staged(job)  # the launcher, the job done
        assert current_version_number(directory) == 1
        assert json.loads(open(manifest_path(job.staging)).read()) == night.manifest
        # a first night: the start it was numbered from
        assert night.manifest == staged["manifest"]
        assert night.beside == staged["beside"]  # as the job recorded it, verified again
    publish_staged(job, night)
    assert (tmp_path / "out" / "manifest.json").is_file()
    assert not (tmp_path / "out" / NIGHT_RECORD).exists()  # private: never in the output

    # Damaged, the record stops the launcher in one line, committing nothing.
    entry = {**staged["segments"]["blocks"][0], "shard": -1}
    record.write_text(json.dumps(staged | {"segments": {"blocks": [entry], "sessions": []}}))
    again = dataclasses.replace(job, id_map=map_run(tmp_path, job.salt))
    with pytest.raises(JobStopped, match=r"night\.json cannot be read \(.*-1.*\); nothing"):
        finish_staged(again)
    assert current_version_number(directory) == 1


@pytest.mark.slow  # a whole night's pipeline, over a second: .ci/run runs the slow set
@pytest.mark.parametrize(
    "damage, refusal",
    [
        (
            "sha256",
            r"night\.json cannot be read \(its checksums of .*blocks-\d{5}\.parquet are not",
        ),
        # Refused at the record's bounds, before any file is read (anonymize_night._bounded).
        ("string size", r'night\.json cannot be read \("\d+" \(str\) where a whole number'),
        ("extra key", r"night\.json cannot be read \(an unknown key 'x' in an object of bytes"),
        # An index's size is its file's before it is read (10**15 was a MemoryError).
        ("index size", r"night\.json cannot be read \(it says .*index\.npz is 10{15} bytes, not"),
    ],
)
def test_a_night_record_whose_checksums_are_not_the_files_commits_nothing(
    tiny_tokenizer, tmp_path, monkeypatch, damage, refusal
):
    """The launcher commits only checksums that are the files' and that the map's reader
    reads: a night's record edited on its way back from the job (a wrong sha256, a key kvtrace
    never writes, a size as a string) stops it in one line, the map not extended, and the map
    opens as it was."""
    import json

    from apache_beam.testing.test_pipeline import TestPipeline

    from kvtrace.pipelines.anonymize_beam import build
    from kvtrace.pipelines.anonymize_night import NIGHT_RECORD, finish_staged, run_segments
    from kvtrace.transforms.ids.id_map import current_version_number

    job = night_with_a_map(tiny_tokenizer, tmp_path, monkeypatch)
    directory = str(tmp_path / "map")
    with run_segments(job):
        with TestPipeline() as pipeline:
            build(pipeline, job)
        record = tmp_path / "letters" / NIGHT_RECORD
        staged = json.loads(record.read_text())
        entry = staged["segments"]["blocks"][0]
        if damage == "sha256":
            entry["data"]["sha256"] = entry["index"]["sha256"] = "0" * 64
        elif damage == "extra key":
            entry["data"]["x"] = 1
        elif damage == "index size":
            entry["index"]["bytes"] = 10**15
        else:
            entry["data"]["bytes"] = str(entry["data"]["bytes"])
        record.write_text(json.dumps(staged))
        with pytest.raises(JobStopped, match=refusal) as refused:
            finish_staged(job)
    assert "\n" not in str(refused.value)
    assert current_version_number(directory) == 0
    assert map_run(tmp_path, job.salt).base.version == 0  # the map opens as it was


def night_with_a_map(tiny_tokenizer, tmp_path, monkeypatch) -> AnonymizeConfig:
    """A small night's job over a new id map (tmp_path/map), its record kept in the letters."""
    from helpers import chat, write_jsonl

    monkeypatch.setenv("KVTRACE_TEST_NIGHT_SALT", SALT.decode())
    salt = SaltSource("env", "KVTRACE_TEST_NIGHT_SALT")
    logs = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1_000 * (i + 1), "s") for i in range(6)])
    (tmp_path / "staging").mkdir()
    (tmp_path / "letters").mkdir()
    return AnonymizeConfig(
        inputs=((str(logs), logs.stat().st_size),),
        output=str(tmp_path / "out"),
        staging=str(tmp_path / "staging"),
        tokenizer=tiny_tokenizer,
        salt=salt,
        dead_letter=str(tmp_path / "letters"),
        block_size=BLOCK_SIZE,
        id_map=map_run(tmp_path, salt),
    )


def map_run(folder: Path, salt: SaltSource) -> IdMapRun:
    """The id map folder/map (its marks in folder/marks) opened as a night opens it."""
    from kvtrace.transforms.encode.blocks import salt_fingerprint
    from kvtrace.transforms.ids.id_map import MapIdentity
    from kvtrace.transforms.ids.map_opening import open_repaired_map

    directory, marks = str(folder / "map"), str(folder / "marks")
    identity = MapIdentity(salt_fingerprint(SALT), BLOCK_SIZE, {}, "scheme", {}, "probe")
    return IdMapRun(directory, open_repaired_map(directory, identity, salt, marks), marks)


@pytest.mark.slow  # a whole night's pipeline, over a second: .ci/run runs the slow set
def test_a_night_its_gate_refuses_finishes_its_job_and_its_launcher_raises_the_line(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """The gate refuses (too much rejected): no step raises (a remote runner would retry it),
    the job finishes having written no shard and staged the refusal as the night's record,
    and the launcher's finish_staged raises its one line, staging no manifest."""
    import json
    import os

    from apache_beam.testing.test_pipeline import TestPipeline

    from helpers import chat, write_jsonl
    from kvtrace.pipelines.anonymize_beam import build
    from kvtrace.pipelines.anonymize_night import NIGHT_RECORD, finish_staged
    from kvtrace.transforms.write.manifest import manifest_path

    monkeypatch.setenv("KVTRACE_TEST_NIGHT_SALT", SALT.decode())
    logs = write_jsonl(tmp_path / "in.jsonl", [chat(0, 1_000), b"bad", b"bad"])
    (tmp_path / "staging").mkdir()
    (tmp_path / "letters").mkdir()
    job = AnonymizeConfig(
        inputs=((str(logs), logs.stat().st_size),),
        output=str(tmp_path / "out"),
        staging=str(tmp_path / "staging"),
        tokenizer=tiny_tokenizer,
        salt=SaltSource("env", "KVTRACE_TEST_NIGHT_SALT"),
        dead_letter=str(tmp_path / "letters"),
        block_size=BLOCK_SIZE,
        max_rejected_fraction=0.5,
    )
    with TestPipeline() as pipeline:
        build(pipeline, job)
    staged = json.loads((tmp_path / "letters" / NIGHT_RECORD).read_text())
    assert list(staged) == ["refused"]
    assert staged["refused"].startswith("too much input rejected: 2 of 3 records")
    assert not list((tmp_path / "staging").glob("trace-*"))
    with pytest.raises(JobStopped, match=r"^kvtrace stopped the job: too much input rejected"):
        finish_staged(job)
    assert not os.path.exists(manifest_path(job.staging))

    # A refusal that is not one line of text is a damaged record, said as one.
    (tmp_path / "letters" / NIGHT_RECORD).write_text(json.dumps({"refused": ["a", "b"]}))
    with pytest.raises(JobStopped, match=r"cannot be read \(its refusal is not one line"):
        finish_staged(job)


def test_a_step_refusing_yields_its_line_as_a_verdict_and_nothing_else():
    """verdict: a step's outputs whole, or (a refusal raised midway) only its one line, tagged,
    whatever it yielded before it refused."""
    from kvtrace.pipelines.anonymize_beam import REFUSED_TAG, verdict

    def refusing():
        yield "a shard"
        raise JobStopped("trace shard 3: a value out of range; nothing published")

    assert list(verdict(lambda: ["a", "b"])) == ["a", "b"]
    (refused,) = verdict(refusing)
    assert (refused.tag, refused.value) == (
        REFUSED_TAG,
        b"trace shard 3: a value out of range; nothing published",
    )

    # A line naming a path that is not UTF-8 travels (Beam carries text as UTF-8) and comes
    # back whole in the launcher.
    def naming(path: str):
        raise JobStopped(f"the id map {path} began on epoch dates")

    (refused,) = verdict(lambda: naming("/maps/\udcff"))
    assert refused.value == b"the id map /maps/\xff began on epoch dates"
