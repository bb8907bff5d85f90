"""An output and its report published together (publish.publish_in_place through file_output's
and folder_output's report): staged both, published only when the work's block ends without an
error, the report last, the output put back when the report cannot be published."""

from __future__ import annotations

import errno
import os

import pytest

from kvtrace.transforms.write import publish
from kvtrace.transforms.write.publish import file_output, folder_output


def _previous(tmp_path):
    out, report = tmp_path / "out.jsonl", tmp_path / "report.json"
    out.write_bytes(b"previous output")
    report.write_bytes(b"previous report")
    return out, report


def _state(out, report) -> tuple[bytes, bytes]:
    return out.read_bytes(), report.read_bytes()


def test_nothing_is_published_before_the_block_ends(tmp_path):
    out, report = _previous(tmp_path)
    with (
        file_output(str(report)) as staged_report,
        file_output(str(out), report=staged_report) as staged,
    ):
        staged.write(b"new output")
        staged_report.write(b"new report")
        assert _state(out, report) == (b"previous output", b"previous report")
    assert _state(out, report) == (b"new output", b"new report")
    assert sorted(os.listdir(tmp_path)) == ["out.jsonl", "report.json"]  # nothing staged left


def test_a_failure_in_the_block_after_staging_publishes_neither(tmp_path):
    out, report = _previous(tmp_path)
    with (
        pytest.raises(RuntimeError),
        file_output(str(report)) as staged_report,
        file_output(str(out), report=staged_report) as staged,
    ):
        staged.write(b"new output")
        staged_report.write(b"new report")
        raise RuntimeError("the command found the work wanting")
    assert _state(out, report) == (b"previous output", b"previous report")
    assert sorted(os.listdir(tmp_path)) == ["out.jsonl", "report.json"]


@pytest.mark.parametrize("fresh", [False, True])
def test_a_report_that_cannot_be_published_puts_the_output_back(tmp_path, monkeypatch, fresh):
    out, report = _previous(tmp_path)
    if fresh:
        out.unlink()
    swap_in = publish._swap_in

    def full_at_the_report(staged: str, output: str) -> str | None:
        if output == str(report):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return swap_in(staged, output)

    monkeypatch.setattr(publish, "_swap_in", full_at_the_report)
    with (
        pytest.raises(OSError),
        file_output(str(report)) as staged_report,
        file_output(str(out), report=staged_report) as staged,
    ):
        staged.write(b"new output")
        staged_report.write(b"new report")
    assert report.read_bytes() == b"previous report"
    if fresh:
        assert not out.exists()  # the new output, taken back: there was none before
    else:
        assert out.read_bytes() == b"previous output"
    assert sorted(os.listdir(tmp_path)) == ([] if fresh else ["out.jsonl"]) + ["report.json"]


def test_a_folder_and_its_report_are_put_back_together_when_their_folder_sync_fails(
    tmp_path, monkeypatch
):
    folder, report = tmp_path / "analysis", tmp_path / "report.json"
    with folder_output(str(folder), "analyze") as staged:
        (tmp_path / staged.path / "analysis.txt").write_bytes(b"previous")
    report.write_bytes(b"previous report")
    sync = publish.storage.sync_folder

    def fails_for_the_parent(path: str) -> None:
        if os.path.abspath(path) == str(tmp_path):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        sync(path)

    monkeypatch.setattr(publish.storage, "sync_folder", fails_for_the_parent)
    with (
        pytest.raises(OSError),
        file_output(str(report)) as staged_report,
        folder_output(str(folder), "analyze", staged_report) as staged,
    ):
        (tmp_path / staged.path / "analysis.txt").write_bytes(b"new")
        staged_report.write(b"new report")
    assert (folder / "analysis.txt").read_bytes() == b"previous"
    assert report.read_bytes() == b"previous report"
    assert sorted(os.listdir(tmp_path)) == ["analysis", "report.json"]


def test_without_a_rename_exchange_the_previous_output_is_put_back_too(tmp_path, monkeypatch):
    out, report = _previous(tmp_path)
    monkeypatch.setattr(publish, "_exchange", lambda first, second: False)
    swap_in = publish._swap_in

    def full_at_the_report(staged: str, output: str) -> str | None:
        if output == str(report):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return swap_in(staged, output)

    monkeypatch.setattr(publish, "_swap_in", full_at_the_report)
    with (
        pytest.raises(OSError),
        file_output(str(report)) as staged_report,
        file_output(str(out), report=staged_report) as staged,
    ):
        staged.write(b"new output")
        staged_report.write(b"new report")
    assert _state(out, report) == (b"previous output", b"previous report")
    assert sorted(os.listdir(tmp_path)) == ["out.jsonl", "report.json"]
