"""`kvtrace anonymize --streaming`: requests from an unbounded source, the trace published window
by window.

messages -> parse -> render, tokenize, chain-hash (the batch pipeline's steps) -> PublishWindows
    -> the id map's shard steps (SeenShard, NumberNew, ShardStore) -> WriteWindows

Event time is each request's own timestamp, whenever the source received it (a backfill of old
logs is on time). Requests gather by event-time window (--window), cut from the trace's zero
(the earliest request, fixed once the first window is published, kept in state): window k holds
[zero + k W, zero + (k + 1) W) in published (coarsened) time, whole granules, so no
published time tells the zero's epoch. Once a request
past a window's end plus the allowed lateness has come in, and the source's watermark (its own
clock: when records were produced) says everything produced before that one has come in too, or
the source has been idle for IDLE_MS, the window is a night of the batch job: its ids continue
the id map, which lives in the runner's keyed state, in --id-shards hash-shard keys (ids in
first-seen order within and across windows), and it is numbered and published, whole, into its
own folder by the night's end every engine runs (anonymize_night.night_requests, then
publish_night once its ids are back), named by its place among the
published windows (window-000000, ...: no absolute time leaves), its dead letters published with
it as a run of the batch job's protocol (publish.DeadLetterRun: rejected-KEY-window-000000.jsonl,
KEY the output's, so streams of other outputs share a dead-letter folder).
A runner restored from a checkpoint restores that state with the source's offsets: it publishes
again, byte for byte, a window it had published after the checkpoint (cut from the same zero),
and ids go on from the checkpoint's. With nothing late, the windows concatenated are the batch
output of the same records, byte for byte (its zero is the earliest request too). A request whose
window is older than one already published is late: a dead letter with reason `late`; windows
go out in time order. Records
that never became requests (bad JSON, ...) are dead letters of the next window published, or,
after LETTER_DELAY_S without one (or at the stream's end), published with the cumulative.json
written then (rejected-KEY-letters-000001.jsonl). cumulative.json publishes only what the windows'
rows prove; what was read and rejected is the operator's, in run-counts.json beside the dead
letters (as a batch run's). The stream's clock, its zero and its clocks gone wrong follow one
rule (transforms/write/stream_windows.py): the published rows anchor the stream (a request
over MAX_GAP_DAYS from them, or of the other kind of time, is a dead letter as it comes); the
zero is fixed by its own run's clock in order, or at the stream's end by the batch rule; a
window ahead of the stream's clock waits for it. A window the writer cannot publish is counted
dead letters, and so is every later one; the stream drains, then stops (stream_drain.fail).

Windows are cut and judged in one key (PublishWindows, the controller) and written in one
(WriteWindows), in order; the id map is in (kind, shard) keys, none holding all of it, and no
window reads it whole (docs/STREAMING.md sizes it); reading, parsing and tokenizing spread over
all.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import time
import typing
from collections.abc import Iterator
from contextlib import nullcontext, suppress
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.coders import PickleCoder
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms.external import ExternalTransform, NamedTupleBasedPayloadBuilder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    ReadModifyWriteStateSpec,
    TimerSpec,
    on_timer,
)
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp

from kvtrace.pipelines.anonymize_config import AnonymizeConfig
from kvtrace.pipelines.anonymize_night import (
    Encoded,
    Night,
    kind_keys,
    night_requests,
    publish_night,
    write_dead_letters,
)
from kvtrace.pipelines.runner import is_remote, pipeline_options, run
from kvtrace.pipelines.stream_drain import drained_on_stop, fail
from kvtrace.transforms import storage
from kvtrace.transforms.dead_letters import DEAD_LETTER_TAG, DeadLetter, shown_name
from kvtrace.transforms.encode.hashed_batch import HashedBatch
from kvtrace.transforms.encode.steps import Encode
from kvtrace.transforms.encode.timestamp_kinds import (
    IMPLAUSIBLE_TIMESTAMP,
    keep_arriving,
    keep_plausible_windows,
    row_identity,
    sum_kind_counts,
)
from kvtrace.transforms.errors import ConfigError, JobStopped
from kvtrace.transforms.ids.dense_ids import KindIds, UniqueTotals, sum_unique, unique_totals
from kvtrace.transforms.ids.id_shards import DEFAULT_ID_SHARDS, placed, window_parts
from kvtrace.transforms.ids.steps import QUERY, NumberNew, SeenShard, ShardStore
from kvtrace.transforms.read.steps import parse_records
from kvtrace.transforms.read.timestamps import MAX_GAP_DAYS
from kvtrace.transforms.trace_format import (
    MANIFEST,
    STREAM_TOTALS,
    canonical_json,
    parse_json,
    window_index,
)
from kvtrace.transforms.write.coarsen import Coarsening, round_to
from kvtrace.transforms.write.manifest import RUN_COUNTS, set_content_times
from kvtrace.transforms.write.publish import (
    STREAM_WRITER,
    DeadLetterRun,
    OutputRefused,
    check_inherited,
    claimed_by,
    make_staging,
    mark_output,
    mark_stream_object,
    output_key,
)
from kvtrace.transforms.write.shards import block_hashes_staging
from kvtrace.transforms.write.stream_windows import KINDS, Progress, by_window

LATE = "late"
UNPUBLISHED_WINDOW = "unpublished_window"  # the writer could not publish the window
# A source that has delivered nothing for this long (by its own clock) has nothing older to send:
# windows past their deadline close then even when no newer request says so.
IDLE_MS = 10_000
# Dead letters wait this long (processing time) for a window to go out with, then go alone.
LETTER_DELAY_S = 10
SEEN = "seen"  # the controller's tagged outputs to the shard steps
PLAN, ADDED, ANSWER = "plan", "added", "answer"  # what the writer takes
PUBSUB = re.compile(r"pubsub:(projects/[^/]+/subscriptions/[^/]+)")
KAFKA = re.compile(r"kafka://([^/]+:\d+)/([^/]+)")
# Beam's Kafka read is Java, expanded by an expansion service (deploy/flink/local-cluster.sh
# starts one) of the Beam release the Flink job server runs (deploy/flink/versions.env); its
# payload is that release's schema, as newer SDKs send fields it cannot read.
KAFKA_READ_URN = "beam:transform:org.apache.beam:kafka_read_without_metadata:v1"
KAFKA_EXPANSION = "KVTRACE_KAFKA_EXPANSION"  # HOST:PORT of that service
BYTES = "org.apache.kafka.common.serialization.ByteArrayDeserializer"
KafkaReadSchema = typing.NamedTuple(
    "KafkaReadSchema",
    [
        ("consumer_config", typing.Mapping[str, str]),
        ("topics", typing.List[str]),
        ("key_deserializer", str),
        ("value_deserializer", str),
        ("start_read_time", typing.Optional[int]),
        ("max_num_records", typing.Optional[int]),
        ("max_read_time", typing.Optional[int]),
        ("commit_offset_in_finalize", bool),
        ("timestamp_policy", str),
        ("consumer_polling_timeout", typing.Optional[int]),
        ("redistribute", typing.Optional[bool]),
        ("redistribute_num_keys", typing.Optional[np.int32]),
        ("allow_duplicates", typing.Optional[bool]),
    ],
)
SOURCES = "pubsub:projects/P/subscriptions/S or kafka://HOST:PORT/TOPIC"


def check_source(source: str) -> str:
    """The source as given, once it names something this driver reads."""
    if not (PUBSUB.fullmatch(source) or KAFKA.fullmatch(source)):
        raise ConfigError(f"--streaming reads {SOURCES}, not {source!r}")
    if KAFKA.fullmatch(source) and not os.environ.get(KAFKA_EXPANSION):
        raise ConfigError(
            f"a kafka:// source needs ${KAFKA_EXPANSION}=HOST:PORT, Beam's Kafka "
            "expansion service (deploy/flink/local-cluster.sh start serves one)"
        )
    return source


def read_source(source: str) -> beam.PTransform:
    """Messages of the source, each a request's bytes."""
    pubsub = PUBSUB.fullmatch(source)
    if pubsub:
        return beam.io.ReadFromPubSub(subscription=pubsub.group(1))
    return "ReadKafka" >> (
        ExternalTransform(
            KAFKA_READ_URN,
            NamedTupleBasedPayloadBuilder(kafka_read(source)),
            os.environ[KAFKA_EXPANSION],
        )
        | "Values" >> beam.Map(lambda key_value: key_value[1])
    )


