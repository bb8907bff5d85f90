"""A published run's dead letters are never lost, whatever --dead-letter the next run of its
output is given (publish.DeadLetterRun), and the published output carries no mark: beside the
folder it stages, the run keeps a pointer naming its letters and that folder's identity, which
the run itself or the next run of the output settles by what stands."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtrace.transforms import storage
from kvtrace.transforms.storage import place
from kvtrace.transforms.write import publish
from kvtrace.transforms.write.publish import (
    DEAD_LETTER_FILE,
    LETTERS_POINTER,
    DeadLetterRun,
    output_lock,
    recover_letters,
    restore_interrupted,
    settle_pointed_letters,
    staging_folder,
)


def _staged_run(tmp_path, folder: str, run_id: str) -> tuple[DeadLetterRun, str]:
    """A run of output `out`, its letters staged in tmp_path/folder (as an engine writes them)."""
    output = str(tmp_path / "out")
    run = DeadLetterRun(str(tmp_path / folder), output, run_id)
    staging = staging_folder(output, run_id)
    os.makedirs(staging)
    run.begin(staging)
    with open(os.path.join(run.staging, DEAD_LETTER_FILE), "wb") as handle:
        handle.write(f"{run_id}\n".encode())
    return run, staging


def _published_then_killed(tmp_path, folder: str, run_id: str) -> DeadLetterRun:
    """Its output published, the run killed before it settled its letters."""
    run, staging = _staged_run(tmp_path, folder, run_id)
    shutil.rmtree(tmp_path / "out", ignore_errors=True)
    os.rename(staging, tmp_path / "out")
    return run


def _next_run_of_out(tmp_path, folder: str) -> list[str]:
    """What the next run of `out` does first: its lock (settling killed runs' pointers), then
    the letters in its own dead-letter folder."""
    with output_lock(str(tmp_path / "out")):
        return recover_letters(str(tmp_path / folder), str(tmp_path / "out"))


def _tree(folder) -> list[str]:
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def _pointers(tmp_path) -> list[str]:
    return [name for name in os.listdir(tmp_path) if name.endswith(LETTERS_POINTER)]


def test_the_pointer_names_the_run_its_letters_and_the_staged_folder(tmp_path, monkeypatch):
    """Spelled relatively and through a linked parent, the folder is named where it is; the
    staged folder (the output to be) carries nothing."""
    os.makedirs(tmp_path / "real")
    os.symlink(tmp_path / "real", tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    staging = staging_folder(str(tmp_path / "out"), "aaaaaaaaaaaa")
    os.makedirs(staging)
    run = DeadLetterRun("link/dead", str(tmp_path / "out"), "aaaaaaaaaaaa")
    run.begin(staging)
    status = os.stat(staging)
    with open(staging + LETTERS_POINTER) as pointer:
        assert json.load(pointer) == {
            "folder": [status.st_dev, status.st_ino],
            "key": os.path.basename(run.staging)[1:13],
            "letters": str(tmp_path.resolve() / "real" / "dead"),
            "run": "aaaaaaaaaaaa",
        }
    assert os.stat(staging + LETTERS_POINTER).st_mode & 0o777 == 0o600
    assert os.listxattr(staging) == []


def test_a_run_with_another_dead_letter_folder_publishes_the_killed_runs_letters(tmp_path):
    """Killed after publishing (letters in D); the next run of the output, given D2, publishes
    them in D under the killed run's name before it stages its own; nothing stays beside."""
    killed = _published_then_killed(tmp_path, "D", "aaaaaaaaaaaa")
    assert os.listxattr(tmp_path / "out") == []  # published, it carries no mark
    _next_run_of_out(tmp_path, "D2")
    assert _tree(tmp_path / "D") == ["rejected-aaaaaaaaaaaa.jsonl"]
    assert open(killed.published).read() == "aaaaaaaaaaaa\n"
    assert _tree(tmp_path / "D2") == []
    assert _pointers(tmp_path) == []


def test_a_published_run_settles_its_own_letters_by_what_stands(tmp_path):
    run, staging = _staged_run(tmp_path, "D", "aaaaaaaaaaaa")
    os.rename(staging, tmp_path / "out")
    assert run.settle(run_succeeded=False)  # failed after publishing: the output says published
    assert _tree(tmp_path / "D") == ["rejected-aaaaaaaaaaaa.jsonl"]
    assert _pointers(tmp_path) == []


def test_a_failed_runs_letters_go_with_its_staging(tmp_path):
    run, _ = _staged_run(tmp_path, "D", "aaaaaaaaaaaa")
    assert not run.settle(run_succeeded=True)  # its word is not enough: its folder is staged
    assert _tree(tmp_path / "D") == []
    assert _pointers(tmp_path) == []


def test_the_other_runs_staged_in_the_folder_go_as_their_outputs_never_stood(tmp_path):
    _staged_run(tmp_path, "D", "bbbbbbbbbbbb")  # killed before publishing
    _published_then_killed(tmp_path, "D", "aaaaaaaaaaaa")
    _next_run_of_out(tmp_path, "D")
    assert _tree(tmp_path / "D") == ["rejected-aaaaaaaaaaaa.jsonl"]
    assert [p for p in os.listdir(tmp_path) if p.startswith(".out")] == []


def test_a_kill_after_the_letters_are_published_before_the_pointer_goes_loses_nothing(
    tmp_path, monkeypatch
):
    _published_then_killed(tmp_path, "D", "aaaaaaaaaaaa")
    pointer = staging_folder(str(tmp_path / "out"), "aaaaaaaaaaaa") + LETTERS_POINTER
    monkeypatch.setattr(publish.os, "remove", lambda path: None)  # killed before it went
    settle_pointed_letters(pointer, str(tmp_path / "out"))
    monkeypatch.undo()
    assert os.path.exists(pointer)
    _next_run_of_out(tmp_path, "D")
    assert _tree(tmp_path / "D") == ["rejected-aaaaaaaaaaaa.jsonl"]
    assert open(tmp_path / "D" / "rejected-aaaaaaaaaaaa.jsonl").read() == "aaaaaaaaaaaa\n"
    assert _pointers(tmp_path) == []


def test_a_pointed_folder_that_is_gone_settles_nothing_and_the_pointer_goes(tmp_path):
    _published_then_killed(tmp_path, "D", "aaaaaaaaaaaa")
    shutil.rmtree(tmp_path / "D")
    _next_run_of_out(tmp_path, "D2")
    assert not (tmp_path / "D").exists()
    assert _pointers(tmp_path) == []


def test_on_an_object_store_the_run_has_its_own_word(tmp_path):
    """No identity to keep (an object store's output): settle publishes the letters if the run
    says it succeeded."""
    run = DeadLetterRun(str(tmp_path / "D"), "gs://bucket/out", "aaaaaaaaaaaa")
    run.begin("gs://bucket/.out.kvtrace-staging-aaaaaaaaaaaa")
    with open(os.path.join(run.staging, DEAD_LETTER_FILE), "wb") as handle:
        handle.write(b"letter\n")
    assert run.settle(run_succeeded=True)
    assert _tree(tmp_path / "D") == ["rejected-aaaaaaaaaaaa.jsonl"]


def _pointed_output(tmp_path, pointed: bytes) -> str:
    """Output `out`, a pointer beside it (as a killed run of `aaaaaaaaaaaa` would leave) holding
    pointed, and a run's letters staged where a pointer naming that run and D sends a run."""
    output = str(tmp_path / "out")
    os.makedirs(output, exist_ok=True)
    pointer = staging_folder(output, "aaaaaaaaaaaa") + LETTERS_POINTER
    with open(pointer, "wb") as handle:
        handle.write(pointed)
    staged = DeadLetterRun(str(tmp_path / "D"), output, "aaaaaaaaaaaa").staging
    os.makedirs(staged, exist_ok=True)
    with open(os.path.join(staged, DEAD_LETTER_FILE), "w") as handle:
        handle.write("letters\n")
    return pointer


def test_a_pointer_kvtrace_would_not_write_is_no_pointer(tmp_path):
    """A relative or unfolded place, a run id that is a path, a key that is no key, an identity
    that is none, an extra key: nothing is published or removed by it, and the pointer goes."""
    folder, output = str(tmp_path / "D"), str(tmp_path / "out")
    key = os.path.basename(DeadLetterRun(folder, output, "a" * 12).staging)[1:13]
    os.makedirs(output)
    out = os.stat(output)
    good = {
        "folder": [out.st_dev, out.st_ino],
        "key": key,
        "letters": place(folder),
        "run": "a" * 12,
    }
    staged = os.path.basename(DeadLetterRun(folder, output, "aaaaaaaaaaaa").staging)
    for pointed in [
        b"aaaaaaaaaaaa",
        json.dumps({k: v for k, v in good.items() if k != "folder"}).encode(),
        json.dumps(good | {"key": "../x"}).encode(),
        json.dumps(good | {"letters": "D"}).encode(),
        json.dumps(good | {"letters": folder + "/../D"}).encode(),
        json.dumps(good | {"run": "../aaaaaaaaaaaa"}).encode(),
        json.dumps(good | {"folder": [out.st_dev, True]}).encode(),
        json.dumps(good | {"folder": [out.st_dev]}).encode(),
        json.dumps(good | {"x": 1}).encode(),
    ]:
        pointer = _pointed_output(tmp_path, pointed)
        assert settle_pointed_letters(pointer, output) == [], pointed
        assert _tree(tmp_path / "D") == [staged], pointed
        assert not os.path.exists(pointer)
    pointer = _pointed_output(tmp_path, json.dumps(good).encode())  # kvtrace's own: settled
    published = [os.path.join(place(folder), "rejected-aaaaaaaaaaaa.jsonl")]
    assert settle_pointed_letters(pointer, output) == published
    assert _tree(tmp_path / "D") == ["rejected-aaaaaaaaaaaa.jsonl"]


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    pointed=st.one_of(
        st.binary(min_size=1, max_size=200),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=30),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(
                    st.sampled_from(["key", "run", "letters", "folder", "x"]), inner, max_size=4
                )
            ),
            max_leaves=6,
        ).map(lambda value: json.dumps(value).encode()),
    )
)
def test_any_pointer_is_read_without_an_error_and_goes(tmp_path, pointed):
    """Fuzz: whatever bytes a pointer holds, settling reads them without a traceback, publishes
    nothing but the pointed run's letters, and removes the pointer."""
    pointer = _pointed_output(tmp_path, pointed)
    settled = settle_pointed_letters(pointer, str(tmp_path / "out"))
    letters = os.path.join(place(str(tmp_path / "D")), "rejected-aaaaaaaaaaaa.jsonl")
    assert settled in ([], [letters])
    assert not os.path.exists(pointer)
    shutil.rmtree(tmp_path / "D", ignore_errors=True)


