"""`kvtrace export`: a trace rewritten in the form one replayer reads (transforms/replay/export.py),
as one file, with the command that replays it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvtrace.transforms.read.trace_io import read_trace
from kvtrace.transforms.replay.export import export
from kvtrace.transforms.write.publish import StagedFile, file_output
from kvtrace.transforms.write.replayers import CONSUMERS


@dataclass(frozen=True)
class ExportConfig:
    inputs: tuple[str, ...]
    output: str
    consumer: str
    block_size: int
    overwrite: bool = False


def run_export(
    config: ExportConfig,
    report: StagedFile | None = None,
    accept: Callable[[dict], None] = lambda summary: None,
) -> dict:
    """The export's summary; the file (and the report, which accept may stage from the summary)
    published together, once accept has passed."""
    consumer = CONSUMERS[config.consumer]
    with file_output(config.output, config.overwrite, report=report) as output:
        trace = read_trace(config.inputs)
        if trace.malformed_count:
            first = trace.malformed[0]
            raise ValueError(
                f"{trace.malformed_count} malformed row(s), the first at "
                f"{first['file']} line {first['line']}: {first['error']} "
                f"(kvtrace validate lists them)"
            )
        exported = export(trace, consumer, config.block_size)
        output.write(exported.data)
        summary = {
            "consumer": consumer.name,
            "reader": consumer.reader,
            "form": consumer.form,
            "rows": exported.rows,
            "block_size": config.block_size,
            "follow_up_turns": exported.follow_up_turns,
            "delays_without_response_end": exported.without_response_end,
            "restarted_conversations": exported.restarted,
            "command": consumer.command(config.output, config.block_size, exported.rows),
            "note": consumer.note,
        }
        accept(summary)
    return summary
