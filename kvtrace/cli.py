"""The `kvtrace` command: registers each command group (kvtrace/commands/) and runs the one asked.

Flags kvtrace does not know are Beam pipeline options (--runner, --direct_num_workers, --project,
...) and pass through to Beam unchanged; a flag neither knows is an error. Every error is one
line on stderr: exit 2 for a run refused before it started, 1 for a job that stopped.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence

from kvtrace import __version__
from kvtrace.commands import analyze, anonymize, cache, check, convert, replay, synthesize
from kvtrace.commands.common import BeamFlags
from kvtrace.options import refuse_stray_words
from transforms.encode.salt import SaltError
from transforms.errors import ConfigError, IdMapError

_LOG = logging.getLogger("kvtrace")
COMMANDS: dict[str, Callable[[argparse.Namespace, BeamFlags], int]] = {
    "anonymize": anonymize.run, "analyze": analyze.run, "reuse": cache.reuse,
    "simulate": cache.simulate, "report": cache.report, "synthesize": synthesize.run,
    "validate": check.validate, "audit": check.audit, "convert": convert.run,
    "render": replay.run, "export": replay.export,
}
# A value such as -3M given to an option (argparse would take it for an option of its own).
NEGATIVE_NUMBER = re.compile(r"-\.?\d")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvtrace",
        description="Turn LLM request logs into anonymized Mooncake-format traces.",
    )
    parser.add_argument("--version", action="version", version=f"kvtrace {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    anonymize.add_parser(commands)
    analyze.add_parser(commands)
    cache.add_parsers(commands)
    synthesize.add_parser(commands)
    check.add_parsers(commands)
    check.add_audit_parser(commands)
    convert.add_parser(commands)
    replay.add_parser(commands)
    replay.add_export_parser(commands)
    return parser


def _configure_logging(verbose: bool) -> None:
    """kvtrace's own progress at INFO; Beam (which logs every bundle, and a worker's failure with
    its traceback) and transformers only on --verbose: a failure is the one line main prints.
    Runs before Beam is imported, which logs warnings at import time."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger().setLevel(logging.INFO if verbose else logging.CRITICAL)
    _LOG.setLevel(logging.INFO)
    if not verbose:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # inherited by worker processes


def _our_flags(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of every subcommand."""
    return {
        option
        for action in parser._subparsers._group_actions  # the subcommands
        for subparser in action.choices.values()
        for sub_action in subparser._actions
        for option in sub_action.option_strings
    }


def _with_dashes(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """Launchers (Dataflow Flex Templates, Airflow's Beam operator) spell every option with
    underscores, as Beam does: --id_map=DIR. kvtrace's own flags take dashes, so respell those;
    Beam's options pass through as they are."""
    ours = _our_flags(parser)
    respelled: list[str] = []
    for arg in argv:
        name, sep, value = arg.partition("=")
        dashed = name.replace("_", "-")
        if respelled and respelled[-1] in ours and NEGATIVE_NUMBER.match(arg):
            respelled[-1] += f"={arg}"  # --capacity -3M: a value, for the option to judge
            continue
        respelled.append(dashed + sep + value if name.startswith("--") and dashed in ours else arg)
    return respelled


def _refuse_misspelled(command: str, leftovers: list[str], parser: argparse.ArgumentParser) -> None:
    """An option a command does not know but that is close to one it does is a typo: say so at
    once, whichever command (the rest are Beam options, or refused by commands without Beam)."""
    (subparsers,) = parser._subparsers._group_actions
    known = [o for a in subparsers.choices[command]._actions for o in a.option_strings]
    for arg in leftovers:
        name = arg.split("=", 1)[0]
        if name.startswith("-"):
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
            if close:
                raise ConfigError(f"unknown option {name} (did you mean {close[0]}?); see "
                                  f"kvtrace {command} --help")


def _stray_words(leftovers: list[str]) -> list[str]:
    """Words argparse left that follow no flag, so cannot be a Beam option's value either (an
    unquoted glob expanded by the shell, given to an option that takes one value)."""
    return [word for before, word in zip([""] + leftovers, leftovers)
            if not word.startswith("-") and not (before.startswith("--") and "=" not in before)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args, leftovers = parser.parse_known_args(
        _with_dashes(sys.argv[1:] if argv is None else argv, parser)
    )
    _configure_logging(args.verbose)
    run = COMMANDS[args.command]
    try:
        _refuse_misspelled(args.command, leftovers, parser)
        refuse_stray_words(_stray_words(leftovers))
        return run(args, BeamFlags(leftovers, _our_flags(parser)))
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 130
    except (ConfigError, SaltError, IdMapError, FileNotFoundError, ValueError, OSError) as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    except Exception as err:  # never a traceback: say what failed, and how to see more
        if args.verbose:
            raise
        print(f"error: the job failed: {type(err).__name__}: {_one_line(err)} "
              f"(run with --verbose for the traceback)", file=sys.stderr)
        return 1


def _one_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0][:500] if lines else type(err).__name__


if __name__ == "__main__":
    sys.exit(main())
