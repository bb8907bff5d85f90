"""`kvtrace analyze`: trace statistics, printed as text (analyze_text.py) and as JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvtrace.commands.common import (BLOCK_HELP, TRACE_HELP, BeamFlags, add_engine_options,
                                     engine_options, plan_trace_command,
                                     trace_inputs, warn_malformed, write_json_report)
from transforms.errors import ConfigError


def add_parser(commands: Any) -> None:
    analyze = commands.add_parser(
        "analyze",
        help="trace statistics: Dynamo/aiperf-compatible, plus causal cache-sizing hit rates",
        description=(
            "Statistics of Mooncake traces (JSONL, .gz/.zst, Parquet; ours or published ones). "
            "The compatible section equals Dynamo's `datagen analyze` and aiperf's "
            "analyze-trace; the cache-sizing section gives causal, token-weighted hit rates. "
            "Problems (broken invariants, malformed lines) are warnings, never a failure."
        ),
    )
    add = analyze.add_argument
    add("trace", nargs="+", metavar="TRACE", help=f"{TRACE_HELP}, read in order")
    add("--block-size", type=int, metavar="N", help=BLOCK_HELP)
    add("--json", metavar="OUT", help="also write the full report, full precision, as JSON")
    add("--output", metavar="DIR",
        help="write analysis.txt and analysis.json there (any Beam filesystem: gs://, s3://); "
             "needed by --engine beam on a remote runner")
    add("--warmup-fraction", type=float, default=0.5, metavar="F",
        help="rows counted only after this share of rows has filled the cache (default 0.5)")
    add_engine_options(analyze, "the same numbers from traces spread over many files")


def run(args: argparse.Namespace, beam_args: BeamFlags) -> int:
    from transforms.write.publish import FOLDER, OWN_FILES, Location, folder_output

    engine_options(args.engine, beam_args)
    if not 0 <= args.warmup_fraction < 1:
        raise ConfigError("--warmup-fraction must be in [0, 1)")
    files, block_size = trace_inputs(args)  # in the order given: file order matters
    plan_trace_command(args, files, Location("--output", args.output or "", FOLDER,
                                             writer="analyze"))
    if not args.output:
        return _analyze(args, beam_args, files, block_size, None)
    with folder_output(args.output, OWN_FILES["analyze"]) as staged:  # whole, or not at all
        code = _analyze(args, beam_args, files, block_size, staged.path)
        if code:
            staged.withdraw()
        return code


def _analyze(args: argparse.Namespace, beam_args: BeamFlags, files: tuple[str, ...],
             block_size: int, folder: str | None) -> int:
    """The report printed, and written into folder (--output's staging) when there is one."""
    from kvtrace.commands.analyze_text import render
    from pipelines.analyze_local import AnalyzeConfig, analyze_local

    config = AnalyzeConfig(files, block_size, args.warmup_fraction)
    if args.engine == "local":
        report = analyze_local(config)
    else:
        from pipelines.analyze_beam import analyze_beam

        report = analyze_beam(config, beam_args, folder)
    if report["total_requests"] == 0:
        print(f"error: no trace rows could be read from {', '.join(files)}", file=sys.stderr)
        warn_malformed(report["problems"])
        return 1
    # a name that is not UTF-8 (Linux names are bytes) is shown escaped: the text is UTF-8
    text = render(report, files).encode("utf-8", "surrogateescape").decode(
        "utf-8", "backslashreplace")
    print(text)
    write_json_report(args.json, report)
    if folder:
        from transforms import storage

        for name, payload in (("analysis.txt", text + "\n"),
                              ("analysis.json", json.dumps(report, indent=2) + "\n")):
            with storage.create(storage.join(folder, name)) as handle:
                handle.write(payload.encode())
    return 0
