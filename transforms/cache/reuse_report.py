"""The report of `kvtrace reuse`, built once for both engines: the same binned CCDF
(reuse.binned_ccdf) on both; the local engine adds exact LRU stack distances, which the Beam
engine has not (stack distances do not shard: reuse_shards.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from kvtrace.transforms.stats.trace_stats import MAX_EXAMPLES

DEFINITIONS = {
    "token_clock": "rows in (timestamp, file) order; each block advances the clock by its real "
    "tokens (the last block of a row by its remainder)",
    "reuse_event": "an occurrence of a block (an exact prefix) seen in an earlier request",
    "interval_tokens": "clock at the occurrence's start minus clock at the end of the block's "
    "previous occurrence",
    "ccdf": "y(x) = tokens of reuse events with interval > x / all prompt tokens",
    "lru_hit_rate": "token-weighted; per request the longest prefix cached in an LRU cache of "
    "C tokens (pages of block size) on arrival, then its blocks touched in order",
    "block_lru_hit_rate": "token-weighted; every block cached on arrival counts, prefix or not",
    "reuse_time": "seconds between the timestamps of a reuse event's request and the previous "
    "use's request",
}
BINNED = "exact at each listed interval (32 bins per doubling)"


def merged_problems(per_file: Iterable[dict]) -> dict:
    """Row problems of several files (trace_stats.row_problems each), counts summed, examples
    kept in file order up to MAX_EXAMPLES."""
    problems: dict = {}
    for file_problems in per_file:
        for name, found in file_problems.items():
            entry = problems.setdefault(name, {"count": 0, "examples": []})
            entry["count"] += found["count"]
            entry["examples"] = (entry["examples"] + found["examples"])[:MAX_EXAMPLES]
    return problems


def reuse_report(
    block_size: int,
    rows: int,
    prompt_tokens: int,
    reused_tokens: int,
    ccdf: tuple[np.ndarray, np.ndarray],
    reuse_time: list[dict],
    problems: dict,
    gpu_kv_cache_size: int | None,
    at_gpu: float | None,
    stack: dict[str, Any] | None = None,
) -> dict:
    """The report. stack (local engine only): {"blocks": int, "infinite_cache": dict,
    "lru_stack": dict} from the stack-distance pass."""
    share = reused_tokens / prompt_tokens if prompt_tokens else 0.0
    report: dict[str, Any] = {"block_size": block_size, "rows": rows}
    if stack:
        report["blocks"] = stack["blocks"]
    report["prompt_tokens"] = prompt_tokens
    # Keys in the order each engine has always written them (the reports are compared bytewise).
    if stack:
        report["infinite_cache"] = stack["infinite_cache"]
        report["definitions"] = DEFINITIONS
    else:
        report["definitions"] = {k: v for k, v in DEFINITIONS.items() if "lru" not in k}
        report["infinite_cache"] = {"token_weighted": share}
    report["reused_token_share"] = float(share)
    x, y = ccdf
    report["ccdf"] = {"interval_tokens": x.tolist(), "share_above": y.tolist(), "binned": BINNED}
    if stack:
        report["lru_stack"] = stack["lru_stack"]
    report["reuse_time"] = reuse_time
    report["problems"] = problems
    if gpu_kv_cache_size:
        report["gpu_kv_cache_size"] = gpu_kv_cache_size
        report["ccdf_at_gpu_kv_cache_size"] = at_gpu
    return report
