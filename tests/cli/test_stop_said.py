"""What a stop says it leaves (kvtrace/cli.py _Stop): what this process published first, else
what the command says its workers may have published, else nothing."""

from __future__ import annotations

import argparse

from kvtrace.cli import STOPPED, _failed, _Stop, main
from kvtrace.transforms.write import publish


def test_a_stop_names_what_this_process_published_before_it():
    stop = _Stop(argparse.Namespace(stop_leaves="the windows published so far stay"))
    assert stop._leaves("out and report.json") == (
        "stopped: published out and report.json before the stop"
    )


def test_a_stop_with_nothing_published_here_says_the_commands_word_or_nothing():
    assert _Stop(argparse.Namespace(stop_leaves="windows stay"))._leaves("") == (
        "stopped: windows stay"
    )
    assert _Stop(argparse.Namespace())._leaves("") == STOPPED


def test_a_failure_names_what_this_process_published_before_it(monkeypatch, capsys):
    """A night failing after its id map's commit says the map holds it, as a stop would."""
    monkeypatch.setattr(publish, "_PUBLISHED_HERE", publish._Published())
    _failed("the job failed: [Errno 28] No space left on device")
    assert capsys.readouterr().err == "error: the job failed: [Errno 28] No space left on device\n"
    publish.note_published(["version 2 of the id map M"])
    _failed("a worker process died by SIGKILL")
    assert capsys.readouterr().err == (
        "error: a worker process died by SIGKILL; "
        "published version 2 of the id map M before the failure\n"
    )


def test_a_run_says_only_what_it_published_not_an_earlier_runs(monkeypatch, capsys, tmp_path):
    """main called again in one process (a test, a host program): its line is its own run's."""
    monkeypatch.setattr(publish, "_PUBLISHED_HERE", publish._Published())
    publish.note_published([str(tmp_path / "an-earlier-runs-output")])
    assert main(["validate", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err == f"error: '{tmp_path / 'missing'}' matches no file\n"
