"""`kvtrace analyze`: statistics of a Mooncake trace, compatible and cache-sizing.

`analyze_local` is the fast path for one machine: numpy over the whole trace in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtrace.transforms.trace_io import read_trace
from kvtrace.transforms.trace_stats import analyze


@dataclass(frozen=True)
class AnalyzeConfig:
    inputs: tuple[str, ...]  # files, expanded from the user's globs, in order
    block_size: int = 512
    warmup_fraction: float = 0.5


def analyze_local(config: AnalyzeConfig) -> dict:
    return analyze(read_trace(config.inputs), config.block_size, config.warmup_fraction)

