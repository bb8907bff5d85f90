"""`kvtrace reuse`, `simulate` and `report`: flags -> typed configs -> pipelines/.

Each reads TRACE as `analyze` does (files, globs or kvtrace output folders; the block size from
the folder's manifest unless given) and runs on this machine.
"""

from __future__ import annotations

import argparse
from typing import Any

from kvtrace.commands.common import (
    BLOCK_HELP,
    TRACE_HELP,
    BeamFlags,
    add_engine_options,
    engine_options,
    json_report,
    no_beam_options,
    plan_trace_command,
    require_rows,
    stage_json,
    trace_inputs,
    write_json_report,
)
from kvtrace.presets import load_model, models
from kvtrace.transforms.cache.capacity import (
    SIZE_HELP,
    Capacity,
    capacity_text,
    kv_bytes_per_token,
    parse_bytes,
    parse_capacities,
    parse_capacity,
    percent,
)
from kvtrace.transforms.cache.policy_names import CALIBRATED_POLICIES, POLICIES, parse_policies
from kvtrace.transforms.errors import ConfigError


def add_parsers(commands: Any) -> None:
    reuse = commands.add_parser(
        "reuse",
        help="reuse-interval CCDF, exact LRU stack distances, reuse times (plot + JSON)",
        description=(
            "How much KV cache could go to a CPU or SSD tier: the share of prompt tokens reused "
            "only after more than x tokens went through the cache (the reuse-interval CCDF), the exact "
            "LRU hit rate of every capacity from stack distances, and reuse times in seconds."
        ),
    )
    add = reuse.add_argument
    add("trace", nargs="+", metavar="TRACE", help=TRACE_HELP)
    add("--block-size", type=int, metavar="N", help=BLOCK_HELP)
    add(
        "--gpu-kv-cache-size",
        metavar="SIZE",
        help=f"GPU KV cache size: {SIZE_HELP}. Draws the red reference lines and reports "
        "ccdf_at_gpu_kv_cache_size",
    )
    _add_bytes_source(reuse)
    add(
        "-o",
        "--output",
        default="block_reuse_distribution.png",
        metavar="PNG",
        help="plot file (default block_reuse_distribution.png)",
    )
    add("--json", metavar="OUT", help="also write the numbers as JSON")
    add_engine_options(reuse, "the CCDF and reuse times (stack distances need one machine)")

    simulate = commands.add_parser(
        "simulate",
        help="hit rate against cache capacity per eviction policy, two-tier sizing",
        description=(
            "Replay the trace through KV caches of the given capacities. Per request the hit is "
            "the longest cached prefix of its blocks (token-weighted); policies lru, "
            "prefix-lru (leaf-first, running request pinned), fifo, belady (offline optimum), "
            "and the block policies s3-fifo, sieve, arc, tinylfu (W-TinyLFU)."
        ),
        epilog="example: kvtrace simulate trace.jsonl --capacity 3M,50M --model qwen3-8b "
        "--tier2-capacity 100GB,1TB",
    )
    add = simulate.add_argument
    add("trace", nargs="+", metavar="TRACE", help=TRACE_HELP)
    add("--block-size", type=int, metavar="N", help=BLOCK_HELP)
    _add_sizing_options(
        simulate,
        required=True,
        capacity=f"comma-separated capacities: {SIZE_HELP}",
        tier2="CPU/SSD tier capacities behind each GPU capacity: a two-tier LRU grid",
    )
    add(
        "--decode-cache",
        action="store_true",
        help="also cache each request's output blocks after it (output_hash_ids, from kvtrace "
        "anonymize --emit-output-hashes), so later turns can hit what earlier turns generated",
    )
    add(
        "--warmup-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="count only rows after this share of rows, which still fill the cache (default "
        "0: every row; kvcache-simulator measures with 0.5)",
    )
    add("--json", metavar="OUT", help="also write the numbers as JSON")
    add("--verbose", action="store_true", help=argparse.SUPPRESS)

    report = commands.add_parser(
        "report",
        help="one self-contained HTML page: lengths, rates, hit rates, CCDF, policies",
        description="Everything a cache sizing needs, plotted on one HTML page with the images "
        "embedded (it loads nothing from the network).",
    )
    add = report.add_argument
    add("trace", nargs="+", metavar="TRACE", help=TRACE_HELP)
    add("--block-size", type=int, metavar="N", help=BLOCK_HELP)
    add("-o", "--output", required=True, metavar="HTML", help="the page to write")
    add("--overwrite", action="store_true", help="replace --output if it exists")
    add(
        "--gpu-kv-cache-size",
        metavar="SIZE",
        help=f"the GPU KV cache the headline and the CCDF's reference lines describe: "
        f"{SIZE_HELP}; default 50 GiB (an 80 GB H100 at vLLM's default memory use, less an "
        f"8B model's weights), in tokens at --model's bytes per token or else Llama-3.1-8B's, "
        f"said so on the page",
    )
    _add_sizing_options(
        report,
        required=False,
        capacity="capacities of the policy curves, as simulate takes them (default: 8, "
        "log-spaced over the trace's own reuse distances)",
        tier2="CPU/SSD tier capacities of the sizing grid's columns (default: as its rows)",
    )
    add(
        "--measured",
        metavar="FILE",
        help="the run's private measured file (OUT-rejected/measured-RUNID.jsonl): adds the "
        "engine's measured hit rate beside the trace's ceiling and simulated ones, calibrated",
    )
    add("--verbose", action="store_true", help=argparse.SUPPRESS)

    calibrate = commands.add_parser(
        "calibrate",
        help="the cache capacity, per policy, that explains the engine's measured cached tokens",
        description=(
            "Fit the trace's simulated per-request hits to the cached tokens the serving engine "
            "reported (the run's private measured file, beside its dead letters): per policy, the "
            "capacity of least mean absolute error per request, the error, the hit rates "
            "measured and simulated, and plainly when no capacity explains the logs."
        ),
        epilog="example: kvtrace calibrate night --measured night-rejected/measured-RUNID.jsonl "
        "-o fit.png",
    )
    add = calibrate.add_argument
    add("trace", nargs="+", metavar="TRACE", help=TRACE_HELP)
    add("--block-size", type=int, metavar="N", help=BLOCK_HELP)
    add(
        "--measured",
        required=True,
        metavar="FILE",
        help="the run's measured file, OUT-rejected/measured-RUNID.jsonl: each row's cached "
        "tokens as its log reported them (private: never publish it)",
    )
    add(
        "--policy",
        default="lru",
        metavar="LIST",
        help=f"comma-separated, of {', '.join(CALIBRATED_POLICIES)} (default lru: every "
        "capacity in one pass; the others replay 32 log-spaced capacities each)",
    )
    add("-o", "--output", metavar="PNG", help="plot the error against capacity per policy")
    add("--json", metavar="OUT", help="also write the numbers as JSON")
    add("--verbose", action="store_true", help=argparse.SUPPRESS)


def _add_sizing_options(
    parser: argparse.ArgumentParser, required: bool, capacity: str, tier2: str
) -> None:
    """The cache-sizing options simulate and report share: capacities, policies, KV bytes per
    token (given, or from a model preset) and the tier-2 capacities."""
    parser.add_argument("--capacity", required=required, metavar="LIST", help=capacity)
    parser.add_argument(
        "--policy",
        default=",".join(POLICIES),
        metavar="LIST",
        help=f"comma-separated policies (default all: {', '.join(POLICIES)})",
    )
    _add_bytes_source(parser)
    parser.add_argument("--tier2-capacity", metavar="LIST", help=tier2)


def _add_bytes_source(parser: argparse.ArgumentParser) -> None:
    """What a token of KV cache costs, for sizes in bytes and capacities printed in GiB: given,
    or from a model preset."""
    bytes_source = parser.add_mutually_exclusive_group()
    bytes_source.add_argument(
        "--kv-bytes-per-token",
        metavar="SIZE",
        help="KV cache bytes per token, for capacities in bytes: bytes, or 128KiB (2^10)",
    )
    bytes_source.add_argument(
        "--model",
        metavar="PRESET",
        help="a model preset giving KV bytes per token: one kvtrace ships "
        f"({', '.join(models())}) or a YAML file's path",
    )
    parser.add_argument(
        "--list-models", action=ListModels, help="list the model presets kvtrace ships and exit"
    )


def _cache_sizing(args: argparse.Namespace) -> tuple[tuple[str, ...], int | None]:
    """The policies and KV bytes per token that simulate and report are given, checked."""
    return parse_policies(args.policy), _kv_bytes_per_token(args)


def _kv_bytes_per_token(args: argparse.Namespace) -> int | None:
    """--kv-bytes-per-token, or --model's, checked; None when neither is given."""
    per_token = None
    if args.kv_bytes_per_token is not None:
        try:
            per_token = parse_bytes(args.kv_bytes_per_token, 1)
        except ValueError as err:
            raise ConfigError(f"--kv-bytes-per-token: {err}") from None
        if per_token < 1:
            raise ConfigError(f"--kv-bytes-per-token must be >= 1, not {per_token}")
    if args.model:
        per_token = kv_bytes_per_token(load_model(args.model))
    return per_token


def _gpu_kv_cache_size(args: argparse.Namespace, per_token: int | None) -> Capacity | None:
    """--gpu-kv-cache-size as reuse and report take it, at least one token; None if not given."""
    if args.gpu_kv_cache_size is None:
        return None
    try:
        gpu = parse_capacity(args.gpu_kv_cache_size, per_token)
    except ValueError as err:
        raise ConfigError(f"--gpu-kv-cache-size: {err}") from None
    if gpu.tokens < 1:
        raise ConfigError(
            f"--gpu-kv-cache-size must be at least one token, not {args.gpu_kv_cache_size!r}"
        )
    return gpu


def reuse(args: argparse.Namespace, beam_args: BeamFlags) -> int:
    from kvtrace.pipelines.reuse_local import ReuseConfig, run_reuse
    from kvtrace.transforms.write.publish import Location

    engine_options(args.engine, beam_args)
    per_token = _kv_bytes_per_token(args)
    gpu = _gpu_kv_cache_size(args, per_token)
    files, block_size = trace_inputs(args)
    plan_trace_command(args, files, Location("--output", args.output))
    config = ReuseConfig(files, block_size, gpu.tokens if gpu else None, args.output, per_token)
    with json_report(args.json) as report_file:

        def accept(report: dict) -> None:  # before anything is published
            require_rows(report["rows"], report["problems"], files)
            stage_json(report_file, report)

        if args.engine == "beam":
            from kvtrace.pipelines.reuse_beam import run_reuse_beam

            report = run_reuse_beam(config, beam_args, report_file, accept)
        else:
            report = run_reuse(config, report_file, accept)
    print(
        f"{report['rows']:,} requests, {report['prompt_tokens']:,} prompt tokens, block size "
        f"{block_size}; reused across requests (infinite cache): "
        f"{percent(report['reused_token_share'])} of prompt tokens"
    )
    if "ccdf_at_gpu_kv_cache_size" in report:
        print(
            f"reused after more than {capacity_text(gpu.tokens, per_token)} went through the "
            f"cache (beyond the GPU cache): {percent(report['ccdf_at_gpu_kv_cache_size'])} of "
            f"prompt tokens"
        )
    for bucket in report["reuse_time"]:
        print(f"  reuse after {bucket['bucket']:>11}: {percent(bucket['share'])} of reused tokens")
    print(f"plot: {args.output}")
    return 0


class ListModels(argparse.Action):
    """--list-models: each shipped model preset and its KV bytes per token, then exit."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: Any, _namespace: Any, values: Any, option: Any = None) -> None:
        for name in models():
            print(f"{name:16} {kv_bytes_per_token(load_model(name)):>9,} KV bytes per token")
        parser.exit()


def simulate(args: argparse.Namespace, beam_args: BeamFlags) -> int:
    from kvtrace.pipelines.simulate import SimulateConfig, run_simulate

    no_beam_options(beam_args)
    policies, per_token = _cache_sizing(args)
    if not 0 <= args.warmup_fraction < 1:
        raise ConfigError("--warmup-fraction must be in [0, 1)")
    files, block_size = trace_inputs(args)
    plan_trace_command(args, files)
    config = SimulateConfig(
        files,
        tuple(parse_capacities(args.capacity, per_token, "--capacity")),
        policies,
        block_size,
        per_token,
        tuple(parse_capacities(args.tier2_capacity, per_token, "--tier2-capacity"))
        if args.tier2_capacity
        else (),
        args.warmup_fraction,
        args.decode_cache,
    )
    report = run_simulate(config)
    require_rows(report["rows"], report["problems"], files)  # before --json is written
    print(
        f"token-weighted hit rate (longest cached prefix per request), block size {block_size}"
        + (f", {per_token:,} KV bytes per token" if per_token else "")
    )
    print("| capacity | " + " | ".join(policies) + " |")
    print("|---" * (len(policies) + 1) + "|")
    for i, capacity in enumerate(config.capacities):
        print(
            f"| {capacity_text(capacity.tokens, per_token)} | "
            + " | ".join(percent(report["policies"][p][i]["hit_rate"]) for p in policies)
            + " |"
        )
    for point in report.get("two_tier", []):
        print(
            f"two-tier: GPU {capacity_text(point['capacity_tokens'], per_token)} + tier 2 "
            f"{capacity_text(point['tier2_capacity_tokens'], per_token)}: "
            f"{percent(point['hit_rate'])} (GPU {percent(point['gpu_hit_rate'])}, tier 2 "
            f"{percent(point['tier2_hit_rate'])})"
        )
    write_json_report(args.json, report)
    return 0


def report(args: argparse.Namespace, beam_args: BeamFlags) -> int:
    from kvtrace.pipelines.report import ReportConfig, run_report
    from kvtrace.transforms.write.publish import Location

    no_beam_options(beam_args)
    policies, per_token = _cache_sizing(args)
    gpu = _gpu_kv_cache_size(args, per_token)
    files, block_size = trace_inputs(args)
    plan_trace_command(
        args,
        [*files, *([args.measured] if args.measured else [])],
        Location("--output", args.output, overwrite=args.overwrite, private=bool(args.measured)),
    )
    run_report(
        ReportConfig(
            files,
            args.output,
            block_size,
            gpu,
            tuple(parse_capacities(args.capacity, per_token, "--capacity"))
            if args.capacity
            else (),
            policies,
            tuple(parse_capacities(args.tier2_capacity, per_token, "--tier2-capacity"))
            if args.tier2_capacity
            else (),
            per_token,
            args.overwrite,
            args.model,
            args.measured,
        ),
        lambda rows, problems: require_rows(rows, problems, files),  # before the page is written
    )
    print(f"report: {args.output}")
    return 0


def calibrate(args: argparse.Namespace, beam_args: BeamFlags) -> int:
    from kvtrace.pipelines.calibrate import CalibrateConfig, run_calibrate
    from kvtrace.transforms.write.publish import Location

    no_beam_options(beam_args)
    policies = parse_policies(args.policy, known=CALIBRATED_POLICIES)
    files, block_size = trace_inputs(args)
    plan_trace_command(
        args,
        [*files, args.measured],
        Location("--output", args.output or "", private=True),
        private=True,  # all of it derives from the private measured file
    )
    report = run_calibrate(
        CalibrateConfig(files, args.measured, block_size, policies, args.output),
        lambda rows, problems: require_rows(rows, problems, files),
    )
    measured = report["measured"]
    print(
        f"measured: {measured['requests']:,} of {report['rows']:,} requests carried the "
        f"engine's cached tokens: {percent(measured['hit_rate'])} hit (token-weighted); this "
        f"trace's infinite cache: {percent(measured['infinite_cache_hit_rate'])}"
    )
    if "note" in measured:
        print(f"  note: {measured['note']}")
    for policy, fit in report["policies"].items():
        upto = fit["capacity_tokens_upto"]
        span = (
            ""
            if upto == fit["capacity_tokens"]
            else (f" to {upto:,}" if upto is not None else " or more")
        )
        print(
            f"{policy}: best capacity {fit['capacity_tokens']:,}{span} tokens, "
            f"{fit['mae_tokens']:,.1f} tokens mean absolute error per request, simulated "
            f"{percent(fit['simulated_hit_rate'])} ({fit['hit_rate_difference']:+.1%} measured "
            "minus simulated)"
        )
        if fit["verdict"]:
            print(f"  {fit['verdict']}")
    write_json_report(args.json, report, private=True)  # of the private measured file
    if args.output:
        print(f"plot: {args.output}")
    return 0
