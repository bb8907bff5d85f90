"""A published run's dead letters are never lost, whatever --dead-letter the next run of its
output is given (publish.DeadLetterRun): the output's mark names the run and where its letters
are staged, and every later run settles the marked run's letters there before the mark goes."""

from __future__ import annotations

import json
import os
import shutil

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtrace.transforms.storage import place
from kvtrace.transforms.write import publish
from kvtrace.transforms.write.publish import (
    DEAD_LETTER_FILE,
    MAX_MARK_BYTES,
    DeadLetterRun,
    recover_letters,
    settle_marked_letters,
    staging_folder,
)

MARK = "user.kvtrace.run"


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


def _tree(folder) -> list[str]:
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def test_the_mark_names_the_run_and_the_place_of_its_dead_letter_folder(tmp_path, monkeypatch):
    """Spelled relatively and through a linked parent, the folder is named where it is."""
    os.makedirs(tmp_path / "real")
    os.symlink(tmp_path / "real", tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    staging = str(tmp_path / "staging")
    os.makedirs(staging)
    run = DeadLetterRun("link/dead", str(tmp_path / "out"), "aaaaaaaaaaaa")
    run.begin(staging)
    assert json.loads(os.getxattr(staging, MARK)) == {
        "key": os.path.basename(run.staging)[1:13],
        "letters": str(tmp_path.resolve() / "real" / "dead"),
        "run": "aaaaaaaaaaaa",
    }


def test_a_run_with_another_dead_letter_folder_publishes_the_marked_runs_letters(tmp_path):
    """Killed after publishing (letters in D); the next run of the output, given D2, publishes
    them in D under the killed run's name before it stages its own, and takes the mark off."""
    killed = _published_then_killed(tmp_path, "D", "aaaaaaaaaaaa")
    assert recover_letters(str(tmp_path / "D2"), str(tmp_path / "out")) == ["aaaaaaaaaaaa"]
    assert _tree(tmp_path / "D") == ["rejected-aaaaaaaaaaaa.jsonl"]
    assert open(killed.published).read() == "aaaaaaaaaaaa\n"
    assert _tree(tmp_path / "D2") == []
    assert MARK not in os.listxattr(tmp_path / "out")


def test_a_failing_runs_settle_publishes_the_marked_runs_letters_first(tmp_path):
    """settle settles the marked run too (a run that skipped recovery, as a stream's window
    does): the failing run's own letters go, the killed run's are published in its folder."""
    _published_then_killed(tmp_path, "D", "aaaaaaaaaaaa")
    failing, _ = _staged_run(tmp_path, "D2", "bbbbbbbbbbbb")  # fails before publishing
    assert not failing.settle(run_succeeded=False)
    assert _tree(tmp_path / "D") == ["rejected-aaaaaaaaaaaa.jsonl"]
    assert _tree(tmp_path / "D2") == []
    later = DeadLetterRun(str(tmp_path / "D"), str(tmp_path / "out"), "cccccccccccc")
    assert recover_letters(later.folder, later.output) == []  # settled once, kept
    assert _tree(tmp_path / "D") == ["rejected-aaaaaaaaaaaa.jsonl"]


def test_a_published_run_settles_its_own_letters_through_its_mark(tmp_path):
    run, staging = _staged_run(tmp_path, "D", "aaaaaaaaaaaa")
    os.rename(staging, tmp_path / "out")
    assert run.settle(run_succeeded=False)  # failed after publishing: the output says published
    assert _tree(tmp_path / "D") == ["rejected-aaaaaaaaaaaa.jsonl"]
    assert MARK not in os.listxattr(tmp_path / "out")


def test_the_other_runs_staged_in_the_folder_go_as_their_outputs_never_stood(tmp_path):
    _staged_run(tmp_path, "D", "bbbbbbbbbbbb")  # killed before publishing
    _published_then_killed(tmp_path, "D", "aaaaaaaaaaaa")
    publish.restore_interrupted(str(tmp_path / "out"))  # as the next run's lock does first
    assert recover_letters(str(tmp_path / "D"), str(tmp_path / "out")) == ["aaaaaaaaaaaa"]
    assert _tree(tmp_path / "D") == ["rejected-aaaaaaaaaaaa.jsonl"]


def test_a_kill_after_the_letters_are_published_before_the_mark_goes_loses_nothing(
    tmp_path, monkeypatch
):
    _published_then_killed(tmp_path, "D", "aaaaaaaaaaaa")
    monkeypatch.setattr(publish, "_unmark", lambda folder: None)  # killed before unmarking
    settle_marked_letters(str(tmp_path / "out"))
    monkeypatch.undo()
    assert MARK in os.listxattr(tmp_path / "out")
    assert recover_letters(str(tmp_path / "D"), str(tmp_path / "out")) == []
    assert _tree(tmp_path / "D") == ["rejected-aaaaaaaaaaaa.jsonl"]
    assert open(tmp_path / "D" / "rejected-aaaaaaaaaaaa.jsonl").read() == "aaaaaaaaaaaa\n"
    assert MARK not in os.listxattr(tmp_path / "out")


def test_a_marked_folder_that_is_gone_settles_nothing_and_the_mark_goes(tmp_path):
    _published_then_killed(tmp_path, "D", "aaaaaaaaaaaa")
    shutil.rmtree(tmp_path / "D")
    assert recover_letters(str(tmp_path / "D2"), str(tmp_path / "out")) == []
    assert not (tmp_path / "D").exists()
    assert MARK not in os.listxattr(tmp_path / "out")


def test_a_place_too_long_for_a_mark_is_no_mark(tmp_path):
    folder = str(tmp_path / "x")
    os.makedirs(folder)
    assert not publish._mark(folder, "aaaaaaaaaaaa", "/" + "d" * MAX_MARK_BYTES, "0" * 12)
    assert MARK not in os.listxattr(folder)


def test_without_a_mark_the_run_has_its_own_word(tmp_path, monkeypatch):
    """Where no mark can be made (too long, no extended attributes): settle publishes the
    letters if the run says it succeeded; a killed run's go."""
    monkeypatch.setattr(publish, "_mark", lambda *args: False)
    succeeded, staging = _staged_run(tmp_path, "D", "aaaaaaaaaaaa")
    os.rename(staging, tmp_path / "out")
    _staged_run(tmp_path, "D", "bbbbbbbbbbbb")  # killed
    assert succeeded.settle(run_succeeded=True)
    assert recover_letters(str(tmp_path / "D"), str(tmp_path / "out")) == []
    assert _tree(tmp_path / "D") == ["rejected-aaaaaaaaaaaa.jsonl"]


def _marked_output(tmp_path, mark: bytes) -> str:
    """Output `out` carrying mark, and a run's letters staged where a plain-name mark naming
    run `aaaaaaaaaaaa` and folder D would send a later run to look."""
    output = str(tmp_path / "out")
    os.makedirs(output, exist_ok=True)
    os.setxattr(output, MARK, mark)
    staged = DeadLetterRun(str(tmp_path / "D"), output, "aaaaaaaaaaaa").staging
    os.makedirs(staged, exist_ok=True)
    with open(os.path.join(staged, DEAD_LETTER_FILE), "w") as handle:
        handle.write("letters\n")
    return output


def test_a_mark_kvtrace_would_not_write_is_no_mark(tmp_path):
    """An older plain run id, a relative or unfolded place, a run id that is a path, an extra
    key: nothing is published or removed by it, in D or anywhere, and the mark goes."""
    folder = str(tmp_path / "D")
    key = os.path.basename(DeadLetterRun(folder, str(tmp_path / "out"), "a" * 12).staging)[1:13]
    for mark in [
        b"aaaaaaaaaaaa",
        json.dumps({"letters": folder, "run": "a" * 12}).encode(),
        json.dumps({"key": "../x", "letters": folder, "run": "a" * 12}).encode(),
        json.dumps({"letters": "D", "run": "aaaaaaaaaaaa"}).encode(),
        json.dumps({"letters": folder + "/../D", "run": "aaaaaaaaaaaa"}).encode(),
        json.dumps({"letters": folder, "run": "../aaaaaaaaaaaa"}).encode(),
        json.dumps({"letters": folder, "run": "aaaaaaaaaaaa", "x": 1}).encode(),
    ]:
        output = _marked_output(tmp_path, mark)
        assert settle_marked_letters(output) is None, mark
        assert _tree(tmp_path / "D") == [
            os.path.basename(DeadLetterRun(folder, output, "aaaaaaaaaaaa").staging)
        ], mark
        assert MARK not in os.listxattr(output)
    output = _marked_output(
        tmp_path,
        json.dumps(  # the one kvtrace writes: settled
            {"key": key, "letters": place(folder), "run": "aaaaaaaaaaaa"}
        ).encode(),
    )
    assert settle_marked_letters(output) == ("aaaaaaaaaaaa", place(folder))
    assert _tree(tmp_path / "D") == ["rejected-aaaaaaaaaaaa.jsonl"]


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    mark=st.one_of(
        st.binary(min_size=1, max_size=200),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=30),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(
                    st.sampled_from(["key", "run", "letters", "x"]), inner, max_size=3
                )
            ),
            max_leaves=6,
        ).map(lambda value: json.dumps(value).encode()),
    )
)
def test_any_mark_is_read_without_an_error_and_goes(tmp_path, mark):
    """Fuzz: whatever bytes the attribute holds, settling reads them without a traceback,
    publishes nothing but a marked run's letters, and takes the mark off."""
    output = _marked_output(tmp_path, mark)
    settled = settle_marked_letters(output)
    assert settled is None or settled == ("aaaaaaaaaaaa", place(str(tmp_path / "D")))
    assert MARK not in os.listxattr(output)
    shutil.rmtree(tmp_path / "D", ignore_errors=True)


