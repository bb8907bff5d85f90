"""`kvtrace synthesize`: reshape a trace (load, prefixes, diversity, lengths, more requests) into a
new valid one, and say what each knob did (before/after statistics side by side).

The local engine reads the trace whole (as `analyze` reads it) and reshapes request by request
in causal order, since a turn builds on the previous turn's reshaped input. The Beam engine
(synthesize_beam.py) writes the same bytes from shards of conversations, for traces beyond one
machine; its before/after statistics come from analyze's Beam engine.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass

from transforms import storage
from transforms.storage import is_url
from transforms.read.trace_io import read_trace
from transforms.stats.trace_stats import analyze
from transforms.synth.output import jsonl_bytes
from transforms.synth.synthesize import SynthConfig, synthesize

_LOG = logging.getLogger("kvtrace")


@dataclass(frozen=True)
class SynthesizeConfig:
    inputs: tuple[str, ...]
    output: str
    block_size: int = 512
    synth: SynthConfig = SynthConfig()


def summary_from(stats: dict) -> dict:
    """What a user compares before and after (from an analyze report): load, lengths, reuse,
    validity."""
    rates = stats["hit_rates"]
    return {
        "requests": stats["total_requests"],
        "requests_per_minute": stats["request_rate"]["mean_per_minute"],
        "isl_mean": stats["isl_stats"]["mean"], "isl_median": stats["isl_stats"]["median"],
        "osl_mean": stats["osl_stats"]["mean"], "osl_median": stats["osl_stats"]["median"],
        "hit_rate_token_weighted": rates["token_weighted"],
        "hit_rate_after_warmup": rates["token_weighted_after_warmup"],
        "cache_hit_rate_aiperf": stats["cache_hit_rate"],
        "unique_blocks": rates["working_set"]["unique_blocks"],
        "problems": {name: found["count"] for name, found in stats["problems"].items()},
    }


def run_synthesize(config: SynthesizeConfig) -> dict:
    started = time.perf_counter()
    source = read_trace(config.inputs)
    output = synthesize(source, config.block_size, config.synth)
    with storage.create(config.output) as handle:
        handle.write(jsonl_bytes(output))
    _LOG.info("synthesized %d rows from %d in %.1f s", len(output), len(source),
              time.perf_counter() - started)
    before = analyze(source, config.block_size)
    return _summaries(before, analyze(output, config.block_size))


def run_synthesize_beam(config: SynthesizeConfig, beam_flags: list[str]) -> dict:
    """The Beam engine (embedded runner unless --runner says otherwise). --num-requests draws
    from the whole prefix tree at once, so it stays on the local engine."""
    from apache_beam.options.pipeline_options import StandardOptions

    from transforms.errors import ConfigError
    from pipelines.analyze import AnalyzeConfig
    from pipelines.analyze_beam import analyze_beam
    from pipelines.synthesize_beam import build
    from pipelines.runner import LOCAL_RUNNERS, pipeline_options, run

    if config.synth.num_requests is not None:
        raise ConfigError("--num-requests needs the whole trace in one place: use --engine local")
    config.synth.check()
    options = pipeline_options(beam_flags)
    remote = options.view_as(StandardOptions).runner not in LOCAL_RUNNERS
    if remote and not is_url(config.output):
        raise ConfigError("--engine beam on a remote runner needs -o on a filesystem its "
                          "workers can write (gs://, s3://)")
    started = time.perf_counter()
    parts_dir = config.output + ".parts"
    run(lambda p: build(p, config.inputs, parts_dir, config.block_size, config.synth), options)
    parts = storage.match(storage.join(parts_dir, "*.jsonl"))
    with storage.create(config.output) as handle:
        for part in parts:  # named by first rank: name order is output order
            with storage.open_read(part) as piece:
                shutil.copyfileobj(piece, handle)
    storage.delete(parts)
    if not is_url(parts_dir) and os.path.isdir(parts_dir):  # an empty trace writes no part
        os.rmdir(parts_dir)
    _LOG.info("synthesized %s from %d file(s) in %.1f s", config.output, len(config.inputs),
              time.perf_counter() - started)
    # Remote runners write their reports where the launcher can read them back.
    reports = (parts_dir + "-before", parts_dir + "-after") if remote else (None, None)
    before = analyze_beam(AnalyzeConfig(config.inputs, config.block_size), beam_flags, reports[0])
    after = analyze_beam(AnalyzeConfig((config.output,), config.block_size), beam_flags,
                         reports[1])
    return _summaries(before, after)


def _summaries(before: dict, after: dict) -> dict:
    malformed = before["problems"]["malformed_lines"]
    return {"before": summary_from(before), "after": summary_from(after),
            "malformed_lines": {"count": malformed["count"], "examples": malformed["examples"][:5]}}
