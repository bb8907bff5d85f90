"""Beam steps every stage uses: batching by weight, pure combiners lifted, and dead letters as
tagged, counted outputs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from kvtrace.transforms.batching import WeightedBatcher
from kvtrace.transforms.combiners import Combiner
from kvtrace.transforms.dead_letters import DEAD_LETTER_TAG, DeadLetter
from kvtrace.transforms.errors import JobStopped

REFUSED_TAG = "refused"  # a step's refusal, its one line (refusal)


class BatchByWeight(beam.DoFn):
    """Elements in, lists of them out (see WeightedBatcher). For batch pipelines in the global
    window."""

    def __init__(self, max_weight: int, weight: Callable[[Any], int], max_count: int | None = None):
        self._max_weight = max_weight
        self._weight = weight
        self._max_count = max_count

    def start_bundle(self) -> None:
        self._batcher = WeightedBatcher(self._max_weight, self._weight, self._max_count)

    def process(self, element: Any) -> Iterator[list[Any]]:
        if (batch := self._batcher.add(element)) is not None:
            yield batch

    def finish_bundle(self) -> Iterator[WindowedValue]:
        if (batch := self._batcher.flush()) is not None:
            yield WindowedValue(batch, GlobalWindow().max_timestamp(), [GlobalWindow()])


class CombineWith(beam.CombineFn):
    """A pure combiner (combiners.py) as Beam's CombineFn."""

    def __init__(self, combiner: Combiner):
        self._combiner = combiner

    def create_accumulator(self) -> Any:
        return self._combiner.create_accumulator()

    def add_input(self, accumulator: Any, element: Any) -> Any:
        return self._combiner.add_input(accumulator, element)

    def merge_accumulators(self, accumulators: Iterable[Any]) -> Any:
        return self._combiner.merge_accumulators(accumulators)

    def extract_output(self, accumulator: Any) -> Any:
        return self._combiner.extract_output(accumulator)


def tagged(letter: DeadLetter) -> beam.pvalue.TaggedOutput:
    """A dead letter for a DoFn to yield; counted per reason in Beam Metrics (rejected_REASON),
    so a running job's console shows what is being rejected."""
    Metrics.counter("kvtrace", f"rejected_{letter.reason}").inc()
    return beam.pvalue.TaggedOutput(DEAD_LETTER_TAG, letter)


def refusal(err: JobStopped) -> beam.pvalue.TaggedOutput:
    """A refusal (JobStopped) as a step's output, its one line on REFUSED_TAG: a batch job's
    step never raises one, which a remote runner would retry as a failure (Flink's restart
    strategy: 20 attempts, a traceback each); the job stages it for its launcher, which raises
    it once the job has finished. As bytes: Beam carries text as UTF-8, and a path it names
    need not be."""
    line = JobStopped.message_in(err) or str(err)
    return beam.pvalue.TaggedOutput(REFUSED_TAG, line.encode("utf-8", "surrogateescape"))


def verdict(produce: Callable[[], Iterable[Any]]) -> Iterator[Any]:
    """A step's outputs (produce's, whole), or only its refusal (JobStopped, as refusal)."""
    try:
        outputs = list(produce())
    except JobStopped as err:
        yield refusal(err)
        return
    yield from outputs


def payload_bytes(value: Any) -> int:
    """About what an element weighs on the wire: numpy buffers and bytes by size, anything else
    8 bytes per scalar (coders add a little framing on top)."""
    if hasattr(value, "nbytes"):
        return int(value.nbytes)
    if isinstance(value, (bytes, str)):
        return len(value)
    if isinstance(value, (tuple, list)):
        return sum(payload_bytes(v) for v in value)
    if hasattr(value, "__dataclass_fields__"):
        return sum(payload_bytes(getattr(value, f)) for f in value.__dataclass_fields__)
    return 8


def metered(pcoll: beam.PCollection, step: str) -> beam.PCollection:
    """pcoll unchanged, its bytes counted in Beam Metrics as kvtrace/shuffled_bytes_STEP: put in
    front of a shuffle, it says what the shuffle carries (benchmarks/bench_shuffle.py)."""
    counter = Metrics.counter("kvtrace", f"shuffled_bytes_{step}")

    def count(element: Any) -> Any:
        counter.inc(payload_bytes(element))
        return element

    # The element type passes through, so a keyed step after it keeps its deterministic coder.
    return pcoll | f"Meter{step[0].upper()}{step[1:]}" >> beam.Map(count).with_output_types(
        pcoll.element_type
    )