def test_a_published_output_moved_before_its_letters_settled_finds_them_by_its_mark(tmp_path):
    """The mark carries the key its letters are staged under (the output's name when it ran):
    a run of the moved folder settles them; a run of the old name keeps them (its mark, now
    elsewhere, decides), never removing a published run's letters as a failed run's."""
    _published_then_killed(tmp_path, "D", "aaaaaaaaaaaa")
    os.rename(tmp_path / "out", tmp_path / "archive")
    assert recover_letters(str(tmp_path / "D"), str(tmp_path / "out")) == []
    assert any(name.endswith("aaaaaaaaaaaa") for name in _tree(tmp_path / "D"))
    assert recover_letters(str(tmp_path / "D"), str(tmp_path / "archive")) == ["aaaaaaaaaaaa"]
    assert _tree(tmp_path / "D") == ["rejected-aaaaaaaaaaaa.jsonl"]


def test_a_killed_runs_marked_staging_takes_its_letters_when_cleared(tmp_path):
    """Killed before its swap: the next run's lock clears its staging folder and, by the
    folder's mark, its letters (never published: no output of it stands)."""
    _staged_run(tmp_path, "D", "aaaaaaaaaaaa")
    with publish.output_lock(str(tmp_path / "out")):
        pass
    assert _tree(tmp_path / "D") == []
