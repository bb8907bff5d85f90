"""conftest's xdist scheduling: the beam group first, then the worker that loaded Beam gets the
files that start no encode workers while there are any, the other worker the rest."""

from __future__ import annotations

import conftest

QUEUE = ["tests/e2e/test_a.py", "beam", "tests/transforms/test_c.py", "tests/cli/test_d.py"]


def test_the_beam_group_goes_first_whoever_asks():
    assert conftest.next_scope(QUEUE, beam_worker=False) == "beam"
    assert conftest.next_scope(QUEUE, beam_worker=True) == "beam"


def test_the_beam_worker_gets_unit_tests_files_and_the_other_the_runs():
    queue = [scope for scope in QUEUE if scope != "beam"]
    assert conftest.next_scope(queue, beam_worker=True) == "tests/transforms/test_c.py"
    assert conftest.next_scope(queue, beam_worker=False) == "tests/e2e/test_a.py"
    assert conftest.next_scope(["tests/pipelines/test_p.py", *queue[1:]], False) == (
        "tests/pipelines/test_p.py"
    )


def test_once_one_kind_runs_out_a_worker_takes_the_other():
    assert conftest.next_scope(["tests/e2e/test_a.py"], beam_worker=True) == "tests/e2e/test_a.py"
    assert (
        conftest.next_scope(["tests/test_layout.py"], beam_worker=False) == "tests/test_layout.py"
    )


def test_a_files_tests_are_one_scope_and_the_beam_tests_one(monkeypatch, tmp_path):
    listing = tmp_path / "beam"
    listing.write_text("tests/e2e/test_a.py::test_beam[1]\n")
    monkeypatch.setenv(conftest.BEAM_TESTS, str(listing))
    scheduler = object.__new__(
        conftest.LoadFileAndBeamScheduling
    )  # its split reads this state only
    scheduler.beam_tests = None
    split = scheduler._split_scope
    assert split("tests/e2e/test_a.py::test_one") == "tests/e2e/test_a.py"
    assert split("tests/e2e/test_a.py::Class::test_one[1]") == "tests/e2e/test_a.py"
    assert split("tests/e2e/test_a.py::test_beam[1]") == "beam"
    assert split("tests/e2e/test_a.py::test_beam[2]") == "tests/e2e/test_a.py"
