"""`kvtrace synthesize`: flags -> SynthesizeConfig -> pipelines/synthesize.py, and the summary."""

from __future__ import annotations

import argparse
import math
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
from kvtrace.transforms.cache.capacity import percent
from kvtrace.transforms.errors import ConfigError

if TYPE_CHECKING:
    from kvtrace.transforms.write.publish import Location

ROWS = (
    ("requests", "requests", "{:,.0f}".format),
    ("requests_per_minute", "requests / minute (mean)", "{:,.1f}".format),
    ("isl_mean", "input length, mean", "{:,.1f}".format),
    ("isl_median", "input length, median", "{:,.0f}".format),
    ("osl_mean", "output length, mean", "{:,.1f}".format),
    ("osl_median", "output length, median", "{:,.0f}".format),
    # Rates in percent, as analyze and the report print them; --json keeps the fractions.
    ("hit_rate_token_weighted", "hit rate, token-weighted (infinite cache)", percent),
    ("hit_rate_after_warmup", "  the same, last 50% of rows", percent),
    ("cache_hit_rate_aiperf", "aiperf/Dynamo cache_hit_rate (per-row mean)", percent),
    ("unique_blocks", "unique blocks (working set)", "{:,.0f}".format),
)
# The float knobs' ranges: a timestamp divided by the ratio, or a length multiplied, stays a
# number the trace's int64 columns (and a replayer) can hold, whatever the trace's span.
SPEEDUP_RANGE = (1e-6, 1e6)
MULTIPLIER_RANGE = (0.0, 1e3)


def add_parser(commands: Any) -> None:
    synthesize = commands.add_parser(
        "synthesize",
        help="reshape a trace: load, prefix lengths and diversity, lengths, more "
        "requests; every output row valid",
        description=(
            "Reshape a Mooncake trace into the workload a benchmark needs (speed-up, prefix and prompt lengths, output lengths, conversations): "
            "speed-up, longer or shorter shared prefixes, more prefix trees, longer or shorter "
            "unique parts, length bounds, and new requests drawn from the trace. Conversations "
            "stay in one tree and keep each turn's prefix equal to the previous turn's input; "
            "the same --seed gives the same bytes. Prints the statistics before and after."
        ),
    )
    add = synthesize.add_argument
    add("trace", nargs="+", metavar="TRACE", help=TRACE_HELP)
    add(
        "-o",
        "--output",
        required=True,
        metavar="DIR|OUT.jsonl",
        help="a folder to hold the trace and its manifest.json (its block size and where it came "
        "from, which every command reading it takes), or a bare .jsonl (block size 512 only)",
    )
    add("--block-size", type=int, metavar="N", help=BLOCK_HELP)
    add("--seed", type=int, default=0, help="random seed (default 0)")
    add(
        "--speedup-ratio",
        type=float,
        default=1.0,
        metavar="R",
        help="divide timestamps by R (2: twice the load)",
    )
    add(
        "--prefix-len-multiplier",
        type=float,
        default=1.0,
        metavar="P",
        help="scale the prefixes shared across conversations by P (within a block)",
    )
    add(
        "--prefix-root-multiplier",
        type=int,
        default=1,
        metavar="K",
        help="spread conversations over K copies of the prefix tree with disjoint ids",
    )
    add(
        "--prompt-len-multiplier",
        type=float,
        default=1.0,
        metavar="Q",
        help="scale each request's own (unique) part by Q",
    )
    add("--osl-multiplier", type=float, default=1.0, metavar="M", help="scale output lengths")
    add("--min-isl", type=int, metavar="N", help="drop requests shorter than N input tokens")
    add("--max-isl", type=int, metavar="N", help="drop requests longer than N input tokens")
    add("--min-osl", type=int, metavar="N", help="raise output lengths to at least N")
    add("--max-osl", type=int, metavar="N", help="cap output lengths at N")
    add(
        "--num-requests",
        type=int,
        metavar="N",
        help="draw N new requests from the trace's prefix tree, lengths and arrivals first",
    )
    add(
        "--json",
        metavar="SUMMARY",
        help="also write the before/after statistics as JSON, full precision (hit rates as "
        "fractions in [0, 1], where the table prints percent)",
    )
    add_engine_options(synthesize, "the same bytes (not with --num-requests)")


