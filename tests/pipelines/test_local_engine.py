"""The local engine (no Beam) against the Beam pipeline: byte-identical output for the same input
and config, and the engine chosen as the flags say.

The unit tests; the whole CLI runs are in tests/e2e/test_local_engine_cli.py."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.pipelines import local_workers


@pytest.mark.parametrize("pieces, processes", [(10, 2), (7, 3), (3, 3), (5, 4)])
def test_each_worker_starts_with_one_run_of_neighbouring_ranges(pieces, processes):
    bounds = local_workers.run_bounds(pieces, processes)
    runs = [range(bounds[2 * w], bounds[2 * w + 1]) for w in range(processes)]
    assert all(runs) and [i for run in runs for i in run] == list(range(pieces))
    assert max(map(len, runs)) - min(map(len, runs)) <= 1


@settings(max_examples=200, deadline=None)
@given(pieces=st.integers(1, 40), processes=st.integers(1, 6), data=st.data())
def test_claims_take_every_range_once_whatever_the_order_workers_ask_in(pieces, processes, data):
    """Workers ask in any order: each range is claimed exactly once, a worker's own run in
    order first, and what it takes from others are neighbours taken from their backs."""
    processes = min(processes, pieces)
    bounds = local_workers.run_bounds(pieces, processes)
    own = {w: range(bounds[2 * w], bounds[2 * w + 1]) for w in range(processes)}
    taken: dict[int, list[int]] = {w: [] for w in range(processes)}
    asking = list(range(processes))
    while asking:
        worker = data.draw(st.sampled_from(asking))
        index = local_workers.claim(bounds, worker)
        if index is None:
            asking.remove(worker)
        else:
            taken[worker].append(index)
    assert sorted(i for got in taken.values() for i in got) == list(range(pieces))
    for worker, got in taken.items():
        mine = [i for i in got if i in own[worker]]
        assert got[: len(mine)] == mine == sorted(mine)
        for victim, run in own.items():
            stolen = [i for i in got[len(mine) :] if i in run]
            assert stolen == sorted(stolen, reverse=True)  # from the back, neighbours


def test_the_default_is_a_worker_per_core_and_per_read_split_of_input(monkeypatch):
    monkeypatch.setattr(
        local_workers.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False
    )
    split = local_workers.READ_SPLIT_BYTES
    assert local_workers.worker_count(0, 10_000) == 1
    assert local_workers.worker_count(0, 2 * split + 1) == 3
    assert local_workers.worker_count(0, 100 * split) == 4
    assert local_workers.worker_count(6, 10_000) == 6  # asked for: as asked (ranges cap it)


def test_workers_fork_only_from_a_process_without_grpc_or_other_threads(monkeypatch):
    monkeypatch.setitem(sys.modules, "grpc", sys)
    assert not local_workers.can_fork()
