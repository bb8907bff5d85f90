"""`kvtrace validate`: the consistency checks a user runs on a trace before a benchmark.

Every check is a named rule with a count of the rows (or ids) breaking it and examples. The block
size is checked two ways: rows must have ceil(input_length / B) ids at the declared B, and B is
inferred from the rows alone (a row of n ids and L tokens fits B only when (n-1) B < L <= n B),
so ids made at one block size and replayed at another (aiperf#1208) are caught even when
every row happens to be consistent with more than one B.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvtrace.transforms.read.trace_io import Trace
from kvtrace.transforms.stats.trace_blocks import Blocks
from kvtrace.transforms.stats.trace_stats import MAX_EXAMPLES, problems

_UNBOUNDED = 1 << 62  # no upper bound (rows of one id)
RULES = {
    "malformed_lines": "every line is a JSON object with integer timestamp, input_length, "
    "output_length and a list of integer hash_ids",
    "hash_ids_length_mismatch": "len(hash_ids) == ceil(input_length / block_size)",
    "ids_at_several_positions": "every hash id is always at the same position",
    "ids_behind_several_parents": "every hash id always follows the same parent id",
    "negative_timestamps": "timestamps are >= 0",
    "timestamps_backwards": "timestamps never go backwards (rows in time order)",
    "block_size": "the rows fit the declared block size",
}


@dataclass(frozen=True)
class BlockSizeFit:
    """Block sizes the rows fit: every row in low..high (high None: no upper bound), and the
    one most rows fit (a power of two, else the smallest, if several) with how many do."""

    low: int
    high: int | None
    best: int
    best_rows: int
    rows: int  # rows with ids

    def fits_all(self, block_size: int) -> bool:
        return self.low <= block_size and (self.high is None or block_size <= self.high)

    def describe(self) -> str:
        if self.rows == 0:
            return "no row has ids"
        if self.high is not None and self.low > self.high:
            return (
                f"no block size fits every row; {self.best} fits most ({self.best_rows:,} "
                f"of {self.rows:,} rows)"
            )
        if self.high == self.low:
            return f"the rows fit block size {self.low} only"
        upper = "any larger" if self.high is None else f"{self.high}"
        return f"the rows fit block sizes {self.low} to {upper}"


def block_size_fit(trace: Trace) -> BlockSizeFit:
    lengths, isl = trace.lengths, trace.input_length
    has = lengths > 0
    n, tokens = lengths[has], isl[has]
    if not len(n):
        return BlockSizeFit(1, None, 1, 0, 0)
    low = -(-tokens // n)  # B >= ceil(L / n), and for n > 1, B <= floor((L - 1) / (n - 1))
    high = np.where(n > 1, (tokens - 1) // np.maximum(n - 1, 1), _UNBOUNDED)
    # The B inside the most [low, high] intervals (one of their starts, or a power of two:
    # engines' block sizes are, so one is preferred among equals).
    fits = low <= high
    starts, ends = np.sort(low[fits]), np.sort(high[fits] + 1)
    powers = 1 << np.arange(21)
    points = np.unique(np.concatenate([starts, powers]))
    covering = np.searchsorted(starts, points, "right") - np.searchsorted(ends, points, "right")
    at = int(np.lexsort((points, ~np.isin(points, powers), -covering))[0])
    top = int(high.min())
    return BlockSizeFit(
        int(low.max()),
        None if top == _UNBOUNDED else top,
        int(points[at]),
        int(covering[at]),
        int(len(n)),
    )


def validate(trace: Trace, block_size: int | None, declared_by: str) -> dict:
    """The report: rules with counts and examples, the block size fit, and whether the trace is
    valid. Without a declared block size the length rule uses the best-fitting one."""
    fit = block_size_fit(trace)
    used = block_size or fit.best
    found = problems(trace, used, Blocks.of(trace))
    negative = np.flatnonzero(trace.timestamp < 0)
    found["negative_timestamps"] = {
        "count": int(len(negative)),
        "examples": [
            {"file": trace.files[trace.file_index[r]], "line": int(trace.line[r])}
            for r in negative[:MAX_EXAMPLES]
        ],
    }
    fits = block_size is None or fit.fits_all(block_size)
    found["block_size"] = {"count": 0 if fits else 1, "examples": [] if fits else [fit.describe()]}
    checks = [
        {
            "rule": name,
            "description": RULES[name],
            "count": found[name]["count"],
            "examples": found[name]["examples"],
        }
        for name in RULES
    ]
    return {
        "rows": len(trace),
        "block_size": {
            "declared": block_size,
            "declared_by": declared_by,
            "used": used,
            "inferred": {
                "low": fit.low,
                "high": fit.high,
                "best": fit.best,
                "best_rows": fit.best_rows,
                "rows_with_ids": fit.rows,
            },
            "summary": fit.describe(),
        },
        "checks": checks,
        "valid": len(trace) > 0 and all(check["count"] == 0 for check in checks),
    }


def report_text(report: dict, files: list[str]) -> str:
    size = report["block_size"]
    declared = (
        f"block size {size['declared']} ({size['declared_by']})"
        if size["declared"]
        else f"no block size declared: using {size['used']}, the best fit"
    )
    lines = [f"{', '.join(files)}: {report['rows']:,} rows; {declared}; {size['summary']}"]
    for check in report["checks"]:
        mark = "ok  " if check["count"] == 0 else "FAIL"
        line = f"  {mark} {check['description']}"
        if check["count"]:
            examples = ", ".join(_example(e) for e in check["examples"][:3])
            line += f": {check['count']:,} ({examples})"
        lines.append(line)
    if not report["rows"]:
        lines.append("  FAIL no rows could be read")
    lines.append("valid" if report["valid"] else "NOT VALID")
    return "\n".join(lines)


def _example(example: object) -> str:
    if isinstance(example, dict):
        where = f"{example.get('file', '').rsplit('/', 1)[-1]}:{example.get('line')}"
        return f"{where} {example['error']}" if "error" in example else where
    return f"id {example}" if isinstance(example, int) else str(example)
