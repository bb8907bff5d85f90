"""What a stop says it leaves (kvtrace/cli.py _Stop): what this process published first, else
what the command says its workers may have published, else nothing."""

from __future__ import annotations

import argparse

from kvtrace.cli import STOPPED, _Stop


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