def kafka_read(source: str) -> KafkaReadSchema:
    """Beam's Kafka read of a kafka:// source, as the expansion service is sent it."""
    servers, topic = KAFKA.fullmatch(source).groups()
    return KafkaReadSchema(
        kafka_consumer_config(servers, topic),
        [topic],
        BYTES,
        BYTES,
        None,
        None,
        None,
        # Offsets are committed to the group only once a checkpoint holding them completes.
        True,
        # The source's clock: when records were produced. PublishWindows times windows by the
        # requests' own timestamps and uses this only to know everything produced before an
        # instant has been read.
        "CreateTime",
        2,
        False,
        np.int32(0),
        False,
    )


def kafka_consumer_config(servers: str, topic: str) -> dict[str, str]:
    """The consumer's configuration (it replaces Beam's defaults whole): a new group starts at the
    topic's first record, and the consumer never commits offsets on its own, which would mark
    records read before they are processed; the runner's checkpoints hold the offsets."""
    return {
        "bootstrap.servers": servers,
        "auto.offset.reset": "earliest",
        "group.id": f"kvtrace-{topic}",
        "enable.auto.commit": "false",
    }


@dataclasses.dataclass(frozen=True)
class StreamingConfig:
    job: AnonymizeConfig  # output, staging and dead letters are the roots of each window's
    source: str  # pubsub:projects/P/subscriptions/S
    window_ms: int = 3_600_000
    allowed_lateness_ms: int = 0
    idle_ms: int = IDLE_MS
    id_shards: int = DEFAULT_ID_SHARDS  # keys holding the id map: never changes a byte
    # Names the stream's files in folders streams may share (dead letters, block hashes) as a
    # batch run's letters are named, by its output (publish.output_key): fixed at launch
    # (run_streaming), so a restored runner names a window's files again the same.
    key: str = ""

    def stream_key(self) -> str:
        return self.key or output_key(self.job.output)

    def run_name(self, name: str) -> str:
        """A window's or letters run's name in a shared folder: no two streams' alike."""
        return f"{self.stream_key()}-{name}"

    def run_counts(self) -> str:
        """The stream's run counts (RUN_COUNTS, named by its output) in its dead-letter folder."""
        stem, suffix = os.path.splitext(RUN_COUNTS)
        return storage.join(self.job.dead_letter, f"{stem}-{self.stream_key()}{suffix}")

    @property
    def coarsening(self) -> Coarsening:
        return self.job.coarsening

    def deadline_ms(self, window_start_ms: int) -> int:
        """When a window is published: the watermark past its end plus the allowed lateness."""
        return window_start_ms + self.window_ms + self.allowed_lateness_ms


def late_letters(source: str, batch: HashedBatch, published: str) -> list[DeadLetter]:
    """A dead letter per request of a window already published (its text is gone by now: the
    letter says when it was)."""
    return [
        DeadLetter(source, b"", LATE, f"request at {ts} ms arrived after {published} was published")
        for ts in batch.requests["timestamp_ms"].tolist()
    ]


def source_now_ms() -> int:
    """The source's clock here: Kafka's CreateTime and Pub/Sub's publish time are wall clocks."""
    return int(time.time() * 1000)


