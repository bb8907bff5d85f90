"""Pure combiners: Beam's CombineFn shape (create, add, merge, extract) without Beam, so that one
aggregation serves both engines. The Beam pipelines lift them with steps.CombineWith (partial
results combined on each worker before the shuffle); the local engines fold them in one call."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol


class Combiner(Protocol):
    def create_accumulator(self) -> Any: ...

    def add_input(self, accumulator: Any, element: Any) -> Any: ...

    def merge_accumulators(self, accumulators: Iterable[Any]) -> Any: ...

    def extract_output(self, accumulator: Any) -> Any: ...


def fold(combiner: Combiner, elements: Iterable[Any]) -> Any:
    """The combiner over every element in one process."""
    accumulator = combiner.create_accumulator()
    for element in elements:
        accumulator = combiner.add_input(accumulator, element)
    return combiner.extract_output(accumulator)


class BucketTotals:
    """Each element's (time bucket, amount) pairs summed per bucket; finish turns the totals
    into what the step needs of them (a shard plan, each bucket's first id or rank)."""

    def __init__(
        self,
        amounts: Callable[[Any], Iterable[tuple[int, int]]],
        finish: Callable[[dict[int, int]], Any] = dict,
    ):
        self._amounts, self._finish = amounts, finish

    def create_accumulator(self) -> dict[int, int]:
        return {}

    def add_input(self, totals: dict[int, int], element: Any) -> dict[int, int]:
        for bucket, amount in self._amounts(element):
            totals[bucket] = totals.get(bucket, 0) + amount
        return totals

    def merge_accumulators(self, accumulators: Iterable[dict[int, int]]) -> dict[int, int]:
        merged: dict[int, int] = {}
        for totals in accumulators:
            for bucket, amount in totals.items():
                merged[bucket] = merged.get(bucket, 0) + amount
        return merged

    def extract_output(self, totals: dict[int, int]) -> Any:
        return self._finish(totals)
