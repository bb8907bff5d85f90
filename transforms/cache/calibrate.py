"""Calibration: the cache capacity whose simulated per-request hits best match what the serving
engine measured (the cached-token counts its responses reported).

For `lru` one stack-distance pass gives every capacity at once: at capacity P pages a request's
hit is the tokens of its leading blocks whose running maximum distance (prefix_max) is at most
P, so as P grows each block joins the hit at one page. Its change to the request's absolute
error, |hit - measured|, is known then, and a histogram of those changes by page, summed up, is
the total error at every capacity in one O(N) pass (as stack_distance._hits_within sums hits).

The fit is said to explain the logs only when few requests cached more than the trace's own
infinite cache allows (else the engine's cache saw traffic this trace does not hold: a cache
shared across replicas, or earlier traffic) and the residual error is small; measured counts
that are multiples of a size the block size does not divide suggest the engine's block size
differs from the trace's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvtrace.transforms.cache.stack_distance import COLD, StackDistances
from kvtrace.transforms.read.measured import NOT_MEASURED

# Requests whose measured hit exceeds the infinite cache's, beyond which no capacity explains
# the logs: a few may be the engine's (a prefix it caches that the trace splits otherwise).
ABOVE_CEILING_SHARE = 0.01
# The best capacity's error (sum of |simulated - measured| per request) over the measured
# cached tokens, above which the fit does not explain the logs.
RESIDUAL_SHARE = 0.1
# Nonzero measured counts needed before their common divisor says anything of a block size.
BLOCK_SIZE_EVIDENCE = 8


@dataclass(frozen=True)
class Fit:
    """A policy's best capacity and how well it explains the measured hits."""

    policy: str
    capacity_tokens: int  # the smallest capacity of the best fit
    capacity_tokens_upto: int | None  # the best fit's last capacity (None: every larger one)
    mae_tokens: float  # mean absolute error per measured request at the best capacity
    simulated_hit_rate: float  # token-weighted, over the measured requests
    curve_capacity_tokens: np.ndarray  # where the error changes (for the plot)
    curve_mae_tokens: np.ndarray


@dataclass(frozen=True)
class Measured:
    """What the engine measured, over the requests that carried a count."""

    requests: int  # requests that carried a count
    cached_tokens: int
    prompt_tokens: int  # of the requests that carried a count
    above_ceiling: int  # requests that cached more than an unbounded cache could
    ceiling_hit_rate: float  # the infinite cache's token-weighted rate over those requests
    nonzero_requests: int  # requests that measured a hit
    common_divisor: int  # of the nonzero counts (0 when there are none)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def measured_summary(distances: StackDistances, measured: np.ndarray) -> Measured:
    """The measured counts (per row in causal order, NOT_MEASURED where absent) against the
    trace's own ceiling."""
    carried = measured != NOT_MEASURED
    row_of = _row_of_block(distances)
    prompt = np.bincount(row_of, weights=distances.tokens, minlength=len(measured))
    warm = distances.prefix_max != COLD
    ceiling = np.bincount(row_of[warm], weights=distances.tokens[warm], minlength=len(measured))
    nonzero = measured[carried & (measured > 0)]
    return Measured(
        requests=int(carried.sum()),
        cached_tokens=int(measured[carried].sum()),
        prompt_tokens=int(prompt[carried].sum()),
        above_ceiling=int((measured[carried] > ceiling[carried]).sum()),
        ceiling_hit_rate=float(ceiling[carried].sum() / prompt[carried].sum())
        if prompt[carried].sum()
        else 0.0,
        nonzero_requests=len(nonzero),
        common_divisor=int(np.gcd.reduce(nonzero)) if len(nonzero) else 0,
    )