def test_a_published_output_moved_before_its_letters_settled_finds_them_by_its_identity(tmp_path):
    """A run of the old name finds its output moved away: the letters stay staged, naming the
    folder; a run of the moved folder (same dead-letter folder) publishes them."""
    _published_then_killed(tmp_path, "D", "aaaaaaaaaaaa")
    os.rename(tmp_path / "out", tmp_path / "archive")
    assert _next_run_of_out(tmp_path, "D") == []
    assert any(name.endswith("aaaaaaaaaaaa") for name in _tree(tmp_path / "D"))
    with output_lock(str(tmp_path / "archive")):
        assert recover_letters(str(tmp_path / "D"), str(tmp_path / "archive")) == ["aaaaaaaaaaaa"]
    assert _tree(tmp_path / "D") == ["rejected-aaaaaaaaaaaa.jsonl"]


def test_a_killed_runs_staging_takes_its_letters_when_cleared(tmp_path):
    """Killed before its swap: the next run's lock settles its pointer (its folder still
    staged: never published), then clears the folder; no later folder given that inode can
    meet the pointer, as it is gone before the inode is free."""
    _staged_run(tmp_path, "D", "aaaaaaaaaaaa")
    assert restore_interrupted(str(tmp_path / "out"))
    assert _tree(tmp_path / "D") == []
    assert [p for p in os.listdir(tmp_path) if p.startswith(".out")] == []


