"""`kvtrace convert`: a Bailian usage trace -> Mooncake rows with sessions."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from kvtrace.commands.common import BeamFlags, no_beam_options
from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.trace_format import FORMAT, MANIFEST, SESSION_FIELD, shard_name

if TYPE_CHECKING:
    from kvtrace.transforms.read.bailian import Converted


def add_parser(commands: Any) -> None:
    convert = commands.add_parser(
        "convert",
        help="Alibaba Bailian usage traces -> Mooncake rows with sessions",
        description=(
            "Convert a Bailian usage trace (chat_id / parent_chat_id, timestamps in seconds, "
            "16-token blocks) into Mooncake rows: timestamps in ms, a `session` per "
            "conversation (found through parent_chat_id), hash_ids as given. With -o DIR the "
            "output is a folder with manifest.json (block size 16), which analyze, simulate "
            "and synthesize read the block size from."
        ),
    )
    add = convert.add_argument
    add("trace", metavar="BAILIAN.jsonl", help="a Bailian trace file (.jsonl, .gz or .zst)")
    add(
        "-o",
        "--output",
        required=True,
        metavar="OUT.jsonl|DIR",
        help="a .jsonl file, or a folder to hold trace-00000-of-00001.jsonl and manifest.json",
    )
    add("--verbose", action="store_true", help=argparse.SUPPRESS)


def run(args: argparse.Namespace, beam_args: BeamFlags) -> int:
    from kvtrace.transforms import storage
    from kvtrace.transforms.read.bailian import BAILIAN_BLOCK_SIZE, trace_jsonl
    from kvtrace.transforms.write.publish import (
        FILE,
        FOLDER,
        Location,
        file_output,
        folder_output,
        plan_locations,
        sha256_of,
    )

    no_beam_options(beam_args)
    to_file = args.output.endswith(".jsonl")
    plan_locations(
        [args.trace],
        [Location("--output", args.output, FILE if to_file else FOLDER, writer="convert")],
    )
    if to_file:
        target = args.output
        with file_output(target) as output:
            converted = _converted(args.trace)
            output.write(trace_jsonl(converted.rows))
    else:
        trace_file = shard_name(0, 1, ".jsonl")
        target = storage.join(args.output.rstrip("/"), trace_file)
        with folder_output(args.output) as staged:  # published whole, so its manifest last
            converted = _converted(args.trace)
            shard = trace_jsonl(converted.rows)
            with storage.create(storage.join(staged.path, trace_file)) as handle:
                handle.write(shard)
            # sha256 and records.exported: what readers check a kvtrace folder against.
            manifest = {
                "format": FORMAT,
                "block_size": BAILIAN_BLOCK_SIZE,
                "converted_from": "bailian",
                "rows": len(converted.rows),
                "files": [trace_file],
                "sha256": {trace_file: sha256_of(shard)},
                "records": {"exported": len(converted.rows)},
            }
            with storage.create(storage.join(staged.path, MANIFEST)) as handle:
                handle.write(json.dumps(manifest, indent=2).encode())
    sessions = len({row[SESSION_FIELD] for row in converted.rows})
    print(
        f"converted {len(converted.rows):,} rows in {sessions:,} sessions -> {target} "
        f"(block size {BAILIAN_BLOCK_SIZE})"
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
