"""`kvtrace convert`: a Bailian usage trace -> Mooncake rows with sessions."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from kvtrace.commands.common import BeamFlags, no_beam_options
from kvtrace.transforms.errors import ConfigError, JobStopped
from kvtrace.transforms.trace_format import SESSION_FIELD

if TYPE_CHECKING:
    from kvtrace.transforms.read.bailian import Converted


def add_parser(commands: Any) -> None:
    convert = commands.add_parser(
        "convert",
        help="Alibaba Bailian usage traces -> Mooncake rows with sessions",
        description=(
            "Convert a Bailian usage trace (chat_id / parent_chat_id, timestamps in seconds, "
            "16-token blocks) into Mooncake rows: timestamps in ms, a `session` per "
            "conversation (found through parent_chat_id), hash_ids as given. The output is a "
            "folder with manifest.json (block size 16), which analyze, simulate, synthesize, "
            "export and render read the block size from."
        ),
    )
    add = convert.add_argument
    add("trace", metavar="BAILIAN.jsonl", help="a Bailian trace file (.jsonl, .gz or .zst)")
    add(
        "-o",
        "--output",
        required=True,
        metavar="DIR",
        help="a folder to hold trace-00000-of-00001.jsonl and its manifest.json (block size 16 "
        "and where the rows came from); a bare .jsonl is refused: nothing would say its block "
        "size",
    )
    add("--verbose", action="store_true", help=argparse.SUPPRESS)


def run(args: argparse.Namespace, beam_args: BeamFlags) -> int:
    from kvtrace.transforms.read.bailian import BAILIAN_BLOCK_SIZE, trace_jsonl
    from kvtrace.transforms.synth.derived import (
        DERIVED_SHARD,
        Derivation,
        bare_file_refusal,
        sources_digest,
        write_derived,
    )
    from kvtrace.transforms.write.publish import FOLDER, Location, folder_output, plan_locations

    no_beam_options(beam_args)
    refusal = bare_file_refusal("-o", args.output, BAILIAN_BLOCK_SIZE)
    if refusal:  # Bailian's blocks are not every reader's default size
        raise ConfigError(refusal)
    plan_locations([args.trace], [Location("--output", args.output, FOLDER, writer="convert")])
    target = f"{args.output.rstrip('/')}/{DERIVED_SHARD}"
    with folder_output(args.output) as staged:  # published whole, so its manifest last
        converted = _converted(args.trace)
        shard = trace_jsonl(converted.rows)
        derivation = Derivation("convert", "bailian", sources_digest([args.trace]))
        write_derived(
            staged.path, lambda handle: handle.write(shard), BAILIAN_BLOCK_SIZE, derivation
        )
    sessions = len({row[SESSION_FIELD] for row in converted.rows})
    print(
        f"converted {len(converted.rows):,} rows in {sessions:,} sessions -> {target} "
        f"(block size {BAILIAN_BLOCK_SIZE}, in its manifest.json)"
    )
    return 0


def _converted(trace: str) -> Converted:
    """The trace converted, its skipped lines said; inside the output's block, a trace with no
    row to convert stops the run there (JobStopped), so nothing is published."""
    from kvtrace.transforms.read.bailian import convert as to_mooncake
    from kvtrace.transforms.read.paths import lines_within
    from kvtrace.transforms.read.trace_io import MAX_TRACE_LINE_BYTES

    converted = to_mooncake(lines_within(trace, MAX_TRACE_LINE_BYTES))
    if converted.malformed:
        print(f"warning: {converted.malformed:,} line(s) skipped", file=sys.stderr)
        for example in converted.examples:
            print(f"  {example}", file=sys.stderr)
    if not converted.rows:
        raise JobStopped(f"no Bailian rows could be read from {trace}")
    return converted
