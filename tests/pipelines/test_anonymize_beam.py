"""The Beam pipeline's dead letters: staged where they are made, merged into one file whose
bytes do not depend on the order Beam hands them over in."""

from __future__ import annotations

import random

import apache_beam as beam
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from pipelines.anonymize_beam import StageLetters
from transforms.dead_letters import DeadLetter, StagedLetters, merge_runs

LETTERS = [DeadLetter(f"in-{i % 3}.jsonl", b"\x01" * (i % 11), "invalid_json", f"line {i}")
           for i in range(500)]


def merged(folder, letters: list[DeadLetter]) -> bytes:
    path = str(folder / "rejected.jsonl")
    with TestPipeline() as pipeline:
        staged = (pipeline
                  | beam.Create(letters, reshuffle=True)
                  | beam.ParDo(StageLetters(str(folder)))
                  | beam.CombineGlobally(lambda parts: sum(parts, StagedLetters())))
        written = (pipeline | "Path" >> beam.Create([path])
                   | beam.Map(merge_runs, beam.pvalue.AsSingleton(staged)))
        assert_that(written, equal_to([path]))
        assert_that(staged | beam.Map(lambda s: s.tally.count), equal_to([len(letters)]),
                    label="Counted")
    return (folder / "rejected.jsonl").read_bytes()


def test_the_letters_file_is_the_same_bytes_whatever_the_order(tmp_path):
    """Handed over shuffled and reshuffled, written as runs per bundle: the file is every
    letter's line, sorted, and nothing else is left in the folder."""
    shuffled = LETTERS[:]
    random.Random(7).shuffle(shuffled)
    expected = b"".join(sorted(letter.to_json().encode() + b"\n" for letter in LETTERS))
    assert merged(tmp_path, shuffled) == expected
    assert [p.name for p in tmp_path.iterdir()] == ["rejected.jsonl"]  # no run left behind
