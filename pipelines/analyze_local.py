"""`kvtrace analyze`: statistics of a Mooncake trace, compatible and cache-sizing.

Two drivers of one algorithm (transforms/stats/key_shards.py), the same numbers
(tests/pipelines/test_analyze_beam.py proves it):
- `analyze_local` here: the whole trace in memory as one shard, the fast path for one machine
  (it never imports Beam, which would cost a second of start-up);
- `analyze_beam`: N shards, for traces spread over many files and machines.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtrace.transforms.read.paths import file_sizes
from kvtrace.transforms.read.trace_io import read_trace
from kvtrace.transforms.stats.heap import map_arrays_apart, return_freed_heap
from kvtrace.transforms.stats.trace_stats import analyze
from kvtrace.transforms.trace_format import DEFAULT_BLOCK_SIZE

# Key shards per analysis and row shards in the Beam engine: each holds 1/N of the blocks (or
# rows) in one worker.
DEFAULT_SHARDS = 64


@dataclass(frozen=True)
class AnalyzeConfig:
    inputs: tuple[str, ...]  # files, expanded from the user's globs, in order
    block_size: int = DEFAULT_BLOCK_SIZE
    warmup_fraction: float = 0.5
    shards: int = DEFAULT_SHARDS


# From this much input (~2.5M rows of JSONL), memory matters more than the ~15% of time that
# mapping every array apart costs in system calls (heap.py): 10M rows, 305M blocks, peak at
# 5.6 GiB instead of 10.
LARGE_TRACE_BYTES = 1 << 30


def analyze_local(config: AnalyzeConfig) -> dict:
    if sum(size for _, size in file_sizes(config.inputs)) >= LARGE_TRACE_BYTES:
        map_arrays_apart()
    trace = read_trace(config.inputs)
    return_freed_heap()
    return analyze(trace, config.block_size, config.warmup_fraction)