def fit_lru(distances: StackDistances, measured: np.ndarray) -> Fit:
    """The `lru` capacity (tokens) that minimizes the per-request absolute error against the
    measured counts (per row in causal order, NOT_MEASURED where absent), over every capacity."""
    row_of = _row_of_block(distances)
    per_block = measured[row_of]
    counted = (per_block != NOT_MEASURED) & (distances.prefix_max != COLD)
    tokens = distances.tokens.astype(np.int64)
    # Hit through each block, were it and every block before it in its request cached.
    through = np.cumsum(tokens) - np.repeat(
        np.concatenate(([0], np.cumsum(tokens)))[distances.row_starts[:-1]],
        np.diff(distances.row_starts),
    )
    change = np.abs(through - per_block) - np.abs(through - tokens - per_block)
    pages = distances.prefix_max[counted]
    error_by_page = np.cumsum(np.bincount(pages, weights=change[counted]))
    hits_by_page = np.cumsum(np.bincount(pages, weights=tokens[counted]))
    carried = measured != NOT_MEASURED
    requests = int(carried.sum())
    base = float(measured[carried].sum())  # the error of an empty cache
    if not len(error_by_page):  # no block is ever reused: every capacity is an empty cache
        error_by_page, hits_by_page = np.zeros(1), np.zeros(1)
    error = base + error_by_page
    best = int(np.argmin(np.round(error, 6)))  # the smallest capacity of the least error
    changes = np.flatnonzero(np.bincount(pages, minlength=len(error)))
    later = changes[changes > best]
    prompt = float(tokens[per_block != NOT_MEASURED].sum())
    return Fit(
        policy="lru",
        capacity_tokens=best * distances.block_size,
        capacity_tokens_upto=int(later[0] - 1) * distances.block_size if len(later) else None,
        mae_tokens=float(error[best] / requests) if requests else 0.0,
        simulated_hit_rate=float(hits_by_page[best] / prompt) if prompt else 0.0,
        curve_capacity_tokens=np.concatenate(([0], changes)) * distances.block_size,
        curve_mae_tokens=np.concatenate(([base], error[changes])) / max(requests, 1),
    )


def lru_hit_rate(distances: StackDistances, measured: np.ndarray, capacity_tokens: int) -> float:
    """`lru`'s token-weighted hit rate at a capacity over the requests that carried a count."""
    per_block = measured[_row_of_block(distances)] != NOT_MEASURED
    pages = capacity_tokens // distances.block_size
    prompt = distances.tokens[per_block].sum()
    hit = per_block & (distances.prefix_max <= pages)
    return float(distances.tokens[hit].sum() / prompt) if prompt else 0.0


def fit_replays(
    policy: str,
    capacities: Sequence[int],
    hits: Sequence[np.ndarray],
    measured: np.ndarray,
    prompt_tokens: int,
) -> Fit:
    """The capacity (tokens) among those replayed, each with its rows' hits (causal order), that
    minimizes the per-request absolute error against the measured counts; prompt_tokens: of
    the requests that carried a count."""
    carried = measured != NOT_MEASURED
    requests = max(int(carried.sum()), 1)
    error = np.array([np.abs(h[carried] - measured[carried]).sum() / requests for h in hits])
    best = int(np.argmin(np.round(error, 6)))
    return Fit(
        policy=policy,
        capacity_tokens=int(capacities[best]),
        capacity_tokens_upto=int(capacities[best]),
        mae_tokens=float(error[best]),
        simulated_hit_rate=float(hits[best][carried].sum() / prompt_tokens)
        if prompt_tokens
        else 0.0,
        curve_capacity_tokens=np.asarray(capacities, dtype=np.int64),
        curve_mae_tokens=error,
    )


def verdict(measured: Measured, fit: Fit, block_size: int) -> str | None:
    """Why no capacity explains the logs, in one sentence; None when the fit does."""
    if measured.requests and measured.above_ceiling > ABOVE_CEILING_SHARE * measured.requests:
        return (
            f"no capacity explains the logs: {measured.above_ceiling} of {measured.requests} "
            "requests cached more tokens than an unbounded cache of this trace could hold "
            "(a cache shared across replicas, or traffic before the trace began)"
        )
    if (
        measured.common_divisor
        and measured.common_divisor % block_size
        and measured.nonzero_requests >= BLOCK_SIZE_EVIDENCE
    ):
        return (
            f"no capacity explains the logs: every measured count is a multiple of "
            f"{measured.common_divisor} tokens, which the trace's block size {block_size} does "
            "not divide: the engine's block size may differ (anonymize at the engine's)"
        )
    residual = fit.mae_tokens * measured.requests
    if measured.cached_tokens and residual > RESIDUAL_SHARE * measured.cached_tokens:
        return (
            f"no capacity explains the logs: at the best one the error is "
            f"{residual / measured.cached_tokens:.0%} of the measured cached tokens (a cache "
            "shared across replicas, another policy, or a block size that differs)"
        )
    return None


def _row_of_block(distances: StackDistances) -> np.ndarray:
    starts = distances.row_starts
    return np.repeat(np.arange(len(starts) - 1, dtype=np.int64), np.diff(starts))
