"""`kvtrace synthesize`: reshape a trace (load, prefixes, diversity, lengths, more requests) into a
new valid one, and say what each knob did (before/after statistics side by side).

The local engine reads the trace whole (as `analyze` reads it) and reshapes request by request
in causal order, since a turn builds on the previous turn's reshaped input. The Beam engine
(synthesize_beam.py) writes the same bytes from shards of conversations, for traces beyond one
machine; its before/after statistics come from analyze's Beam engine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import IO

from kvtrace.transforms import storage
from kvtrace.transforms.read.trace_io import read_trace
from kvtrace.transforms.stats.trace_stats import analyze
from kvtrace.transforms.synth.derived import (
    DERIVED_SHARD,
    Derivation,
    is_folder_output,
    sources_digest,
    write_derived,
)
from kvtrace.transforms.synth.output import jsonl_bytes
from kvtrace.transforms.synth.summary import before_and_after
from kvtrace.transforms.synth.synthesize import SynthConfig, synthesize
from kvtrace.transforms.trace_format import DEFAULT_BLOCK_SIZE, FORMAT
from kvtrace.transforms.write.publish import StagedFile, file_output, folder_output

_LOG = logging.getLogger("kvtrace")


@dataclass(frozen=True)
class SynthesizeConfig:
    inputs: tuple[str, ...]
    output: str
    block_size: int = DEFAULT_BLOCK_SIZE
    synth: SynthConfig = SynthConfig()


class TraceOutput:
    """The synthesized trace while it is staged: staging is where (the file, or the folder of a
    derived trace), write(rows) writes it and returns the staged trace file's path."""

    def __init__(self, staging: str, write: Callable[[Callable[[IO[bytes]], None]], str]):
        self.staging, self.write = staging, write


@contextmanager
def trace_output(config: SynthesizeConfig, report: StagedFile | None) -> Iterator[TraceOutput]:
    """-o FILE.jsonl: the bare trace; -o DIR: a derived trace's folder, its manifest carrying the
    block size and where the rows came from (synth/derived.py). Published when the block ends
    without an error, the report with it."""
    if not is_folder_output(config.output):
        with file_output(config.output, report=report) as staged:

            def write_file(rows: Callable[[IO[bytes]], None]) -> str:
                with staged.create() as handle:
                    rows(handle)
                return staged.staging

            yield TraceOutput(staged.staging, write_file)
        return
    with folder_output(config.output, report=report) as folder:

        def write_folder(rows: Callable[[IO[bytes]], None]) -> str:
            write_derived(folder.path, rows, config.block_size, derivation(config))
            return storage.join(folder.path, DERIVED_SHARD)

        yield TraceOutput(folder.path, write_folder)


def derivation(config: SynthesizeConfig) -> Derivation:
    """What a synthesized folder's manifest says of its rows: the traces read, every knob."""
    knobs = asdict(config.synth)
    settings = {**knobs.pop("knobs"), **knobs}
    return Derivation("synthesize", FORMAT, sources_digest(config.inputs), settings)


def run_synthesize(
    config: SynthesizeConfig,
    report: StagedFile | None = None,
    accept: Callable[[dict], None] = lambda summary: None,
) -> dict:
    """The before/after summary; the trace (and the report, which accept may stage from the
    summary) published only once accept, the command's judgement of the run, has passed."""
    started = time.perf_counter()
    with trace_output(config, report) as staged:
        source = read_trace(config.inputs)
        output = synthesize(source, config.block_size, config.synth)
        data = jsonl_bytes(output)
        staged.write(lambda handle: handle.write(data))
        summary = before_and_after(
            analyze(source, config.block_size), analyze(output, config.block_size)
        )
        accept(summary)
    _LOG.info(
        "synthesized %d rows from %d in %.1f s",
        len(output),
        len(source),
        time.perf_counter() - started,
    )
    return summary