def test_a_hard_end_removes_an_unpublished_runs_pointer_and_letters_only(tmp_path, monkeypatch):
    """The registry a hard end empties (storage.remove_leftovers): an unpublished run's pointer
    and letters go with its staging; a published run's stay for the next run to settle."""
    monkeypatch.setattr(storage, "_LEFTOVERS", {})
    unpublished, _ = _staged_run(tmp_path, "D", "bbbbbbbbbbbb")
    published = _published_then_killed(tmp_path, "D", "aaaaaaaaaaaa")
    storage.remove_leftovers()
    assert _tree(tmp_path / "D") == [os.path.basename(published.staging)]
    assert _pointers(tmp_path) == [
        os.path.basename(staging_folder(str(tmp_path / "out"), "aaaaaaaaaaaa")) + LETTERS_POINTER
    ]
    _next_run_of_out(tmp_path, "D")
    assert _tree(tmp_path / "D") == ["rejected-aaaaaaaaaaaa.jsonl"]
    assert unpublished.settle(run_succeeded=False) == []


def _stage_measured(run: DeadLetterRun) -> None:
    """Two shards' measured parts, written out of order as parallel shard writers may, then
    joined as the run does while its output is staged (read/measured.join_measured)."""
    from kvtrace.transforms.read.measured import join_measured, measured_part

    for shard in (1, 0):
        with storage.create(os.path.join(run.staging, measured_part(shard)), private=True) as f:
            f.write(f'{{"shard": {shard}}}\n'.encode())
    join_measured(run.staging, "ab" * 32)


