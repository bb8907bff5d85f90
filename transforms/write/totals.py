"""Aggregate statistics of an exported trace: sizes and infinite-cache hit rates.

With chained hashes a block was seen before exactly when it is not its hash's first occurrence,
and the seen blocks of a row always form a prefix; so over the whole trace, an infinite cache
misses each distinct block once. The hit rate needs no ordering pass: 1 - unique / total.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

from kvtrace.transforms.encode.hashed_batch import HashedBatch
from kvtrace.transforms.read.measured import NOT_MEASURED
from kvtrace.transforms.trace_format import MIN_MEASURED_REQUESTS
from kvtrace.transforms.write.coarsen import Coarsening, coarse_input_lengths, coarse_output_lengths

TOKEN_WEIGHTED_DEFINITION = (
    "infinite cache, causal: 1 - (tokens of each distinct block's first occurrence) / "
    "(all input tokens); the partial last block weighs its real token count"
)
BLOCK_WEIGHTED_DEFINITION = "infinite cache, causal: 1 - distinct blocks / all blocks"
MEASURED_DEFINITION = (
    "measured by the serving engine: the cached prompt tokens its responses reported, over the "
    "input tokens of the requests whose log carried a count (their per-request values are "
    "never published: the run's measured file beside its dead letters)"
)


@dataclass(frozen=True)
class ExportTotals:
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    blocks: int = 0
    requests_without_output_length: int = 0
    requests_with_unrendered_messages: int = 0  # the template left out a system/developer text
    # Requests whose log carried the engine's cached-token count, that count and their inputs.
    measured_requests: int = 0
    measured_cached_tokens: int = 0
    measured_input_tokens: int = 0

    @classmethod
    def of_batch(cls, batch: HashedBatch, coarsening: Coarsening = Coarsening()) -> ExportTotals:
        """The batch's totals as its published rows give them: lengths coarsened (an exact sum
        beside coarse rows would undo --length-granularity)."""
        columns = batch.requests
        outputs = coarse_output_lengths(columns["output_length"], coarsening.output_length)
        inputs = coarse_input_lengths(
            columns["input_length"], coarsening.block_size, coarsening.output_length
        )
        measured = columns["cached_tokens"] != NOT_MEASURED
        return cls(
            requests=len(columns),
            input_tokens=int(inputs.sum()),
            output_tokens=int(outputs.sum()),
            blocks=int(columns["num_blocks"].sum()),
            requests_without_output_length=int(columns["without_output_length"].sum()),
            requests_with_unrendered_messages=int(columns["message_not_rendered"].sum()),
            measured_requests=int(measured.sum()),
            measured_cached_tokens=int(columns["cached_tokens"][measured].sum()),
            measured_input_tokens=int(inputs[measured].sum()),
        )


def sum_totals(totals: Iterable[ExportTotals]) -> ExportTotals:
    sums = dict.fromkeys((f.name for f in fields(ExportTotals)), 0)
    for total in totals:
        for name in sums:
            sums[name] += getattr(total, name)
    return ExportTotals(**sums)


def hit_rate(unique: int, total: int) -> float:
    """Share of total that an infinite cache serves, given how much of it was new."""
    return 1.0 - unique / total if total else 0.0


def export_stats(totals: ExportTotals, unique_blocks: int, unique_tokens: int) -> dict:
    stats = {
        "requests": totals.requests,
        "input_tokens": totals.input_tokens,
        "output_tokens": totals.output_tokens,
        "blocks": totals.blocks,
        "unique_blocks": unique_blocks,
        "unique_block_tokens": unique_tokens,
        "hit_rates": {
            "token_weighted": hit_rate(unique_tokens, totals.input_tokens),
            "block_weighted": hit_rate(unique_blocks, totals.blocks),
        },
        "definitions": {
            "token_weighted": TOKEN_WEIGHTED_DEFINITION,
            "block_weighted": BLOCK_WEIGHTED_DEFINITION,
        },
    }
    return with_measured(
        stats, totals.measured_requests, totals.measured_cached_tokens, totals.measured_input_tokens
    )


MEASURED_COUNTS = ("requests", "cached_tokens", "input_tokens")  # what `measured` is made of


def with_measured(stats: dict, requests: int, cached_tokens: int, input_tokens: int) -> dict:
    """The stats with the engine's measured hit rate, aggregated, where at least
    MIN_MEASURED_REQUESTS requests carried one: fewer would publish their private counts (the
    gate rebuilds it from its three counts with this one function, so it refuses a smaller
    aggregate as holding more than the rows' statistics)."""
    if requests < MIN_MEASURED_REQUESTS:
        return stats
    measured = dict(zip(MEASURED_COUNTS, (requests, cached_tokens, input_tokens)))
    measured["hit_rate"] = cached_tokens / input_tokens if input_tokens else 0.0
    definitions = {**stats["definitions"], "measured": MEASURED_DEFINITION}
    return {**stats, "measured": measured, "definitions": definitions}
