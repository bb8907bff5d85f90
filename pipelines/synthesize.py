"""`kvtrace synthesize`: reshape a trace (load, prefixes, diversity, lengths, more requests) into a
new valid one, and say what each knob did (before/after statistics side by side).

One machine: the trace is read whole (as `analyze` reads it) and reshaped request by request in
causal order, since a turn builds on the previous turn's reshaped input.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from transforms import storage
from transforms.stats.trace_io import Trace, read_trace
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


def summary_of(trace: Trace, block_size: int) -> dict:
    """What a user compares before and after: load, lengths, reuse, validity."""
    stats = analyze(trace, block_size)
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
    return {"before": summary_of(source, config.block_size),
            "after": summary_of(output, config.block_size),
            "malformed_lines": {"count": source.malformed_count, "examples": source.malformed[:5]}}
