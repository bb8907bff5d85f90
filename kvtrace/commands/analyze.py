"""`kvtrace analyze`: trace statistics, printed as text (analyze_text.py) and as JSON."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from kvtrace.commands.common import (
    BLOCK_HELP,
    TRACE_HELP,
    BeamFlags,
    add_engine_options,
    engine_options,
    json_report,
    plan_trace_command,
    require_rows,
    stage_json,
    trace_inputs,
)
from kvtrace.transforms.errors import ConfigError

if TYPE_CHECKING:
    from kvtrace.transforms.write.publish import StagedFile


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
    add(
        "--json",
        metavar="OUT",
        help="also write the full report as JSON, full precision (hit rates and shares as "
        "fractions in [0, 1], where the text prints percent)",
    )
    add(
        "-o",
        "--output",
        metavar="DIR",
        help="write analysis.txt and analysis.json there (any Beam filesystem: gs://, s3://); "
        "needed by --engine beam on a remote runner",
    )
    add(
        "--warmup-fraction",
        type=float,
        default=0.5,
        metavar="F",
        help="rows counted only after this share of rows has filled the cache (default 0.5)",
    )
    add(
        "--measured",
        metavar="FILE",
        help="the run's private measured file (OUT-rejected/measured-RUNID.jsonl): the engine's "
        "measured hit rate beside the trace's ceiling and lru at its calibrated capacity",
    )
    add_engine_options(analyze, "the same numbers from traces spread over many files")


def run(args: argparse.Namespace, beam_args: BeamFlags) -> int:
    from kvtrace.transforms.write.publish import FOLDER, Location, folder_output

    engine_options(args.engine, beam_args)
    if not 0 <= args.warmup_fraction < 1:
        raise ConfigError("--warmup-fraction must be in [0, 1)")
    files, block_size = trace_inputs(args)  # in the order given: file order matters
    plan_trace_command(
        args,
        [*files, *([args.measured] if args.measured else [])],
        Location("--output", args.output or "", FOLDER, writer="analyze"),
        private=bool(args.measured),
    )
    # What derives from the private measured file is private like it, whatever it holds.
    private = bool(args.measured)
    with json_report(args.json, private) as report:
        if not args.output:
            _analyze(args, beam_args, files, block_size, None, report)
            return 0
        # Whole, or not at all: the folder, then the report, once the work has succeeded.
        with folder_output(args.output, "analyze", report, private, gated=False) as staged:
            _analyze(args, beam_args, files, block_size, staged.path, report)
    return 0


def _analyze(
    args: argparse.Namespace,
    beam_args: BeamFlags,
    files: tuple[str, ...],
    block_size: int,
    folder: str | None,
    report_file: StagedFile | None,
) -> None:
    """The report printed, and staged into folder (--output's staging) and report_file (--json)
    when given; stops (JobStopped) when no row could be read."""
    from kvtrace.commands.analyze_text import published_report, render
    from kvtrace.pipelines.analyze_local import AnalyzeConfig, analyze_local

    config = AnalyzeConfig(files, block_size, args.warmup_fraction)
    if args.engine == "local":
        report = analyze_local(config)
    else:
        from kvtrace.pipelines.analyze_beam import analyze_beam

        report = analyze_beam(config, beam_args, folder)
    require_rows(report["total_requests"], report["problems"], files)
    text = render(report, files)  # names shown escaped (input_name): the text is UTF-8
    if args.measured:
        report["measured"], said = _measured(files, block_size, args.measured)
        text += said
    print(text)
    stage_json(report_file, report)
    if folder:
        from kvtrace.transforms import storage

        published = json.dumps(published_report(report), indent=2)
        for name, payload in (("analysis.txt", text + "\n"), ("analysis.json", published + "\n")):
            with storage.create(storage.join(folder, name), bool(args.measured)) as handle:
                handle.write(payload.encode())


def _measured(files: tuple[str, ...], block_size: int, path: str) -> tuple[dict, str]:
    """calibrate's lru numbers for the run's measured file, and their lines for the text."""
    from kvtrace.pipelines.calibrate import CalibrateConfig, run_calibrate
    from kvtrace.transforms.cache.capacity import percent

    numbers = run_calibrate(CalibrateConfig(files, path, block_size))
    numbers = {k: v for k, v in numbers.items() if k not in ("rows", "problems")}
    measured, lru = numbers["measured"], numbers["policies"]["lru"]
    lines = [
        "",
        f"Measured against simulated ({measured['requests']:,} requests with the engine's count, "
        "token-weighted):",
        f"  measured by the engine:  {percent(measured['hit_rate'])}",
        f"  infinite cache:          {percent(measured['infinite_cache_hit_rate'])}",
        *([f"  note: {measured['note']}"] if "note" in measured else []),
        f"  lru at {lru['capacity_tokens']:,} tokens (its best fit, mean error "
        f"{lru['mae_tokens']:,.1f} tokens per request): {percent(lru['simulated_hit_rate'])}",
        *([f"  {lru['verdict']}"] if lru["verdict"] else []),
    ]
    return numbers, "\n".join(lines) + "\n"
