"""`kvtrace analyze`: statistics of a Mooncake trace, compatible and cache-sizing.

Two engines, the same numbers (tests/test_analyze_beam.py proves it):
- `analyze_local` here: numpy over the whole trace in memory, the fast path for one machine
  (it never imports Beam, which would cost a second of start-up);
- `analyze_beam.build`: a Beam pipeline for traces spread over many files and machines.
"""

from __future__ import annotations

from dataclasses import dataclass

from transforms.stats.trace_io import read_trace
from transforms.stats.trace_stats import analyze

# Key shards per analysis and row shards in the Beam engine: each holds 1/N of the blocks (or
# rows) in one worker.
DEFAULT_SHARDS = 64


@dataclass(frozen=True)
class AnalyzeConfig:
    inputs: tuple[str, ...]  # files, expanded from the user's globs, in order
    block_size: int = 512
    warmup_fraction: float = 0.5
    shards: int = DEFAULT_SHARDS


def analyze_local(config: AnalyzeConfig) -> dict:
    return analyze(read_trace(config.inputs), config.block_size, config.warmup_fraction)
