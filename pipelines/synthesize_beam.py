"""`kvtrace synthesize --engine beam`: the driver of transforms/synth/steps.SynthesizeTrace, the
local engine's output byte for byte from traces beyond one machine. The pipeline writes one
part per time bucket; the launcher concatenates the parts in order."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from typing import IO

import apache_beam as beam

from kvtrace.pipelines.synthesize_local import SynthesizeConfig, trace_output
from kvtrace.transforms import storage
from kvtrace.transforms.ids.id_map import new_run_id
from kvtrace.transforms.storage import is_url
from kvtrace.transforms.synth.steps import SHARDS, SynthesizeTrace
from kvtrace.transforms.synth.summary import before_and_after
from kvtrace.transforms.synth.synthesize import SynthConfig
from kvtrace.transforms.write.publish import StagedFile, staging_folder

_LOG = logging.getLogger("kvtrace")


def build(
    pipeline: beam.Pipeline,
    inputs: tuple[str, ...],
    parts_dir: str,
    block_size: int,
    config: SynthConfig,
    shards: int = SHARDS,
) -> beam.PCollection:
    """The pipeline; its output is the paths of the parts written (one per time bucket)."""
    return pipeline | "Synthesize" >> SynthesizeTrace(inputs, parts_dir, block_size, config, shards)


def run_synthesize_beam(
    config: SynthesizeConfig,
    beam_flags: list[str],
    report: StagedFile | None = None,
    accept: Callable[[dict], None] = lambda summary: None,
) -> dict:
    """The Beam engine (embedded runner unless --runner says otherwise). --num-requests draws
    from the whole prefix tree at once, so it stays on the local engine. As run_synthesize:
    published once accept has passed."""
    from kvtrace.pipelines.analyze_beam import analyze_beam
    from kvtrace.pipelines.analyze_local import AnalyzeConfig
    from kvtrace.pipelines.runner import is_remote, pipeline_options, run
    from kvtrace.transforms.errors import ConfigError

    if config.synth.num_requests is not None:
        raise ConfigError("--num-requests needs the whole trace in one place: use --engine local")
    config.synth.check()
    options = pipeline_options(beam_flags)
    remote = is_remote(options)
    if remote and not is_url(config.output):
        raise ConfigError(
            "--engine beam on a remote runner needs -o on a filesystem its "
            "workers can write (gs://, s3://)"
        )
    started = time.perf_counter()
    # Remote runners write their reports where the launcher can read them back.
    reports = (
        (f"{config.output}.parts-before", f"{config.output}.parts-after")
        if remote
        else (None, None)
    )
    with trace_output(config, report) as output:
        # The parts are staged beside the output under the run's name, so a killed run's are
        # cleared by the next run's lock (publish.restore_interrupted), and a failed one's here.
        parts_dir = (
            staging_folder(config.output, new_run_id())
            if is_url(config.output)
            else f"{output.staging}.parts"
        )
        try:
            run(
                lambda p: build(p, config.inputs, parts_dir, config.block_size, config.synth),
                options,
            )
            parts = [n for n in storage.files_in(parts_dir) if n.endswith(".jsonl")]
            trace = output.write(lambda handle: _concatenate(parts_dir, parts, handle))
        finally:
            storage.remove_folder(parts_dir)  # an empty trace writes no part, nor the folder
        before = analyze_beam(
            AnalyzeConfig(config.inputs, config.block_size), beam_flags, reports[0]
        )
        after = analyze_beam(
            AnalyzeConfig((trace,), config.block_size), beam_flags, reports[1]
        )  # the staged trace: published only once accepted
        summary = before_and_after(before, after)
        accept(summary)
    _LOG.info(
        "synthesized %s from %d file(s) in %.1f s",
        config.output,
        len(config.inputs),
        time.perf_counter() - started,
    )
    return summary


def _concatenate(parts_dir: str, parts: list[str], handle: IO[bytes]) -> None:
    for part in parts:  # named by first rank: in order
        with storage.open_read(storage.join(parts_dir, part)) as piece:
            shutil.copyfileobj(piece, handle)