def test_measured_parts_are_published_joined_in_shard_order_beside_the_letters(tmp_path):
    run, staging = _staged_run(tmp_path, "dead", "r1")
    _stage_measured(run)
    shutil.rmtree(tmp_path / "out", ignore_errors=True)
    os.rename(staging, tmp_path / "out")  # the output published
    dead = place(str(tmp_path / "dead"))
    assert run.settle(True) == [f"{dead}/rejected-r1.jsonl", f"{dead}/measured-r1.jsonl"]
    assert _tree(tmp_path / "dead") == ["measured-r1.jsonl", "rejected-r1.jsonl"]
    measured = tmp_path / "dead" / "measured-r1.jsonl"
    header = json.dumps({"manifest_sha256": "ab" * 32})
    assert measured.read_text() == f'{header}\n{{"shard": 0}}\n{{"shard": 1}}\n'
    assert measured.stat().st_mode & 0o777 == 0o600


def test_a_run_that_rejected_nothing_says_it_published_its_measured_file(tmp_path):
    """A settle that publishes only a measured file says so: what it returns is every file it
    published, not whether letters were among them."""
    run, staging = _staged_run(tmp_path, "dead", "r1")
    os.remove(os.path.join(run.staging, DEAD_LETTER_FILE))
    _stage_measured(run)
    os.rename(staging, tmp_path / "out")
    assert run.settle(True) == [f"{place(str(tmp_path / 'dead'))}/measured-r1.jsonl"]
    assert _tree(tmp_path / "dead") == ["measured-r1.jsonl"]


def test_a_settle_writes_nothing(tmp_path, monkeypatch):
    """Settling a published run's letters is renames only: no space needed (a full disk after
    the trace is published keeps the night's letters)."""
    run, staging = _staged_run(tmp_path, "dead", "r1")
    _stage_measured(run)
    os.rename(staging, tmp_path / "out")

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(storage, "create", full)
    monkeypatch.setattr(shutil, "copyfileobj", full)
    assert len(run.settle(True)) == 2
    assert _tree(tmp_path / "dead") == ["measured-r1.jsonl", "rejected-r1.jsonl"]


def test_measured_parts_go_with_a_run_that_failed(tmp_path):
    run, _ = _staged_run(tmp_path, "dead", "r1")
    _stage_measured(run)
    assert run.settle(False) == []
    assert _tree(tmp_path / "dead") == []


@pytest.mark.parametrize("existed", [False, True], ids=["made-by-the-run", "there-before"])
def test_a_hard_end_removes_the_dead_letter_folder_the_run_made_only(
    tmp_path, monkeypatch, existed
):
    """A stop at the deadline (storage.remove_leftovers) takes the run's staged letters and
    the dead-letter folder it made for them, now empty; a folder that was there stays."""
    monkeypatch.setattr(storage, "_LEFTOVERS", {})
    if existed:
        (tmp_path / "D").mkdir()
    _staged_run(tmp_path, "D", "bbbbbbbbbbbb")
    storage.remove_leftovers()
    assert (tmp_path / "D").is_dir() is existed
    assert _tree(tmp_path / "D") == []


def _failing_once(function, path: str):
    """function, failing once as on a full disk when called on path."""
    failed: list[str] = []

    def step(*args, **kwargs):
        if os.fspath(args[0]) == path and not failed:
            failed.append(path)
            raise OSError(28, "No space left on device")
        return function(*args, **kwargs)

    return step


