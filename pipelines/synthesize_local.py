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
from collections.abc import Callable
from dataclasses import dataclass

from kvtrace.transforms.read.trace_io import read_trace
from kvtrace.transforms.stats.trace_stats import analyze
from kvtrace.transforms.synth.output import jsonl_bytes
from kvtrace.transforms.synth.summary import before_and_after
from kvtrace.transforms.synth.synthesize import SynthConfig, synthesize
from kvtrace.transforms.trace_format import DEFAULT_BLOCK_SIZE
from kvtrace.transforms.write.publish import StagedFile, file_output

_LOG = logging.getLogger("kvtrace")


@dataclass(frozen=True)
class SynthesizeConfig:
    inputs: tuple[str, ...]
    output: str
    block_size: int = DEFAULT_BLOCK_SIZE
    synth: SynthConfig = SynthConfig()


def run_synthesize(
    config: SynthesizeConfig,
    report: StagedFile | None = None,
    accept: Callable[[dict], None] = lambda summary: None,
) -> dict:
    """The before/after summary; the trace (and the report, which accept may stage from the
    summary) published only once accept, the command's judgement of the run, has passed."""
    started = time.perf_counter()
    with file_output(config.output, report=report) as staged:
        source = read_trace(config.inputs)
        output = synthesize(source, config.block_size, config.synth)
        staged.write(jsonl_bytes(output))
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
