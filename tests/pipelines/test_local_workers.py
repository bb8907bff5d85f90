"""The local engine's workers: encoding never runs in the process that reports, however many
workers there are, so a worker's death (a native abort) is that process's one-line error."""

from __future__ import annotations

import faulthandler
import os
import resource
from dataclasses import dataclass

import pytest

from kvtrace.pipelines import local_workers
from kvtrace.pipelines.anonymize_night import Encoded
from kvtrace.pipelines.progress import RangeCounts
from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.read.sources import FileRange

PIECES = [FileRange("in.jsonl", start, start + 1) for start in range(5)]


@dataclass(frozen=True)
class PidWork:
    """Encodes a range as the id of the process that encoded it (in `read`), and aborts the
    process, as the Rust tokenizer does when an allocation fails, on the range abort_at."""

    abort_at: int | None = None

    def new_encoder(self) -> None:
        return None

    def warm_up(self, encoder: None, first: FileRange) -> None:
        pass

    def encode(self, pieces: list[FileRange], encoder: None, progress: RangeCounts) -> Encoded:
        if pieces[0].start == self.abort_at:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file left behind
            faulthandler.disable()  # pytest's, inherited: it would print this worker's stack
            os.abort()
        return Encoded([], [], os.getpid())


@pytest.mark.parametrize("processes", [1, 2])
def test_ranges_are_encoded_in_worker_processes_never_in_this_one(processes):
    parts = local_workers.encode_in_workers(PidWork(), PIECES, processes, [1] * len(PIECES))
    assert len(parts) == len(PIECES)
    assert os.getpid() not in {part.read for part in parts}


@pytest.mark.parametrize("processes", [1, 2])
def test_an_abort_in_the_only_worker_is_the_pool_paths_one_line(processes):
    """One worker or several, an abort is the same error (the CLI prints it and exits 1), and
    this process lives to say it."""
    with pytest.raises(JobStopped) as stopped:
        local_workers.encode_in_workers(PidWork(abort_at=3), PIECES, processes, [1] * len(PIECES))
    message = JobStopped.message_in(stopped.value)
    assert message is not None and message.startswith("a worker process died by SIGABRT")
    assert "\n" not in message


@dataclass(frozen=True)
class BudgetWork(PidWork):
    """Encodes a range as the render budget the worker that encoded it runs under."""

    def encode(self, pieces: list[FileRange], encoder: None, progress: RangeCounts) -> Encoded:
        budget = (local_workers.RENDER_WATCHDOG.seconds, local_workers.RENDER_WATCHDOG.memory_bytes)
        return Encoded([], [], budget)


@pytest.mark.parametrize("forked", [True, False])
def test_workers_render_under_this_process_budget_forked_or_started_clean(forked, monkeypatch):
    monkeypatch.setattr(local_workers, "can_fork", lambda: forked)
    monkeypatch.setattr(local_workers.RENDER_WATCHDOG, "seconds", 0.25)
    monkeypatch.setattr(local_workers.RENDER_WATCHDOG, "memory_bytes", 64 << 20)
    parts = local_workers.encode_in_workers(BudgetWork(), PIECES[:1], 1, [1])
    assert [part.read for part in parts] == [(0.25, 64 << 20)]


@dataclass(frozen=True)
class EnvironmentWork(PidWork):
    """Encodes a range as the worker's value of KVTRACE_PROBE (as a salt is read from
    KVTRACE_SALT)."""

    def encode(self, pieces: list[FileRange], encoder: None, progress: RangeCounts) -> Encoded:
        return Encoded([], [], os.environ.get("KVTRACE_PROBE"))


def test_clean_workers_see_the_environment_as_it_is_when_they_start(monkeypatch):
    """A forkserver started earlier (by a run before this one) keeps its own environment: a salt
    set since in the environment still reaches the run's workers."""
    monkeypatch.setattr(local_workers, "can_fork", lambda: False)
    monkeypatch.delenv("KVTRACE_PROBE", raising=False)
    assert [
        p.read for p in local_workers.encode_in_workers(EnvironmentWork(), PIECES[:1], 1, [1])
    ] == [None]
    monkeypatch.setenv("KVTRACE_PROBE", "set since")
    parts = local_workers.encode_in_workers(EnvironmentWork(), PIECES[:1], 1, [1])
    assert [part.read for part in parts] == ["set since"]
