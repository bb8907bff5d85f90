"""`kvtrace render` (flags -> RenderConfig -> pipelines/render.py) and `kvtrace export` (flags ->
ExportConfig -> pipelines/export.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kvtrace.commands.common import (
    BLOCK_HELP,
    TRACE_HELP,
    BeamFlags,
    json_flag,
    json_report,
    no_beam_options,
    plan_trace_command,
    require_rows,
    stage_json,
    trace_inputs,
)
from kvtrace.transforms.errors import ConfigError


def add_parser(commands: Any) -> None:
    render = commands.add_parser(
        "render",
        help="a trace -> text requests whose tokenization reproduces it exactly",
        description=(
            "Turn a trace into text requests for OpenAI-compatible servers, aiperf or kvtrace "
            "anonymize: each block a fixed run of single-token words of the model's tokenizer "
            "that never merge across block boundaries, so the requests carry the trace's exact "
            "prefix structure and lengths. Every rendering is tokenized again and checked."
        ),
    )
    add = render.add_argument
    add("trace", nargs="+", metavar="TRACE", help=TRACE_HELP)
    add(
        "--tokenizer",
        required=True,
        metavar="NAME_OR_DIR",
        help="the served model's tokenizer (local folder, hub name or pkg:PACKAGE)",
    )
    add("-o", "--output", required=True, metavar="requests.jsonl", help="the requests")
    add("--block-size", type=int, metavar="N", help=BLOCK_HELP)
    add(
        "--shape",
        choices=("prompt", "chat"),
        default="prompt",
        help='prompt: {"prompt": text} for /v1/completions (default); chat: {"messages": '
        "[one user message]} for /v1/chat/completions, the template's own tokens counted "
        "into each request's first and last block",
    )
    add(
        "--chat-template-kwargs",
        metavar="JSON",
        default="{}",
        help="extra chat template variables for --shape chat",
    )
    add(
        "--no-verify",
        action="store_true",
        help="skip tokenizing the requests again to check them (it takes as long as anonymize)",
    )
    add("--json", metavar="OUT", help="also write the report as JSON")
    add("--verbose", action="store_true", help=argparse.SUPPRESS)


def add_export_parser(commands: Any) -> None:
    from kvtrace.transforms.write.replayers import CONSUMERS

    export = commands.add_parser(
        "export",
        help="a trace -> the file (and command) one replayer needs",
        description=(
            "Write a trace as one file in the form a replayer reads (JSONL; libCacheSim's binary "
            "oracleGeneral records), and print the "
            "command that replays it with the block size and time unit it needs. Replayers: "
            + "; ".join(f"{c.name} ({c.reader}: {c.form})" for c in CONSUMERS.values())
            + ". turns: conversations keep session_id and each follow-up turn's delay, the ms "
            "between the previous response's end and the turn (from response_ms; else the "
            "arrival gap). deltas: follow-up turns hold only what they add. agentic graph, "
            "conversations: each conversation one chain, each follow-up turn waiting for the "
            "previous one's completion plus that delay."
        ),
    )
    add = export.add_argument
    add("trace", nargs="+", metavar="TRACE", help=TRACE_HELP)
    add(
        "--to",
        required=True,
        choices=sorted(CONSUMERS),
        metavar="REPLAYER",
        help=f"one of: {', '.join(CONSUMERS)}",
    )
    add("-o", "--output", required=True, metavar="FILE", help="the file to write")
    add("--overwrite", action="store_true", help="replace --output if it exists")
    add("--block-size", type=int, metavar="N", help=BLOCK_HELP)
    add("--json", metavar="OUT", help="also write the report as JSON")
    add("--verbose", action="store_true", help=argparse.SUPPRESS)


def _published_export(report: dict, output: str) -> dict:
    """The export's report as --json writes it: its command names the output by its file name
    (run beside it), never the operator's folders."""
    from kvtrace.commands.analyze_text import input_name
    from kvtrace.transforms.write.replayers import CONSUMERS

    command = CONSUMERS[report["consumer"]].command(
        input_name(output), report["block_size"], report["rows"]
    )
    return {**report, "command": command}


def export(args: argparse.Namespace, beam_args: BeamFlags) -> int:
    from kvtrace.pipelines.export import ExportConfig, run_export
    from kvtrace.transforms.write.publish import Location

    no_beam_options(beam_args)
    files, block_size = trace_inputs(args)
    plan_trace_command(args, files, Location("--output", args.output, overwrite=args.overwrite))
    config = ExportConfig(files, args.output, args.to, block_size, args.overwrite)
    with json_report(args.json) as report_file:  # published with the output, last: both or neither

        def accept(summary: dict) -> None:  # before anything is published
            require_rows(summary["rows"], None, files)  # run_export refuses malformed rows
            stage_json(report_file, _published_export(summary, args.output))

        report = run_export(config, report_file, accept)
    print(
        f"exported {report['rows']:,} rows for {report['reader']} ({report['form']}, block "
        f"size {block_size}) -> {args.output}"
    )
    if report["follow_up_turns"]:
        print(
            f"{report['follow_up_turns']:,} follow-up turns carry a delay; "
            f"{report['delays_without_response_end']:,} of them had no response end in the "
            f"logs (their delay is the gap between arrivals)"
        )
    if report["restarted_conversations"]:
        print(
            f"{report['restarted_conversations']:,} follow-up turn(s) do not extend the previous "
            f"prompt and answer: each is sent whole, opening a new session_id. Commonly the "
            f"logged completion length (output_length) is longer than the answer as the next "
            f"prompt re-renders it (reasoning the chat template drops from history, or tokens "
            f"the log counts that the history does not hold); else the history was cut"
        )
    print(f"replay: {report['command']}\n  ({report['note']})")
    return 0


def run(args: argparse.Namespace, beam_args: BeamFlags) -> int:
    from kvtrace.pipelines.render import RenderConfig, run_render
    from kvtrace.transforms.write.publish import Location

    no_beam_options(beam_args)
    files, block_size = trace_inputs(args)
    plan_trace_command(args, files, Location("--output", args.output))
    kwargs = json_flag("--chat-template-kwargs", args.chat_template_kwargs)
    if not isinstance(kwargs, dict):
        raise ConfigError("--chat-template-kwargs must be a JSON object")
    config = RenderConfig(
        files, args.output, args.tokenizer, block_size, args.shape, not args.no_verify, kwargs
    )
    with json_report(args.json) as report_file:  # published with the output, last: both or neither

        def accept(summary: dict) -> None:  # before anything is published
            require_rows(summary["rows"], summary, files)  # warns of the malformed lines too
            stage_json(report_file, summary)

        report = run_render(config, report_file, accept)
    print(
        f"rendered {report['written']:,} of {report['rows']:,} rows as {args.shape} requests "
        f"-> {args.output} (block size {block_size})"
    )
    if report["too_short_for_the_template"]:
        print(
            f"warning: {report['too_short_for_the_template']:,} row(s) left out: no room for "
            f"a token of content (beside the chat template's own tokens, if any)",
            file=sys.stderr,
        )
    if report["merged_blocks"]:
        print(
            f"warning: {report['merged_blocks']:,} partial block(s) too short to differ from "
            f"their siblings",
            file=sys.stderr,
        )
    verified = report.get("verified")
    if verified:
        print(
            f"verified: {verified['rows_reproduced']:,} rows tokenize to exactly their blocks; "
            f"{verified['rows_not_reproduced']:,} do not"
        )
    return 1 if verified and verified["rows_not_reproduced"] else 0
