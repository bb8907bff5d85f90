"""The flags every command shares keep one spelling: -o/--output wherever one output is written,
and sizes in bytes read by the one size parser."""

from __future__ import annotations

from kvtrace.cli import _parser


def subcommands() -> dict:
    return next(a for a in _parser()._actions if a.dest == "command").choices


def test_every_command_that_takes_output_takes_o_too():
    spelled = {
        name: next(a.option_strings for a in parser._actions if "--output" in a.option_strings)
        for name, parser in subcommands().items()
        if any("--output" in a.option_strings for a in parser._actions)
    }
    assert {"anonymize", "analyze", "reuse", "report", "synthesize"} <= set(spelled)
    assert {name for name, flags in spelled.items() if flags != ["-o", "--output"]} == set()