def run(args: argparse.Namespace, beam_args: BeamFlags) -> int:
    from kvtrace.pipelines.synthesize_local import SynthesizeConfig, run_synthesize
    from kvtrace.transforms.synth.derived import bare_file_refusal
    from kvtrace.transforms.synth.reshape import Knobs
    from kvtrace.transforms.synth.synthesize import SynthConfig

    engine_options(args.engine, beam_args)
    check_knobs(args)
    files, block_size = trace_inputs(args)
    refusal = bare_file_refusal("-o", args.output, block_size)
    if refusal:
        raise ConfigError(refusal)
    plan_trace_command(args, files, _output_location(args.output))
    synth = SynthConfig(
        Knobs(args.prefix_len_multiplier, args.prompt_len_multiplier, args.prefix_root_multiplier),
        args.speedup_ratio,
        args.osl_multiplier,
        args.min_isl,
        args.max_isl,
        args.min_osl,
        args.max_osl,
        args.num_requests,
        args.seed,
    )
    try:
        synth.check()
    except ValueError as err:
        raise ConfigError(str(err)) from None
    config = SynthesizeConfig(files, args.output, block_size, synth)
    with json_report(args.json) as report:

        def accept(summary: dict) -> None:  # before anything is published
            require_rows(summary["before"]["requests"], summary, files)
            stage_json(report, summary)

        if args.engine == "beam":  # Beam (and gRPC) loaded only for its engine, as analyze does
            from kvtrace.pipelines.synthesize_beam import run_synthesize_beam

            summary = run_synthesize_beam(config, beam_args, report, accept)
        else:
            summary = run_synthesize(config, report, accept)
    print(f"| block size {block_size} | before | after |\n|---|---|---|")
    for key, label, shown in ROWS:
        print(f"| {label} | {shown(summary['before'][key])} | {shown(summary['after'][key])} |")
    problems = sum(summary["after"]["problems"].values())
    validity = "valid" if not problems else f"{problems} problems"
    print(f"output: {args.output} ({validity}, {_carries(args.output, block_size)})")
    return 0


def _output_location(output: str) -> Location:
    from kvtrace.transforms.synth.derived import is_folder_output
    from kvtrace.transforms.write.publish import FILE, FOLDER, Location

    if is_folder_output(output):
        return Location("--output", output, FOLDER, writer="synthesize")
    return Location("--output", output, FILE)


def _carries(output: str, block_size: int) -> str:
    """What tells the trace's readers its block size."""
    from kvtrace.transforms.synth.derived import is_folder_output

    if is_folder_output(output):
        return f"block size {block_size} and provenance in its manifest.json"
    return f"block size {block_size}, every reader's default"


def check_knobs(args: argparse.Namespace) -> None:
    """Every numeric option finite and in range before any work (NaN fails every comparison,
    so each range is written as what must hold)."""
    knobs = [("--speedup-ratio", args.speedup_ratio, SPEEDUP_RANGE)] + [
        (f"--{name.replace('_', '-')}", getattr(args, name), MULTIPLIER_RANGE)
        for name in ("prefix_len_multiplier", "prompt_len_multiplier", "osl_multiplier")
    ]
    for flag, value, (low, high) in knobs:
        if not (math.isfinite(value) and low <= value <= high):
            raise ConfigError(f"{flag} must be a number in [{low:g}, {high:g}], not {value!r}")
    for name in ("min_isl", "max_isl", "min_osl", "max_osl"):
        value = getattr(args, name)
        if value is not None and value < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 0, not {value}")
