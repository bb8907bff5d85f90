"""What every command shares: the trace argument, the block size from flag or manifest, its
locations planned before any work, Beam options only where a Beam engine runs, malformed-line
warnings, JSON reports."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from kvtrace.transforms.errors import ConfigError, JobStopped
from kvtrace.transforms.trace_format import DEFAULT_BLOCK_SIZE, MANIFEST, FormatError, parse_json

if TYPE_CHECKING:  # publish imports pyarrow: only a command that runs pays for it
    from kvtrace.transforms.write.publish import Location, StagedFile

TRACE_HELP = "trace file(s), glob(s) or kvtrace output folder(s)"
BLOCK_HELP = (
    f"tokens per block (default: the {MANIFEST} beside the trace, else {DEFAULT_BLOCK_SIZE})"
)


class Parser(argparse.ArgumentParser):
    """A parser that takes a flag only as spelled in full: an abbreviation (--chat-template for
    --chat-template-kwargs) would silently bind a value to another flag. Subcommand parsers are
    of their parent's class, so every parser under kvtrace's is one."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]


def add_engine_options(parser: argparse.ArgumentParser, beam: str) -> None:
    """--engine (local or beam, saying what beam does for this command) and --verbose."""
    parser.add_argument(
        "--engine",
        choices=("local", "beam"),
        default="local",
        help=f"local: this machine (default); beam: a Beam pipeline for traces beyond one "
        f"machine, {beam}. Beam options such as --runner pass through",
    )
    parser.add_argument("--verbose", action="store_true", help="show Beam's own logs")


def json_flag(flag: str, text: str) -> object:
    """A flag's JSON value, read by the one bounded parse (trace_format.parse_json); anything
    it refuses is a usage error naming the flag."""
    try:
        return parse_json(text)
    except FormatError as err:
        raise ConfigError(f"{flag}: {err}") from None


def trace_inputs(args: argparse.Namespace) -> tuple[tuple[str, ...], int]:
    """The trace files the arguments name, in the order given, and their block size
    (--block-size, else the manifests', else DEFAULT_BLOCK_SIZE; refused where they disagree)."""
    from kvtrace.transforms.read.trace_inputs import declared_block_size, trace_files

    if args.block_size is not None and args.block_size < 1:
        raise ConfigError("--block-size must be >= 1")
    files = trace_files(args.trace)
    return tuple(files), declared_block_size(files, args.block_size) or DEFAULT_BLOCK_SIZE


def plan_trace_command(
    args: argparse.Namespace, files: Sequence[str], *writes: Location, private: bool = False
) -> None:
    """A trace command's locations, checked before any work (publish.plan_locations): it reads
    the traces as given, the files they expand to and its --tokenizer (if it has one), and
    writes --json (if it has one; private: owner-only, json_report's) and writes."""
    from kvtrace.transforms.write.publish import Location, plan_locations

    report = Location("--json", getattr(args, "json", None) or "", private=private)
    plan_locations(
        [*args.trace, *files, *local_reads(getattr(args, "tokenizer", None))], [report, *writes]
    )


def local_reads(*paths: str | None) -> list[str]:
    """The files here that the paths given name (a tokenizer may be a hub name instead), a
    folder's (a tokenizer's) being those it holds: each one may be what is read."""
    reads = []
    for path in paths:
        if path and os.path.isdir(path):
            reads += [os.path.join(path, name) for name in sorted(os.listdir(path))]
        elif path and os.path.lexists(path):
            reads.append(path)
    return reads


class BeamFlags(list):
    """The flags kvtrace left to Beam, and kvtrace's own (to suggest the closest spelling of a
    flag neither knows)."""

    def __init__(self, flags: list[str], ours: set[str]):
        super().__init__(flags)
        self.ours = ours


def no_beam_options(beam_args: list[str], hint: str = "") -> None:
    """Commands (and engines) that run without Beam take no Beam options: any left is unknown."""
    if beam_args:
        raise ConfigError(f"unknown options: {' '.join(beam_args)}{hint}")


def engine_options(engine: str, beam_args: BeamFlags) -> None:
    """The local engine takes no Beam options; the Beam engine takes only those Beam knows, and
    none that runs its steps in processes kvtrace cannot supervise."""
    if engine == "local" and beam_args:
        raise ConfigError(
            f"unknown options for the local engine: {' '.join(beam_args)} "
            f"(Beam options need --engine beam)"
        )
    if engine == "beam":
        from kvtrace.options import check_beam_flags
        from kvtrace.pipelines.runner import pipeline_options, refuse_unsupervised_workers

        check_beam_flags(beam_args, beam_args.ours)
        refuse_unsupervised_workers(pipeline_options(beam_args))


def warn_malformed(problems: dict) -> None:
    """A report's malformed lines on stderr: the count and the first examples."""
    malformed = problems["malformed_lines"]
    if malformed["count"]:
        print(f"warning: {malformed['count']:,} malformed trace line(s) skipped", file=sys.stderr)
        for example in malformed["examples"][:5]:
            print(f"  {example['file']}:{example['line']}: {example['error']}", file=sys.stderr)


def write_json_report(path: str | None, report: dict, private: bool = False) -> None:
    """--json OUT: written as every output is (staged beside, then renamed: never half);
    private (owner-only) when it derives from a private file."""
    from kvtrace.transforms.write.publish import file_output

    if path:
        with file_output(path, overwrite=True, private=private) as output:
            output.write((json.dumps(report, indent=2) + "\n").encode())


@contextlib.contextmanager
def json_report(path: str | None, private: bool = False) -> Iterator[StagedFile | None]:
    """--json OUT staged for the run's output to publish with it, last (publish.file_output's
    report); None without --json. private: owner-only, for a report of a private file."""
    if not path:
        yield None
        return
    from kvtrace.transforms.write.publish import file_output

    with file_output(path, overwrite=True, private=private) as report:
        yield report


def stage_json(report: StagedFile | None, payload: dict) -> None:
    if report:
        report.write((json.dumps(payload, indent=2) + "\n").encode())


def require_rows(rows: int, problems: dict | None, files: Sequence[str]) -> None:
    """Malformed lines warned of (None: the run refused them already); a run that read no row
    stops, inside its output's block, so nothing it staged is published (exit 1)."""
    if problems is not None:
        warn_malformed(problems)
    if not rows:
        raise JobStopped(f"no trace rows could be read from {', '.join(files)}")
