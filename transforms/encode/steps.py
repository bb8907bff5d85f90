"""The Beam steps of encoding: render, tokenize and chain-hash batches of requests on workers
(Encode, the stage both the batch and the streaming pipelines run)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.utils import shared
from apache_beam.utils.windowed_value import WindowedValue

from kvtrace.transforms.dead_letters import DEAD_LETTER_TAG
from kvtrace.transforms.encode.encode_requests import (
    TOKENIZE_BATCH_BYTES,
    TOKENIZE_BATCH_REQUESTS,
    EncodedBatch,
    EncodeOptions,
    OverlappedEncoder,
    open_encoder,
)
from kvtrace.transforms.encode.hashed_batch import HashedBatch
from kvtrace.transforms.encode.segment_cache import COUNTED, SegmentCache
from kvtrace.transforms.encode.timestamp_kinds import keep_input_kind, kind_counts, sum_kind_counts
from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.garbage import settle_after_start_up
from kvtrace.transforms.read.records import Request
from kvtrace.transforms.steps import REFUSED_TAG, BatchByWeight, refusal, tagged


class EncodeRequests(beam.DoFn):
    """A batch of Requests in, one HashedBatch out (later steps work per batch); bad requests go
    to the dead-letter output one by one.

    Tokenization overlaps rendering (encode_requests.OverlappedEncoder): batch N's results are
    emitted by the next call, or by finish_bundle for the last batch. refuses: a refusal
    (JobStopped: a tokenizer not the run's, a hostile template) is an output (steps.refusal),
    once per bundle, never raised; the batch refused is dropped, as the night publishes nothing.
    """

    def __init__(self, options: EncodeOptions, refuses: bool = False):
        self._options = options  # where the salt is: the salt itself never enters the graph
        self._refuses = refuses
        # One segment cache per worker process, shared by the DoFn instances its threads run
        # (Dataflow runs several per process): the budget is a process's, not a thread's.
        self._shared_cache = shared.Shared()
        # Each worker's segment cache, summed in the runner's metrics (Dataflow's job page).
        self._cache_metrics = {
            name: Metrics.counter("kvtrace", f"segment_cache_{name}") for name in COUNTED
        }

    def setup(self) -> None:
        self._segment_cache = self._shared_cache.acquire(  # held: the handle keeps weak refs
            lambda: SegmentCache(self._options.segment_cache_bytes)
        )
        self._encoding: OverlappedEncoder | None = None  # None: refused at setup, every batch
        try:
            self._encoder = open_encoder(self._options, self._segment_cache)
        except JobStopped as err:
            self._refused = self._refusal_of(err)
            return
        self._encoding = OverlappedEncoder(self._encoder)
        settle_after_start_up()

    def teardown(self) -> None:
        if self._encoding is not None:
            self._encoding.close()

    def start_bundle(self) -> None:
        self._last_window: tuple[Any, Any] | None = None  # where the batch in flight came from
        self._told: set[bytes] = set()  # the refusals this bundle output

    def process(
        self,
        batch: Iterable[Request],
        window=beam.DoFn.WindowParam,
        timestamp=beam.DoFn.TimestampParam,
    ) -> Iterator[Any]:
        if self._encoding is None:
            yield from self._once(self._refused)
            return
        try:
            failed, previous = self._encoding.push(batch)
            _refuse_unrepeatable(self._encoder)
        except JobStopped as err:  # the night publishes nothing: what this batch gave is moot
            yield from self._once(self._refusal_of(err))
            return
        yield from map(tagged, failed)
        yield from _outputs(previous)
        self._last_window = (window, timestamp)

    def finish_bundle(self) -> Iterator[Any]:
        if self._last_window is None:
            return
        window, timestamp = self._last_window
        self._last_window = None
        try:
            outputs = list(_outputs(self._encoding.flush()))
            _refuse_unrepeatable(self._encoder)
        except JobStopped as err:
            outputs = list(self._once(self._refusal_of(err)))
        self._count_cache()  # here, as no batch tokenizes in the background
        for output in outputs:
            if isinstance(output, beam.pvalue.TaggedOutput):
                yield beam.pvalue.TaggedOutput(
                    output.tag, WindowedValue(output.value, timestamp, [window])
                )
            else:
                yield WindowedValue(output, timestamp, [window])

    def _refusal_of(self, err: JobStopped) -> beam.pvalue.TaggedOutput:
        """err as an output (steps.refusal); raised when refusals are not outputs here."""
        if not self._refuses:
            raise err
        return refusal(err)

    def _once(self, refused: beam.pvalue.TaggedOutput) -> Iterator[beam.pvalue.TaggedOutput]:
        """A refusal output once per bundle (each batch of a refused worker would repeat it)."""
        if refused.value not in self._told:
            self._told.add(refused.value)
            yield refused

    def _count_cache(self) -> None:
        counts = self._encoding.take_cache_counts()
        for name, counter in self._cache_metrics.items():
            counter.inc(getattr(counts, name))


def _refuse_unrepeatable(encoder: Any) -> None:
    """A Beam worker cannot take back what it emitted before its tokenizer backend disagreed with
    `tokenizers`, or its segment cache with tokenizing whole (the local engine encodes again):
    the night is refused, publishing nothing, rather than publish bytes that depend on which
    worker saw the difference when. Whether it is refused is the input's alone (both samples are
    by content). A refusal, not an error: a remote runner would retry an error."""
    if encoder.backend_fallback is not None:
        raise JobStopped(
            f"tokenizer backend fastokens disagreed with tokenizers ({encoder.backend_fallback}):"
            " run again with --tokenizer-backend tokenizers"
        )
    if encoder.cache_mismatch is not None:
        raise JobStopped(
            f"the segment cache disagreed with tokenizing whole ({encoder.cache_mismatch}):"
            " run again with --segment-cache-mb 0"
        )


def _outputs(encoded: EncodedBatch | None) -> Iterator[Any]:
    """A finished batch as outputs: its dead letters tagged, then the HashedBatch."""
    if encoded is None:
        return
    hashed, rejected = encoded
    yield from map(tagged, rejected)
    if hashed is not None:
        yield hashed


class KeepInputTimestampKind(beam.DoFn):
    """A HashedBatch in, its requests of the input's timestamp kind out (the input's counts come
    as a side input); a dead letter for each other one (withhold: keep_input_kind's)."""

    def __init__(self, withhold: bool = False):
        self._withhold = withhold

    def process(self, batch: HashedBatch, counts: tuple[int, int]) -> Iterator[Any]:
        kept, letters = keep_input_kind(batch, counts, self._withhold)
        yield from map(tagged, letters)
        if kept is not None:
            yield kept


class OneTimestampKind(beam.PTransform):
    """HashedBatches in; those of the input's majority timestamp kind out (main), the others as
    dead letters (DEAD_LETTER_TAG). Judged with established: the requests per day the nights
    before it published (an id map's), as one run over them all would judge."""

    def __init__(self, established: Mapping[int, int] | None = None, withhold: bool = False):
        super().__init__()
        self._established = dict(established or {})
        self._withhold = withhold

    def expand(self, hashed: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        counts = (
            (
                hashed | "KindCounts" >> beam.Map(kind_counts),
                hashed.pipeline | "Established" >> beam.Create([self._established]),
            )
            | "WithEstablished" >> beam.Flatten()
            | "SumKindCounts" >> beam.CombineGlobally(sum_kind_counts)
        )
        return hashed | "KeepKind" >> beam.ParDo(
            KeepInputTimestampKind(self._withhold), beam.pvalue.AsSingleton(counts)
        ).with_outputs(DEAD_LETTER_TAG, main="hashed")


class Encode(beam.PTransform):
    """Requests in; HashedBatches out ("hashed"), and the requests that could not be encoded as
    dead letters (DEAD_LETTER_TAG): the encode stage of the batch and the streaming pipelines.

    With one_timestamp_kind (batch), only requests of the input's majority timestamp kind go on
    (OneTimestampKind), the others are dead letters too. A stream judges timestamps per window
    against its input so far instead (anonymize_streaming), as a count over an unbounded input
    never completes. withhold: the run's ParseOptions.withholds_letters, for those letters.
    refuses: the refusals of encoding out too (REFUSED_TAG, EncodeRequests), never raised: a
    batch job's, whose launcher raises them once the job has finished."""

    def __init__(
        self,
        options: EncodeOptions,
        one_timestamp_kind: bool = True,
        established: Mapping[int, int] | None = None,
        withhold: bool = False,
        refuses: bool = False,
    ):
        super().__init__()
        self._options = options
        self._one_timestamp_kind = one_timestamp_kind
        self._established = established
        self._withhold = withhold
        self._refuses = refuses

    def expand(self, requests: beam.PCollection) -> dict[str, beam.PCollection]:
        encoded = (
            requests
            | "Batch"
            >> beam.ParDo(
                BatchByWeight(
                    TOKENIZE_BATCH_BYTES, lambda request: len(request.line), TOKENIZE_BATCH_REQUESTS
                )
            )
            | "RenderTokenizeHash"
            >> beam.ParDo(EncodeRequests(self._options, self._refuses)).with_outputs(
                DEAD_LETTER_TAG, REFUSED_TAG, main="hashed"
            )
        )
        refused = {REFUSED_TAG: encoded[REFUSED_TAG]} if self._refuses else {}
        if not self._one_timestamp_kind:
            return {"hashed": encoded.hashed, DEAD_LETTER_TAG: encoded[DEAD_LETTER_TAG], **refused}
        agreed = encoded.hashed | "OneTimestampKind" >> OneTimestampKind(
            self._established, self._withhold
        )
        letters = (
            encoded[DEAD_LETTER_TAG],
            agreed[DEAD_LETTER_TAG],
        ) | "AllRejected" >> beam.Flatten()
        return {"hashed": agreed.hashed, DEAD_LETTER_TAG: letters, **refused}