class PublishWindows(beam.DoFn):
    """The controller, keyed (one key) by design: windows are cut from the trace's zero, which
    lives in this state, and go out in order. In: (key, HashedBatch or DeadLetter); out: each
    window's keys to the id map's shard steps (tagged SEEN, QUERY: ((kind, shard), ...)) and
    plans to the writer, in the order it writes them ((0, (PLAN, seq, WindowPlan or
    LettersPlan, Published))). Pending: (window start, HashedBatch) or (None, DeadLetter)."""

    PENDING = BagStateSpec("pending", PickleCoder())
    PROGRESS = ReadModifyWriteStateSpec("progress", PickleCoder())
    # One per open window, tagged by its start (_arm): all due ones fire in one advance.
    DEADLINE = TimerSpec("deadline", TimeDomain.WATERMARK)
    LETTERS = TimerSpec("letters", TimeDomain.REAL_TIME)
    # The final watermark (a backfill's end, a drain) fires event-time timers only: this one
    # publishes every window still open and every letter still waiting, which the real-time
    # LETTERS timer would never send.
    END = TimerSpec("end", TimeDomain.WATERMARK)

    def __init__(self, config: StreamingConfig):
        self._config = config
        # What a runner's UI shows of the stream (Dataflow's job page, Flink's metrics).
        self._late = Metrics.counter("kvtrace", "requests_late")

    def process(
        self,
        element: tuple[Any, HashedBatch | DeadLetter],
        pending=beam.DoFn.StateParam(PENDING),
        progress_state=beam.DoFn.StateParam(PROGRESS),
        deadline=beam.DoFn.TimerParam(DEADLINE),
        letters_due=beam.DoFn.TimerParam(LETTERS),
        end=beam.DoFn.TimerParam(END),
    ) -> None:
        item = element[1]
        progress = progress_state.read()
        if progress is None:  # the key's first message: the END timer, once
            progress = Progress()
            end.set(GlobalWindow().max_timestamp())
        letters = [item] if isinstance(item, DeadLetter) else self._wait(item, progress, pending)
        self._arm(progress, deadline)
        self._hold_letters(letters, progress, pending, letters_due)
        progress_state.write(progress)

    def _arm(self, progress: Progress, deadline: Any) -> None:
        """A timer per window that needs one (Progress.timers), tagged by the window; only those
        whose time changed set again, those no longer needed cleared: a message costs a few
        timer sets, whatever the stream holds open. A timer left by a window cut again from a
        moved zero fires harmlessly: a firing publishes what is due then."""
        wanted = progress.timers(self._config)
        for window, due_ms in wanted.items():
            if progress.armed.get(window) != due_ms:
                deadline.set(Timestamp(micros=due_ms * 1000), dynamic_timer_tag=str(window))
        for window in progress.armed.keys() - wanted.keys():
            deadline.clear(dynamic_timer_tag=str(window))
        progress.armed = wanted

    @staticmethod
    def _hold_letters(
        letters: list[DeadLetter], progress: Progress, pending: Any, letters_due: Any
    ) -> None:
        """Dead letters pending: out with the next window, or on their own soon."""
        for letter in letters:
            pending.add((None, letter))
        if letters:
            PublishWindows._letters_soon(progress, letters_due)

    @staticmethod
    def _letters_soon(progress: Progress, letters_due: Any) -> None:
        if progress.letters_due is None:
            progress.letters_due = time.time() + LETTER_DELAY_S
            letters_due.set(Timestamp(seconds=progress.letters_due))

    def _wait(self, batch: HashedBatch, progress: Progress, pending: Any) -> list[DeadLetter]:
        """The batch's requests pending in their windows; a dead letter for each whose window
        is already published, or whose time is of another kind than the stream's zero."""
        strays: list[DeadLetter] = []
        if progress.published_ms is not None:  # anchored: judged now, nothing held for it
            # What waits lies in the published rows' run (judged as it came): one anchor,
            # which each request kept extends, in arrival order (however bundles batch them).
            anchor = sum_kind_counts([progress.published_days, progress.waiting])
            kept, strays = keep_arriving(batch, anchor)
            progress.far += len(strays)
            if kept is None:
                return strays
            batch = kept
        earliest = int(batch.requests["timestamp_ms"].min())
        if progress.published_ms is None and (
            progress.origin_ms is None or earliest < progress.origin_ms
        ):
            items = list(pending.read())
            pending.clear()
            waiting = progress.recut(
                self._config, earliest, [entry for entry in items if entry[0] is not None]
            )
            for entry in waiting + [entry for entry in items if entry[0] is None]:
                pending.add(entry)
        late, now_ms = [], source_now_ms()
        for window, part in by_window(
            batch, progress.origin_ms, self._config.window_ms, self._config.job.coarsening
        ):
            if progress.published_ms is not None and window <= progress.published_ms:
                late += late_letters(
                    shown_name(self._config.source), part, progress.last_published()
                )
                continue
            pending.add((window, part))
            progress.saw(self._config, window, part.requests["timestamp_ms"], now_ms)
        self._late.inc(len(late))
        return strays + late

    @on_timer(DEADLINE)
    def publish(
        self,
        fired=beam.DoFn.TimestampParam,
        pending=beam.DoFn.StateParam(PENDING),
        progress_state=beam.DoFn.StateParam(PROGRESS),
        deadline=beam.DoFn.TimerParam(DEADLINE),
        letters_due=beam.DoFn.TimerParam(LETTERS),
    ) -> Iterator[Any]:
        progress = progress_state.read() or Progress()
        fired_ms = fired.micros // 1000
        yield from self._publish_due(fired_ms, progress, pending)
        # The timers at or before this one have fired, or fire in this advance: armed again if
        # still needed; those of windows gone (published, cut again) cleared.
        progress.armed = {
            w: due
            for w, due in progress.armed.items()
            if due > fired_ms or w not in progress.passed_ms
        }
        self._arm(progress, deadline)
        if any(window is None for window, _ in pending.read()):  # strays with no window due
            self._letters_soon(progress, letters_due)
        progress_state.write(progress)

    @on_timer(END)
    def publish_all(
        self,
        fired=beam.DoFn.TimestampParam,
        pending=beam.DoFn.StateParam(PENDING),
        progress_state=beam.DoFn.StateParam(PROGRESS),
    ) -> Iterator[Any]:
        """The stream ended: every open window published, then every letter left."""
        progress = progress_state.read() or Progress()
        yield from self._publish_due(fired.micros // 1000, progress, pending, everything=True)
        yield from self._flush_letters(progress, pending)
        progress_state.write(progress)

    def _publish_due(
        self, watermark_ms: int, progress: Progress, pending: Any, everything: bool = False
    ) -> Iterator[Any]:
        """The windows due at watermark_ms (everything: the stream ended) published, oldest
        first, the letters waiting with the first; the rest left pending. What waits is judged
        first against the rows published (the anchor; before any, the run of the window due,
        which fixes the zero): a request that would open a gap over MAX_GAP_DAYS from them is
        a dead letter, never outvoting them."""
        config = self._config
        items = list(pending.read())
        letters = [item for window, item in items if window is None]
        waiting = [(window, item) for window, item in items if window is not None]
        anchor = progress.published_days
        if progress.published_ms is None:
            anchor = progress.first_anchor(config, watermark_ms, everything)
            if not anchor:
                return
        pending.clear()
        waiting, strays = keep_plausible_windows(waiting, anchor)
        progress.far += len(strays)
        letters += strays
        if progress.published_ms is None and waiting:  # the first window fixes the zero
            earliest = min(int(batch.requests["timestamp_ms"].min()) for _, batch in waiting)
            if earliest != progress.origin_ms:
                waiting = progress.recut(config, earliest, waiting)
        progress.rehold(config, waiting)  # the letters' days no longer count
        due = progress.due(config, watermark_ms, everything)
        for window in due:
            batches = [item for w, item in waiting if w == window]
            yield from self._publish(progress.publish(window), batches, letters, progress)
            letters = []
        later = [(w, item) for w, item in waiting if w not in due]
        for entry in later + [(None, letter) for letter in letters]:
            pending.add(entry)

    @on_timer(LETTERS)
    def flush_letters(
        self, pending=beam.DoFn.StateParam(PENDING), progress_state=beam.DoFn.StateParam(PROGRESS)
    ) -> Iterator[Any]:
        progress = progress_state.read() or Progress()
        yield from self._flush_letters(progress, pending)
        progress_state.write(progress)

    def _flush_letters(self, progress: Progress, pending: Any) -> Iterator[Any]:
        """Dead letters no window took in time, handed to the writer: published on their own
        with the cumulative.json written then, after every window handed before them."""
        items = list(pending.read())
        letters = [item for window, item in items if window is None]
        if letters:
            pending.clear()
            for entry in items:
                if entry[0] is not None:
                    pending.add(entry)
            progress.letter_batches += 1
            self._warn_far(progress)
            yield self._hand(
                progress, LettersPlan(f"letters-{progress.letter_batches:06d}", letters)
            )
        progress.letters_due = None

    @staticmethod
    def _warn_far(progress: Progress) -> None:
        """One line per window (or letters run) while requests off the stream's run of days
        come: how many, and the remedy."""
        if progress.far:
            logging.warning(
                "%d requests lie more than %d days from the run of days the stream publishes "
                "(or are of the other kind of time): dead letters (%s); a producer whose clock "
                "moved for good needs a stream of its own (a new --output)",
                progress.far,
                MAX_GAP_DAYS,
                IMPLAUSIBLE_TIMESTAMP,
            )
            progress.far = 0

    @staticmethod
    def _hand(progress: Progress, plan: WindowPlan | LettersPlan) -> tuple[int, tuple]:
        """A plan to the writer, numbered in the order it is to be written, with what
        cumulative.json says of the windows published by then."""
        progress.handed += 1
        published = Published(progress.windows, progress.published_ms, progress.origin_ms)
        return 0, (PLAN, progress.handed - 1, plan, published)

    def _publish(
        self, name: str, batches: list[HashedBatch], letters: list[DeadLetter], progress: Progress
    ) -> Iterator[Any]:
        """One window as a night of the batch job, up to its numbering: its requests judged
        (night_requests, writing nothing), its keys sent to the shard steps (SEEN, QUERY), and
        the rest handed to the writer (WindowPlan), which writes it once its ids are back."""
        self._warn_far(progress)
        # The rejected-fraction gate is the batch job's: a stream does not stop for one window.
        judged = dataclasses.replace(self._config.job, inputs=(), max_rejected_fraction=None)
        read = sum(len(b) for b in batches) + len(letters)
        requests = night_requests(judged, Encoded(batches, letters, read), progress.origin_ms)
        window, shards = progress.windows - 1, self._config.id_shards
        unique, lengths = {}, {}
        for kind, keys_of in kind_keys(judged).items():
            keys = keys_of(requests.whole)
            firsts, queries = window_parts(keys, shards)
            unique[kind] = sum_unique(unique_totals(part) for part in firsts)
            lengths[kind] = len(keys)
            for shard, (part, query) in enumerate(zip(firsts, queries)):
                yield TaggedOutput(SEEN, ((kind, shard), (window, part)))
                yield TaggedOutput(QUERY, ((kind, shard), (window, QUERY, query)))
        yield self._hand(progress, WindowPlan(window, name, requests, read, unique, lengths))


class Published(NamedTuple):
    """What cumulative.json says of the windows published when a plan was handed over."""

    windows: int
    published_ms: int | None
    origin_ms: int | None


class WindowPlan(NamedTuple):
    """A window the controller cut and judged, for the writer once its ids are back."""

    window: int  # its place among the published windows: the shard steps' window
    name: str  # its folder's
    requests: Night
    read: int
    unique: dict[str, UniqueTotals]  # per kind, from the window's first occurrences
    lengths: dict[str, int]  # keys per kind: the ids coming back


class LettersPlan(NamedTuple):
    """Dead letters no window took, published with the cumulative.json written then."""

    name: str
    letters: list[DeadLetter]


class Book(NamedTuple):
    """The writer's small state: what has come in, never the plans or ids themselves (a bag
    each, read only when something can be written). Its dicts are never changed in place (the
    writer builds new ones), so the shared defaults stay empty."""

    next_seq: int = 0  # the next plan to write
    plans: dict[int, int | None] = {}  # plans come in, not written: seq -> window (None: letters)
    answers: dict[int, int] = {}  # window -> answers come in


def writable(book: Book, needed: int) -> tuple[list[int], Book]:
    """The plans (seqs) that can be written now, in order: a letters run at once, a window once
    needed answers of it came back; the book after them."""
    plans, answers, seq, ready = dict(book.plans), dict(book.answers), book.next_seq, []
    while seq in plans and (plans[seq] is None or answers.get(plans[seq], 0) >= needed):
        window = plans.pop(seq)
        answers.pop(window, None)
        ready.append(seq)
        seq += 1
    return ready, Book(seq, plans, answers)


def window_ids(plan: WindowPlan, answers: list[tuple]) -> dict[str, KindIds]:
    """Each kind's ids of the window, from its stores' answers (ANSWER, kind, rows, ids) and
    the numbering step's new ids (ADDED, kind, NUMBERED)."""
    numbered = {}
    for kind in KINDS:
        added = next(item[2] for item in answers if item[:2] == (ADDED, kind))
        parts = [(item[2], item[3]) for item in answers if item[:2] == (ANSWER, kind)]
        ids = placed(plan.lengths[kind], parts)
        numbered[kind] = KindIds(ids, plan.unique[kind], added, len(added))
    return numbered


class WriteWindows(beam.DoFn):
    """Keyed (one key): writes what PublishWindows handed over, in the order it was handed,
    each window once its ids are back from every shard's store and the numbering step (so a
    window is published whole). A window's plan and ids wait in bags, read once, when it is
    written (an answer's arrival reads only the Book). Holds the stream's counts (a Progress: rows, rejected, next
    ids) and writes cumulative.json and the run counts after each window or letters run.
    In: (0, (PLAN, seq, plan, Published)), (0, (ADDED, window, kind, NUMBERED)),
    (0, (ANSWER, window, kind, rows, ids)); out: each published window's manifest."""

    BOOK = ReadModifyWriteStateSpec("book", PickleCoder())
    PLANS = BagStateSpec("plans", PickleCoder())  # (seq, plan, Published)
    ANSWERS = BagStateSpec("answers", PickleCoder())  # (window, (tag, kind, ...))
    PROGRESS = ReadModifyWriteStateSpec("progress", PickleCoder())

    def __init__(self, config: StreamingConfig):
        self._config = config
        # What a runner's UI shows of the stream (Dataflow's job page, Flink's metrics).
        self._windows = Metrics.counter("kvtrace", "windows_published")
        self._rows = Metrics.counter("kvtrace", "requests_published")

    def process(
        self,
        element: tuple[int, tuple],
        book_state=beam.DoFn.StateParam(BOOK),
        plans=beam.DoFn.StateParam(PLANS),
        answers=beam.DoFn.StateParam(ANSWERS),
        progress_state=beam.DoFn.StateParam(PROGRESS),
    ) -> Iterator[dict]:
        tag, *item = element[1]
        book = book_state.read() or Book()
        if tag == PLAN:
            seq, plan, _ = item
            plans.add(tuple(item))
            window = plan.window if isinstance(plan, WindowPlan) else None
            book = book._replace(plans={**book.plans, seq: window})
        else:
            window, *answer = item
            answers.add((window, (tag, *answer)))
            book = book._replace(answers={**book.answers, window: book.answers.get(window, 0) + 1})
        ready, book = writable(book, len(KINDS) * (self._config.id_shards + 1))
        book_state.write(book)
        if ready:
            yield from self._write_ready(ready, plans, answers, progress_state)

    def _write_ready(
        self, ready: list[int], plans: Any, answers: Any, progress_state: Any
    ) -> Iterator[dict]:
        """The plans ready written in order; the bags keep only what waits."""
        waiting = {seq: (plan, published) for seq, plan, published in plans.read()}
        taken = [waiting.pop(seq) for seq in ready]
        windows = {plan.window for plan, _ in taken if isinstance(plan, WindowPlan)}
        answered = list(answers.read())
        plans.clear()
        for seq, (plan, published) in waiting.items():
            plans.add((seq, plan, published))
        answers.clear()
        for window, answer in answered:
            if window not in windows:
                answers.add((window, answer))
        progress = progress_state.read() or Progress()
        for plan, published in taken:
            own = [a for w, a in answered if isinstance(plan, WindowPlan) and w == plan.window]
            yield from self._write_plan(plan, published, own, progress)
        progress_state.write(progress)

    def _write_plan(
        self, plan: WindowPlan | LettersPlan, published: Published, own: list, progress: Progress
    ) -> Iterator[dict]:
        """One plan, its window or letters published with cumulative.json and the run counts,
        under one failure handler, whatever fails (any Exception: each store and step raises
        its own): the stream drains and stops (stream_drain.fail), what the write made true
        (Written, as its steps report it) stands and is counted, and the rest is letters, so
        no failure escapes the step (Beam would retry the bundle and the job die undrained,
        losing what the open windows hold). Every branch writes the run counts once."""
        if progress.failed is not None:
            self._unpublished(plan, progress)
            return
        # What cumulative.json says of the windows: the controller's, while the writer
        # publishes them; after a window it could not, only the windows before it.
        before = (progress.windows, progress.published_ms, progress.origin_ms)
        counts = (progress.rows, progress.rejected, dict(progress.next_id))
        progress.windows, progress.published_ms, progress.origin_ms = published
        written = Written()
        try:
            if isinstance(plan, WindowPlan):
                self._write(plan, window_ids(plan, own), progress, written)
            else:
                progress.rejected += len(plan.letters)
            write_cumulative(self._config, progress, self._letters_of(plan), written)
        except Exception as err:
            progress.failed = (
                f"{type(err).__name__}: {JobStopped.message_in(err) or err}".splitlines()[0]
            )
            logging.error("%s: the stream stops: %s", plan.name, progress.failed)
            fail(err)
            if written.manifest is not None:  # swapped in: exported, whatever failed after
                yield written.manifest
                if written.letters:
                    self._letter(progress, "", [], 0, "")
                    return
                # Its letters did not go with it: they go the letters' way.
                unsettled = plan.read - written.manifest["records"]["exported"]
                progress.rejected -= unsettled
                cause = f"{plan.name}'s letters were not published with it ({progress.failed})"
                letters = plan.requests.held
                self._letter(progress, f"letters-of-{plan.name}", letters, unsettled, cause)
                return
            if isinstance(plan, LettersPlan) and written.letters:
                self._letter(progress, "", [], 0, "")  # its letters stand: counted as they are
                return
            progress.windows, progress.published_ms, progress.origin_ms = before
            progress.rows, progress.rejected, progress.next_id = counts
            self._unpublished(plan, progress)
            return
        if written.manifest is not None:
            yield written.manifest

    @staticmethod
    def _letters_of(plan: WindowPlan | LettersPlan) -> tuple[str, list[DeadLetter]] | None:
        """A letters run's (name, letters) published with cumulative.json; a window's go with it."""
        return None if isinstance(plan, WindowPlan) else (plan.name, plan.letters)

    def _unpublished(self, plan: WindowPlan | LettersPlan, progress: Progress) -> None:
        """A plan not published (the writer failed on it or on one before it: no later window
        may follow a missing one) is dead letters, counted: its records' letters as they were,
        a window's requests' (text-free: their times from the zero and lengths) with the cause.
        They go with the run counts, not cumulative.json: no window is added, so the totals
        stand as they are, and a writer that cannot write those still letters what it read."""
        cause = f"{plan.name} was not published ({progress.failed})"
        if isinstance(plan, LettersPlan):
            self._letter(progress, plan.name, plan.letters, len(plan.letters), cause)
            return
        lost = [
            DeadLetter(
                shown_name(self._config.source),
                row_identity(row),
                UNPUBLISHED_WINDOW,
                f"{plan.name} was not published: {progress.failed}",
            )
            for row in plan.requests.whole.requests
        ]
        held = plan.requests.held
        self._letter(progress, f"unpublished-{plan.name}", held + lost, plan.read, cause)

    def _letter(
        self, progress: Progress, run: str, letters: list[DeadLetter], read: int, cause: str
    ) -> None:
        """letters (of read records, not published where they were planned: cause) published
        as the run `run` with the run counts that count them (write_letters); the run counts
        alone when there are none."""
        progress.rejected += read
        try:
            if letters:
                write_letters(self._config, progress, (run, letters))
            else:
                _replace(self._config.run_counts(), run_counts_json(progress), private=True)
        except Exception as err:
            unwritten = f"{type(err).__name__}: {JobStopped.message_in(err) or err}"
            unwritten = unwritten.splitlines()[0]
            progress.rejected -= read
            if not read:  # the stream stops on its first failure already
                logging.error("the run counts could not be written: %s", unwritten)
                return
            # The letters cannot be written either (a full disk): nothing lost silently, the
            # stream stops with one line counting the records neither published nor lettered,
            # and the run counts count only what was written, if they can be written.
            progress.unwritten += read
            line = (
                f"{progress.unwritten} records read were neither published nor lettered: "
                f"{cause} and its letters could not be written ({unwritten})"
            )
            logging.error("%s", line)
            fail(JobStopped(line), supersede=True)
            with suppress(Exception):
                _replace(self._config.run_counts(), run_counts_json(progress), private=True)

    def _write(
        self, plan: WindowPlan, numbered: dict[str, KindIds], progress: Progress, written: Written
    ) -> None:
        """One window as a night of the batch job, its ids continuing the stream's, counted
        once it stands (written.manifest), whatever fails after. Whole in one attempt: a
        retried or restored one starts again from nothing."""
        try:
            self._publish_window(plan, numbered, progress, written)
        finally:
            if written.manifest is not None:
                for kind, ids in numbered.items():
                    progress.next_id[kind] += ids.added_count
                exported = written.manifest["records"]["exported"]
                progress.rows += exported
                self._windows.inc()
                self._rows.inc(exported)
                progress.rejected += plan.read - exported  # each exported or a letter

    def _publish_window(
        self, plan: WindowPlan, numbered: dict[str, KindIds], progress: Progress, written: Written
    ) -> None:
        """The window's folder and letters published, whole, or nothing of them; written says
        which stand: the window once publish_night swapped it in, its letters once their
        settle reports their file renamed in."""
        job = self._config.job
        output = storage.join(job.output, plan.name)
        claim_window(job.output, plan.name)
        # The window's letters are a run of the batch job's protocol, named by the stream and
        # the window: a window published again after a restart replaces its letters as it
        # replaces its folder, another stream's never.
        rejected = DeadLetterRun(job.dead_letter, output, self._config.run_name(plan.name))
        night = dataclasses.replace(
            job,
            inputs=(),
            max_rejected_fraction=None,
            output=output,
            staging=storage.join(job.staging, plan.name),
            dead_letter=rejected.staging,
        )
        # From nothing: what an attempt killed mid-window left is not part of this one.
        for leftover in (night.staging, rejected.staging):
            storage.remove_folder(leftover)
        if job.block_hashes:  # a window's block hashes as FOLDER/KEY-window-*/, naming its output
            night = dataclasses.replace(
                night, block_hashes=storage.join(job.block_hashes, self._config.run_name(plan.name))
            )
            storage.remove_folder(block_hashes_staging(night.block_hashes, night.staging))
        make_staging(night.staging)
        rejected.begin(night.staging)
        try:
            written.manifest = publish_night(night, plan.requests, numbered, dict(progress.next_id))
        except Exception:
            _remove_partial(output)
            raise
        finally:  # with the window, or gone with the attempt
            settled = _settle_or_drop(rejected, written.manifest is not None)
        written.letters = rejected.published in settled


def _remove_partial(output: str) -> None:
    """What a failed publish copied of a window into an object store (one object at a time,
    its manifest last: publish._publish_remote) removed, unless a manifest stands there (a
    whole window, as an earlier attempt published it); a local window is swapped in whole."""
    if storage.is_url(output) and not storage.exists(storage.join(output, MANIFEST)):
        with suppress(OSError):  # the failure stays the publish's; a copy left has no manifest
            storage.remove_folder(output)


@dataclasses.dataclass
class Written:
    """What a plan's write made true, as each step reports it once it did: the failure handler
    decides from this what stands, never from which call raised nor from a name existing."""

    manifest: dict | None = None  # the window's, once publish_night swapped it in
    letters: bool = False  # the plan's letters renamed in (DeadLetterRun.settle reported it)


def claim_window(folder: str, name: str) -> None:
    """The stream's folder's mark names a window before it is published there, so a folder
    standing at a window's name is replaced only where the stream claimed that name already
    (an attempt at the window, retried or restored, after the claim), never one it did not
    write (made there around the mark, or before it): a one-line stop, nothing replaced."""
    if storage.is_url(folder):  # its mark claims no window: it only tells the folder's
        mark_stream_object(folder)  # writer, again before each window (a restored job's too)
        return
    claimed = window_index(claimed_by(folder, STREAM_WRITER))
    place = storage.join(folder, name)
    standing = [i for i in map(window_index, os.listdir(folder)) if i is not None]
    # A claim counts only as far as the stream could have made it: at most one past the
    # windows standing (a restored attempt may re-publish one before its claim); a mark
    # claiming further (set by someone else) makes no folder the stream's.
    own = claimed is not None and window_index(name) <= claimed <= max(standing, default=-1) + 1
    if not own and os.path.lexists(place):
        raise OutputRefused(
            f"{place} stands at the stream's next window's name, and the stream did not write "
            f"it: a stream replaces only its own windows; move it out of {folder}"
        )
    if not own and not mark_output(folder, STREAM_WRITER, claimed=name):
        raise OutputRefused(f"{folder}: its file system no longer keeps the stream's mark")


def cumulative_summary(config: StreamingConfig, progress: Progress) -> dict[str, int | None]:
    """The stream so far, as far as its windows' rows prove it (trace_format.
    STREAM_TOTALS_SCHEMA). Its window length lets the gate recompute each window's cut; its
    one time is the end of the last published window relative to the trace's zero, counted in
    whole windows (as they are cut from the zero) whatever the state holds, and rounded as the
    rows' timestamps are: the zero's own epoch is never published."""
    published_until_ms = None
    if progress.published_ms is not None and progress.origin_ms is not None:
        windows = (progress.published_ms - progress.origin_ms) // config.window_ms + 1
        published_until_ms = int(
            round_to(np.int64(windows * config.window_ms), config.job.coarsening.timestamp_ms)
        )
    return {
        "windows": progress.windows,
        "rows": progress.rows,
        "unique_blocks": progress.next_id["blocks"],
        "sessions": progress.next_id["sessions"],
        "window_ms": config.window_ms,
        "published_until_ms": published_until_ms,
    }


def stream_run_counts(progress: Progress) -> dict[str, int]:
    """The stream's own counts, as a batch run's (write/manifest.run_counts) as far as a stream
    keeps them: each record read is exported in a window or a dead letter."""
    return {
        "read": progress.rows + progress.rejected,
        "exported": progress.rows,
        "rejected": progress.rejected,
    }


def run_counts_json(progress: Progress) -> bytes:
    return canonical_json(stream_run_counts(progress))


def write_cumulative(
    config: StreamingConfig,
    progress: Progress,
    letters: tuple[str, list[DeadLetter]] | None = None,
    written: Written | None = None,
) -> None:
    """The stream so far, beside the windows (replaced whole after each window), and its own
    counts beside its dead letters (RUN_COUNTS, owner-only, as a batch run's); letters (a run's
    name, its dead letters) are published with it, as a window's are with the window, so the
    letters published are the ones the run counts count (written.letters once they are)."""
    output = storage.join(config.job.output, STREAM_TOTALS)
    temporary = storage.join(config.job.output, f".{STREAM_TOTALS}.tmp")
    with storage.create(temporary) as handle:
        handle.write(canonical_json(cumulative_summary(config, progress)))
    if letters is None:
        storage.rename(temporary, output)
    elif _rename_with_letters(config, temporary, output, letters) and written is not None:
        written.letters = True
    # The folder's times, as a night folder's: derived from its content, never the clock's.
    set_content_times(config.job.output)
    # Last: once it counts a record, the window or letters holding it are published.
    _replace(config.run_counts(), run_counts_json(progress), private=True)


def write_letters(
    config: StreamingConfig, progress: Progress, letters: tuple[str, list[DeadLetter]]
) -> None:
    """Letters (a run's name, its dead letters) published with the run counts that count them,
    cumulative.json untouched (no window added): how a stream whose writer failed letters
    what it read, whatever stops cumulative.json being written."""
    path = config.run_counts()
    folder, name = path.rsplit("/", 1)
    temporary = storage.join(folder, f".{name}.tmp")
    with storage.create(temporary, private=True) as handle:
        handle.write(run_counts_json(progress))
    _rename_with_letters(config, temporary, path, letters)


def _rename_with_letters(
    config: StreamingConfig, temporary: str, path: str, letters: tuple[str, list[DeadLetter]]
) -> bool:
    """temporary renamed to path with letters (a run's name, its dead letters) published by the
    same step (DeadLetterRun): the letters published are the ones the file counts. Whether the
    run's letters file was renamed in, as the settle reports it; should a step fail, the
    letters not published are dropped (_drop)."""
    run_name, dead_letters = letters
    rejected = DeadLetterRun(config.job.dead_letter, path, config.run_name(run_name))
    storage.remove_folder(rejected.staging)  # an attempt killed mid-way: not part of this one
    rejected.begin(temporary)  # the rename keeps the file's identity
    try:
        write_dead_letters(rejected.staging, dead_letters)
        storage.rename(temporary, path)
    except Exception:
        _drop(rejected)
        raise
    return rejected.published in _settle_or_drop(rejected, run_succeeded=True)


def _settle_or_drop(rejected: DeadLetterRun, run_succeeded: bool) -> list[str]:
    """rejected.settle's files published; should it fail, the letters it did not publish are
    dropped (_drop): the writer letters them another way."""
    try:
        return rejected.settle(run_succeeded)
    except Exception:
        _drop(rejected)
        raise


def _drop(rejected: DeadLetterRun) -> None:
    """A stream's letters run that failed, its staged letters removed and then its pointer
    (beside the staged file or folder: in the published folder for cumulative.json's), which
    names the private dead-letter folder: no run of the stream settles them later, the writer
    letters them another way or counts them unlettered (WriteWindows._letter)."""
    storage.remove_folder(rejected.staging)
    if rejected.pointer is not None:  # last: it tells of the letters until they are gone
        with suppress(FileNotFoundError):
            os.remove(rejected.pointer)
        storage.forget_on_exit(rejected.pointer)


def _replace(path: str, content: bytes, private: bool) -> None:
    """path replaced whole: whoever reads it while the stream runs reads one version."""
    folder, name = path.rsplit("/", 1)
    temporary = storage.join(folder, f".{name}.tmp")
    with storage.create(temporary, private=private) as handle:
        handle.write(content)
    storage.rename(temporary, path)


def check_new_stream(output: str, dead_letter: str, block_hashes: str | None = None) -> None:
    """A stream starts in a new or empty --output: its ids live in its runner's state, so a
    second stream into a stream's folder would number from 0 again beside the first one's
    windows (a restarted job restores its state and goes on; it is not launched again), and
    its windows beside a night's would read as one trace. Its files in folders streams share
    are named by its output (StreamingConfig.key): its letters and run counts, its windows'
    block hashes (FOLDER/KEY-window-*/), so only an earlier stream of this same output (its
    folder since emptied) could have left files the new one would replace: every folder the
    key names is checked, in one list."""
    if storage.exists(storage.join(output, STREAM_TOTALS)):
        raise ConfigError(
            f"--output {output} holds a stream already (cumulative.json): its ids "
            "continue only in its own job; a new stream needs a new --output"
        )
    if _holds_anything(output):
        raise ConfigError(
            f"--output {output} is not empty: a stream starts in a new or empty folder"
        )
    parent = os.path.dirname(output.rstrip("/"))
    if not storage.is_url(output) and not os.path.isdir(parent):
        return  # a new place: no stream of it has written anything
    key = output_key(output)  # StreamingConfig.stream_key's: every file it names bears it
    keyed = [
        ("--dead-letter", dead_letter, "letters"),
        ("--emit-block-hashes", block_hashes, "block hashes"),
    ]
    for flag, folder, what in keyed:
        if folder and any(key in name for name in _names_at_top(folder)):
            raise ConfigError(
                f"{flag} {folder} holds the {what} of an earlier stream of --output {output} "
                f"(named by it, as a new stream's would be); a new stream needs a new "
                f"--output or its own {flag}"
            )


def _names_at_top(folder: str) -> set[str]:
    """The names a folder holds at its top, files and folders (an object store's: its
    objects' first names); none when it does not exist."""
    if storage.is_url(folder):
        return {name.split("/", 1)[0] for name in storage.files_in(folder, nested=True)}
    try:
        return set(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return set()


def _holds_anything(folder: str) -> bool:
    if storage.is_url(folder):
        return bool(storage.files_in(folder, nested=True))
    try:
        return bool(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):  # new, or not a folder (refused later)
        return False


class Stopped(NamedTuple):
    """A local stream stopped, drained: the stop's signal and the windows it published."""

    signum: int
    windows: int
    counts: str  # where its run counts are


def run_streaming(config: StreamingConfig, flags: list[str]) -> Stopped | None:
    """Run until the runner stops the stream (a drain publishes every window still open); on
    the local DirectRunner a stop drains it (stream_drain), said in what this returns."""
    options = pipeline_options(flags)
    options.view_as(StandardOptions).streaming = True
    check_new_stream(config.job.output, config.job.dead_letter, config.job.block_hashes)
    make_stream_folder(config.job.output)
    config = dataclasses.replace(config, key=config.stream_key())
    local = not is_remote(options) and PUBSUB.fullmatch(config.source)
    with drained_on_stop(lambda: published_windows(config)) if local else nullcontext() as drain:
        run(
            lambda pipeline: build(pipeline | "Read" >> read_source(config.source), config), options
        )
    if drain is not None and drain.failure is not None:
        raise drain.failure  # drained: every record read is published or a letter, counted
    if drain is None or drain.signum is None:
        return None
    windows = published_windows(config) - drain.published_at_stop
    return Stopped(drain.signum, windows, config.run_counts())


def published_windows(config: StreamingConfig) -> int:
    """The windows the stream's cumulative.json counts (0 before its first)."""
    path = storage.join(config.job.output, STREAM_TOTALS)
    if not storage.exists(path):
        return 0
    with storage.open_read(path) as handle:
        return int(parse_json(handle.read())["windows"])


def make_stream_folder(output: str) -> None:
    """The stream's folder: one kvtrace makes is rwxr-xr-x whatever the writer's umask (the mode
    publish gives a night's folder, the one the gate passes) and, like a night's staging folder,
    inherits nothing of its parent (storage.inherit_nothing); an existing one is the user's,
    never changed but for the mark below, only refused in one line if it would pass on what the gate refuses
    (check_inherited, as storage.unfit_for_private_files refuses and never changes). It is
    marked as the stream's output (publish.mark_output), so no other command writes in it, on
    every file system: a local one by its extended attribute, an object store's by the
    mark's object (publish.mark_stream_object, the bytes the gate keeps), before its first
    window too."""
    made = storage.make_folder(output)
    if storage.is_url(output):
        mark_stream_object(output)
        return
    if made:
        storage.inherit_nothing(output, storage.PUBLIC_FOLDER)
    check_inherited(output, given=True)
    # The stream's output as every other command's plan finds one (publish.folder_writer):
    # none writes inside it; the stream itself adds its windows (claim_window).
    if not mark_output(output, STREAM_WRITER):
        raise OutputRefused(
            f"--output {output}: its file system keeps no extended attributes, so the "
            f"stream's folder cannot be marked as its output (which keeps every other command "
            f"out of it): stream into a folder on a local disk"
        )


def build(messages: beam.PCollection, config: StreamingConfig) -> beam.PCollection:
    """Messages (bytes, one request each) in; each published window's manifest out."""
    job = config.job
    source = shown_name(config.source)  # as letters show a source (read/sources.read_range)
    records = messages | "Source" >> beam.Map(lambda message: (source, message))
    parsed = parse_records(records, job.parse)
    # Timestamp kinds are judged per window, against the stream's input so far (PublishWindows).
    encoded = parsed.requests | "Encode" >> Encode(job.encode, one_timestamp_kind=False)
    controlled = (
        (encoded["hashed"], parsed[DEAD_LETTER_TAG], encoded[DEAD_LETTER_TAG])
        | "Everything" >> beam.Flatten()
        | "OneKey" >> beam.Map(lambda item: (0, item))
        | "PublishWindows"
        >> beam.ParDo(PublishWindows(config)).with_outputs(SEEN, QUERY, main="plans")
    )
    # The id map in (kind, shard) keys: seen sets, the numbering of new hashes, the stores.
    new = controlled[SEEN] | "SeenShards" >> beam.ParDo(SeenShard())
    numbered = new | "NumberNew" >> beam.ParDo(NumberNew(config.id_shards)).with_outputs(
        NumberNew.ADDED, main="ids"
    )
    answers = (
        (numbered.ids, controlled[QUERY])
        | "ToStores" >> beam.Flatten()
        | "ShardStores" >> beam.ParDo(ShardStore())
    )
    return (
        (
            controlled.plans,
            numbered[NumberNew.ADDED]
            | "Added" >> beam.MapTuple(lambda window, kind, new: (0, (ADDED, window, kind, new))),
            answers
            | "Answers" >> beam.MapTuple(lambda window, answer: (0, (ANSWER, window, *answer))),
        )
        | "ToWriter" >> beam.Flatten()
        | "WriteWindows" >> beam.ParDo(WriteWindows(config))
    )
