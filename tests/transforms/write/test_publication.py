"""Every publication is one section (publish.publication): a stop during it is raised once it
stands whole (or is put back), and what stands whole is recorded for a stop to say
(publish.published_here); one that fails records only what stands of it once its swaps are back
(an id map's version committed), one that an enclosing one puts back nothing."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from kvtrace.transforms.write import interrupts, publish
from kvtrace.transforms.write.publish import file_output, folder_output


@pytest.fixture(autouse=True)
def _this_tests_own_record(monkeypatch) -> None:
    monkeypatch.setattr(publish, "_PUBLISHED_HERE", publish._Published())


@pytest.fixture
def stops_as_the_cli_handles_them() -> Iterator[None]:
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupts.stop())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _previous(tmp_path):
    out, report = tmp_path / "out", tmp_path / "report.json"
    out.mkdir()
    report.write_bytes(b"previous report")
    return out, report


@pytest.mark.parametrize("swap", [1, 2], ids=["the-outputs-swap", "the-reports"])
def test_a_stop_during_a_swap_is_raised_once_output_and_report_both_stand(
    tmp_path, monkeypatch, stops_as_the_cli_handles_them, swap
):
    """SIGINT as a swap returns (where CPython raises a handler's exception): the publication
    goes on, both stand new, and the stop is raised after."""
    out, report = tmp_path / "out", tmp_path / "report.json"
    report.write_bytes(b"previous report")
    swapped = []
    swap_in = publish._swap_in

    def swap_then_stop(staged: str, output: str) -> str | None:
        previous = swap_in(staged, output)
        swapped.append(output)
        if len(swapped) == swap:
            signal.raise_signal(signal.SIGINT)
        return previous

    monkeypatch.setattr(publish, "_swap_in", swap_then_stop)
    with pytest.raises(KeyboardInterrupt):
        with (
            file_output(str(report)) as staged_report,
            folder_output(str(out), "analyze", staged_report) as staged,
        ):
            (tmp_path / staged.path / "analysis.json").write_bytes(b"new output")
            staged_report.write(b"new report")
    assert (out / "analysis.json").read_bytes() == b"new output"
    assert report.read_bytes() == b"new report"
    assert publish.published_here() == f"{out} and {report}"


def test_a_publication_that_fails_records_nothing(tmp_path, monkeypatch):
    out, report = _previous(tmp_path)
    with pytest.raises(OSError):
        with (
            file_output(str(report)) as staged_report,
            folder_output(str(out), "analyze", staged_report) as staged,
        ):
            (tmp_path / staged.path / "analysis.json").write_bytes(b"new output")
            staged_report.write(b"new report")
            monkeypatch.setattr(publish.storage, "sync_folder", _full_disk)
    assert report.read_bytes() == b"previous report" and not (out / "analysis.json").exists()
    assert publish.published_here() == ""


@pytest.mark.parametrize(
    ("standing", "said"),
    [
        (lambda: ["version 3 of the id map M"], "version 3 of the id map M"),
        (publish.only_swaps, ""),
        (None, ""),  # cannot be told: nothing claimed
        (lambda: _full_disk("M"), ""),  # unreadable: the failure's own error is said
    ],
    ids=["committed", "swaps-only", "untold", "unreadable"],
)
def test_a_publication_that_fails_past_a_step_that_stands_records_it(standing, said):
    """A failure inside the publication, past a step that is no swap (the id map's version
    committed, then its mark's folder full): what stands is read as a hard end reads it."""
    with pytest.raises(OSError, match="No space left"):
        with publish.publication(standing):
            _full_disk("marks")
    assert publish.published_here() == said


def _full_disk(folder: str) -> None:
    raise OSError(28, "No space left on device", folder)


def test_a_new_file_whose_report_is_put_back_records_nothing(tmp_path, monkeypatch):
    """Without --overwrite the file is linked in first (an inner publication), then its report;
    a report that cannot be published takes the file back out, and neither is recorded."""
    out, report = tmp_path / "out.jsonl", tmp_path / "report.json"
    monkeypatch.setattr(publish, "_swap_in", lambda staged, output: _full_disk(output))
    with pytest.raises(OSError):
        with (
            file_output(str(report)) as staged_report,
            file_output(str(out), overwrite=False, report=staged_report) as staged,
        ):
            staged.write(b"new output")
            staged_report.write(b"new report")
    assert not out.exists() and not report.exists()
    assert publish.published_here() == ""


def test_what_a_stop_says_is_bounded_to_the_latest_publications(tmp_path):
    names = []
    for i in range(5):
        names.append(str(tmp_path / f"out{i}.jsonl"))
        with file_output(names[-1]) as staged:
            staged.write(b"rows")
        if i == 0:
            assert publish.published_here() == names[0]
        if i == 2:
            assert publish.published_here() == f"{names[0]}, {names[1]} and {names[2]}"
    assert publish.published_here() == f"5 outputs, the last {', '.join(names[2:])}"


def _staged_folders(tmp_path, *names: str) -> list[tuple[str, str]]:
    """Each output `name` published before (holding `old`), and a staging folder for it."""
    pairs = []
    for name in names:
        output = tmp_path / name
        output.mkdir()
        (output / "old").write_bytes(b"previous")
        publish.mark_output(str(output), "analyze")
        staging = tmp_path / f".{name}.staged"
        staging.mkdir()
        (staging / "new").write_bytes(b"new")
        publish.mark_output(str(staging), "analyze")
        pairs.append((str(staging), str(output)))
    return pairs


def test_a_stop_during_the_first_of_two_nested_publications_waits_for_the_second(
    tmp_path, monkeypatch, stops_as_the_cli_handles_them
):
    """A night's trace and its block hashes (anonymize_night.publish_staged): one publication,
    so a stop as the first swaps in is raised once the second stands too."""
    (trace, hashes) = _staged_folders(tmp_path, "out", "hashes")
    swap_in = publish._swap_in

    def swap_then_stop(staged: str, output: str) -> str | None:
        previous = swap_in(staged, output)
        if output == trace[1]:
            signal.raise_signal(signal.SIGINT)
        return previous

    monkeypatch.setattr(publish, "_swap_in", swap_then_stop)
    with pytest.raises(KeyboardInterrupt):
        with publish.publication():
            publish.publish_folder(*trace)
            publish.publish_folder(*hashes)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["new"]
    assert sorted(p.name for p in (tmp_path / "hashes").iterdir()) == ["new"]
    assert publish.published_here() == f"{trace[1]} and {hashes[1]}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hashes", "out"]  # previous ones gone


def test_a_nested_publication_is_put_back_when_its_enclosing_one_fails(tmp_path):
    """The second output refused (a foreign file): the first, swapped in already, goes back,
    its previous output whole, and nothing is recorded."""
    (trace, hashes) = _staged_folders(tmp_path, "out", "hashes")
    (tmp_path / "hashes" / "foreign").write_bytes(b"not kvtrace's")
    with pytest.raises(publish.OutputRefused, match="hashes holds files"):
        with publish.publication():
            publish.publish_folder(*trace)
            publish.publish_folder(*hashes)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["old"]
    assert sorted(p.name for p in (tmp_path / trace[0]).iterdir()) == ["new"]
    assert publish.published_here() == ""