@pytest.mark.parametrize("failing", ["letters", "publishes", "pointer"])
def test_a_failed_runs_letters_go_whichever_step_of_their_drop_fails(
    tmp_path, monkeypatch, failing
):
    """The failed run's cleanup removes its staged output after the settle (storage.run_folders):
    letters still staged then would name a folder that is gone, which a rerun takes for a
    published one moved away, and they would stay for ever (the crash-point harness, ENOSPC at
    the letters' removal)."""
    run, staging = _staged_run(tmp_path, "D", "aaaaaaaaaaaa")
    if failing == "letters":
        monkeypatch.setattr(shutil, "rmtree", _failing_once(shutil.rmtree, run.staging))
    else:
        path = (
            os.path.join(run.staging, DeadLetterRun.PUBLISHES)
            if failing == "publishes"
            else staging + LETTERS_POINTER
        )
        monkeypatch.setattr(os, "remove", _failing_once(os.remove, path))
    with pytest.raises(OSError):  # the failure is said, its letters gone all the same
        run.settle(run_succeeded=False)
    monkeypatch.undo()
    shutil.rmtree(staging)
    _next_run_of_out(tmp_path, "D")
    assert _tree(tmp_path / "D") == []
    assert _pointers(tmp_path) == []


def test_letters_a_drop_left_name_no_folder_and_the_next_run_drops_them(tmp_path, monkeypatch):
    run, staging = _staged_run(tmp_path, "D", "aaaaaaaaaaaa")
    monkeypatch.setattr(shutil, "rmtree", lambda path, ignore_errors=False: None)  # said nothing
    assert run.settle(run_succeeded=False) == []
    monkeypatch.undo()
    assert _tree(run.staging) == [DEAD_LETTER_FILE]
    shutil.rmtree(staging)
    _next_run_of_out(tmp_path, "D")
    assert _tree(tmp_path / "D") == []


def _failing_on(function, path: str):
    """function, failing on path every time, as in a folder gone read-only (silently where
    the caller ignores errors: rmtree's ignore_errors)."""

    def step(*args, **kwargs):
        if os.fspath(args[0]) == path:
            if kwargs.get("ignore_errors"):
                return None
            raise OSError(30, "Read-only file system")
        return function(*args, **kwargs)

    return step


@pytest.mark.parametrize("cleanup", ["failure", "hard-end"])
def test_a_failed_runs_letters_are_never_orphaned_when_every_settle_fails(
    tmp_path, monkeypatch, cleanup
):
    """Both of settle's attempts fail (the crash-point harness, a dead-letter folder gone
    read-only): the pointer stands, so the failed run's cleanup (run_folders, or a hard end's
    registry, whose removal of the letters fails too) keeps the staged folder it names, empty
    as it is, and the next run of the output still tells the letters unpublished and drops
    them. Had the folder gone, they would name a folder that is gone, taken for a published
    one moved away, staged for ever."""
    monkeypatch.setattr(storage, "_LEFTOVERS", {})
    output = str(tmp_path / "out")
    run = DeadLetterRun(str(tmp_path / "D"), output, "aaaaaaaaaaaa")
    staging = staging_folder(output, "aaaaaaaaaaaa")
    with pytest.raises(OSError), storage.run_folders():
        storage.make_folder(staging, private=True)  # the run's, as its command makes it
        run.begin(staging)
        with open(os.path.join(run.staging, DEAD_LETTER_FILE), "wb") as handle:
            handle.write(b"a letter\n")
        publishes = os.path.join(run.staging, DeadLetterRun.PUBLISHES)
        monkeypatch.setattr(os, "remove", _failing_on(os.remove, publishes))
        monkeypatch.setattr(shutil, "rmtree", _failing_on(shutil.rmtree, run.staging))
        try:
            run.settle(run_succeeded=False)
        finally:
            if cleanup == "hard-end":
                storage.remove_leftovers()
    monkeypatch.undo()
    assert os.path.isdir(staging) and _pointers(tmp_path)  # left for the next run to settle
    _next_run_of_out(tmp_path, "D")
    assert _tree(tmp_path / "D") == []
    assert _pointers(tmp_path) == []
    assert [p for p in os.listdir(tmp_path) if p.startswith(".out")] == []
