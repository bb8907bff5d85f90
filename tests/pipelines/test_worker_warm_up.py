"""Every worker is warmed up before it claims a range, forked or started clean: a worker's first
render imports the renderer and compiles the template, seconds of the wall clock on a loaded
machine, and inside a record's render budget it made that record a dead letter on one run and
not the next (tests/e2e/test_permutations.py, the three-worker case, under load)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kvtrace.pipelines import local_workers
from kvtrace.pipelines.anonymize_night import Encoded
from kvtrace.pipelines.progress import RangeCounts
from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.read.sources import FileRange

PIECES = [FileRange("in.jsonl", start, start + 1) for start in range(4)]


@dataclass(frozen=True)
class WarmthWork:
    """Encodes a range as whether the encoder that encoded it had been warmed up, and on which
    range."""

    def new_encoder(self) -> dict:
        return {}

    def warm_up(self, encoder: dict, first: FileRange) -> None:
        encoder["warmed_on"] = first.start

    def encode(self, pieces: list[FileRange], encoder: dict, progress: RangeCounts) -> Encoded:
        return Encoded([], [], encoder.get("warmed_on"))


@pytest.mark.parametrize("forked", [True, False])
def test_every_worker_is_warmed_up_before_it_encodes_forked_or_started_clean(forked, monkeypatch):
    monkeypatch.setattr(local_workers, "can_fork", lambda: forked)
    parts = local_workers.encode_in_workers(WarmthWork(), PIECES, 2, [1] * len(PIECES))
    assert [part.read for part in parts] == [PIECES[0].start] * len(PIECES)


@dataclass(frozen=True)
class HostileWork(WarmthWork):
    """Stops the job in its warm-up, as a template reaching for Python internals does."""

    def warm_up(self, encoder: dict, first: FileRange) -> None:
        raise JobStopped("the chat template tried to reach Python internals")


@pytest.mark.parametrize("forked", [True, False])
def test_a_stop_in_the_warm_up_is_the_runs_error_forked_or_started_clean(forked, monkeypatch):
    monkeypatch.setattr(local_workers, "can_fork", lambda: forked)
    with pytest.raises(JobStopped) as stopped:
        local_workers.encode_in_workers(HostileWork(), PIECES, 2, [1] * len(PIECES))
    assert (
        JobStopped.message_in(stopped.value) == "the chat template tried to reach Python internals"
    )
