"""`kvtrace anonymize` on this machine without Beam: the same stage functions as the Beam pipeline
(anonymize_beam.py), called in one process, with byte-identical output (tests/pipelines/test_local_engine.py).

Why a second engine: importing Beam and building and starting the pipeline cost ~8 s, more than
a small job's work, and Beam's local multi-process mode gets slower with more workers (the
runner's data plane, measured on 16 cores). Here the Rust tokenizer uses every core, rendering
and hashing overlap it, and numbering ids is one numpy sort over the whole night. Of an id map,
a night reads only the row groups that can hold its keys (segments.py); a compaction night
holds the whole map (24 bytes per id): maps beyond ~1e8 ids, like nights beyond one machine,
belong on a distributed runner through the Beam pipeline.

read -> parse -> batch -> render | tokenize (background thread) | hash -> number -> write

File ranges are encoded in worker processes, one or --processes N (local_workers.py: everything
up to hashing is per record, so it spreads), forked from this one once it has loaded the
tokenizer; numbering and writing (anonymize_night.py, the night's end every engine runs) stay in
this process. Even one worker is a process of its own: the native code that renders and
tokenizes may abort (a failed allocation in Rust), and this process, which never runs it on
input, outlives that to say so in one line and publish nothing.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from kvtrace.pipelines.anonymize_config import AnonymizeConfig
from kvtrace.pipelines.anonymize_night import Encoded, finish_night
from kvtrace.pipelines.local_workers import encode_in_workers, worker_count
from kvtrace.pipelines.progress import RangeCounts
from kvtrace.transforms import storage
from kvtrace.transforms.batching import batches_by_weight
from kvtrace.transforms.dead_letters import DeadLetter, SortedRuns, StagedLetters
from kvtrace.transforms.encode.encode_requests import (
    TOKENIZE_BATCH_BYTES,
    TOKENIZE_BATCH_REQUESTS,
    EncodedBatch,
    OverlappedEncoder,
    RequestEncoder,
    open_encoder,
)
from kvtrace.transforms.encode.fast_backend import TOKENIZERS
from kvtrace.transforms.encode.hashed_batch import HashedBatch
from kvtrace.transforms.encode.segment_cache import CacheCounts, log_counts
from kvtrace.transforms.read.batch_join import (
    BatchSpill,
    Half,
    batch_half,
    joined_partition,
    merge_partition,
)
from kvtrace.transforms.read.records import ParseOptions, Request
from kvtrace.transforms.read.sources import (
    FileRange,
    file_ranges,
    parse_one,
    read_range,
    stored_bytes,
)
from kvtrace.transforms.trace_format import INPUT_LENGTH_FIELD

_LOG = logging.getLogger("kvtrace")
# Workers claim input in ranges this size: the last ones to finish are ~0.3 s of a core apart
# (8 MB ranges, ~1.3 s of tokenizing each, left one worker waiting up to that long).
CLAIM_BYTES = 2 << 20
# Records a worker reads, at most, to find one to render before its first claim.
WARM_UP_RECORDS = 64


def run_local(config: AnonymizeConfig, processes: int = 0) -> dict:
    """Run the job; returns the manifest, written last. Raises JobStopped (nothing published)
    when too much input is rejected."""
    encoded = encode_inputs(config, processes)
    log_counts(encoded.cache)
    return finish_night(config, encoded)


def encode_inputs(config: AnonymizeConfig, processes: int) -> Encoded:
    """Every input record encoded by worker processes in runs of file ranges (local_workers.py:
    each range parsed, rendered, tokenized and hashed where it is read); OpenAI Batch files'
    lines set aside as they are read and encoded once joined (join_batches). Results are
    gathered in range order; dead letters are merged into their declared order when published
    (dead_letters.py), whichever worker wrote them."""
    sized = [
        (piece, size)
        for path, size in config.inputs
        for piece in file_ranges(path, size, CLAIM_BYTES)
    ]
    pieces = [piece for piece, _ in sized]
    total_bytes = sum(size for _, size in config.inputs)
    processes = min(worker_count(processes, total_bytes), len(pieces))
    parts = encode_in_workers(
        RangeEncoding(config, processes),
        pieces,
        processes,
        [stored_bytes(piece, size) for piece, size in sized],
    )
    parts += join_batches(config, [run for p in parts for run in p.batch_halves], processes)
    fallback = next((p.backend_fallback for p in parts if p.backend_fallback), None)
    cache = functools.reduce(CacheCounts.add, (p.cache for p in parts), CacheCounts())
    if fallback and config.tokenizer_backend != TOKENIZERS:
        # Texts encoded before the difference was seen hold the fast backend's ids: the whole
        # input again, so the output is a tokenizers run's however the work was ordered (the
        # first pass's letter runs are left in the staging folder, which goes with the run).
        _LOG.warning("encoding the input again with tokenizers alone (%s)", fallback)
        return encode_inputs(replace(config, tokenizer_backend=TOKENIZERS), processes)
    if cache.mismatches and config.segment_cache_bytes:
        # Likewise texts cut before a sampled one showed the cut unsafe: whether one does is
        # the input's alone (sampled by content), so the output is a cacheless run's.
        _LOG.warning("encoding the input again without the segment cache (%s)", cache.disabled)
        return encode_inputs(replace(config, segment_cache_bytes=0), processes)
    return Encoded(
        [b for p in parts for b in p.hashed],
        [],
        sum(p.read for p in parts),
        cache,
        sum((p.staged for p in parts), StagedLetters()),
    )


def join_batches(
    config: AnonymizeConfig, halves: list[tuple[int, str, int]], processes: int
) -> list[Encoded]:
    """The Batch lines the workers set aside (halves: (partition, run, bytes) of every run they
    wrote), joined and encoded: each partition's runs merged into one file sorted by custom_id
    (here: bytes only, nothing decoded), then the files encoded by workers as ranges are
    (JoinEncoding). Nothing when there are none."""
    if not halves:
        return []
    partitions = sorted({partition for partition, _, _ in halves})
    pieces = [
        FileRange(
            merge_partition(
                [run for p, run, _ in halves if p == partition],
                storage.join(config.dead_letter, f"batch-joined-{partition}.jsonl"),
            ),
            0,
            None,
        )
        for partition in partitions
    ]
    sizes = [sum(size for p, _, size in halves if p == partition) for partition in partitions]
    _LOG.info("joining %.1f MB of OpenAI Batch lines by custom_id", sum(sizes) / 1e6)
    parts = encode_in_workers(JoinEncoding(config), pieces, min(processes, len(pieces)), sizes)
    # Removed once every worker is done: a worker started clean warms up on the first file
    # whoever encodes it.
    storage.delete([piece.path for piece in pieces])
    return parts


@dataclass(frozen=True)
class RangeEncoding:
    """What encoding a run's file ranges takes, in a worker process (local_workers.RangeWork):
    partitions, how many parts the Batch lines set aside are joined in."""

    config: AnonymizeConfig
    partitions: int = 1

    def new_encoder(self) -> RequestEncoder:
        return open_encoder(self.config.encode)

    def warm_up(self, encoder: RequestEncoder, first: FileRange) -> None:
        """Render the input's first record that parses here, so that forked workers inherit the
        template renderer imported and the template compiled; prompt-only input never imports
        it."""
        _warm_up(encoder, read_range(first, self.config.parse.max_record_bytes), self.config)

    def encode(
        self, pieces: list[FileRange], encoder: RequestEncoder, progress: RangeCounts | None = None
    ) -> Encoded:
        return encode_ranges(
            pieces,
            encoder,
            self.config.parse,
            self.config.dead_letter,
            progress,
            BatchSpill(self.config.dead_letter, self.partitions),
        )


@dataclass(frozen=True)
class JoinEncoding:
    """What encoding the sorted files of Batch lines takes (join_batches), in a worker process:
    each file's joined records (batch_join.joined_partition), encoded as a range's are."""

    config: AnonymizeConfig

    def new_encoder(self) -> RequestEncoder:
        return open_encoder(self.config.encode)

    def warm_up(self, encoder: RequestEncoder, first: FileRange) -> None:
        _warm_up(encoder, joined_partition(first.path), self.config)

    def encode(
        self, pieces: list[FileRange], encoder: RequestEncoder, progress: RangeCounts | None = None
    ) -> Encoded:
        rejected = SortedRuns(self.config.dead_letter)
        records = (item for piece in pieces for item in joined_partition(piece.path))
        hashed, read = _encode(records, encoder, self.config.parse, rejected, progress)
        return Encoded(
            hashed,
            [],
            read,
            encoder.take_cache_counts(),
            rejected.close(),
            encoder.backend_fallback,
        )


def _warm_up(
    encoder: RequestEncoder,
    records: Iterable[tuple[str, Any] | DeadLetter],
    config: AnonymizeConfig,
) -> None:
    """Render the first record that parses, of the first few (a Batch line alone parses to a
    letter), so workers start with the renderer imported and the template compiled."""
    parse = config.parse
    for item in itertools.islice(records, WARM_UP_RECORDS):
        request = item if isinstance(item, DeadLetter) else parse_one(*item, parse)
        if not isinstance(request, DeadLetter):
            encoder.render([request])
            return


def encode_ranges(
    pieces: Iterable[FileRange],
    encoder: RequestEncoder,
    parse: ParseOptions,
    letters: str,
    progress: RangeCounts | None = None,
    spill: BatchSpill | None = None,
) -> Encoded:
    """Read, parse, batch, render, tokenize and hash the records of some file ranges (tokenizing
    in a background thread, encode_requests.OverlappedEncoder); their dead letters written as
    they come into sorted runs in the folder letters (dead_letters.SortedRuns). With a spill,
    the lines of OpenAI Batch files are set aside into it, to be joined (join_batches)."""
    rejected = SortedRuns(letters)

    def records() -> Iterator[tuple[str, Any] | DeadLetter]:
        for piece in pieces:
            for item in read_range(
                piece, parse.max_record_bytes, progress, parse.withholds_letters
            ):
                half = (
                    None
                    if isinstance(item, DeadLetter) or spill is None
                    else batch_half(item[1], parse)
                )
                if half is None:
                    yield item
                else:
                    spill.add(half[0], Half(half[1], *item, half[2]))

    hashed, read = _encode(records(), encoder, parse, rejected, progress)
    return Encoded(
        hashed,
        [],
        read,
        encoder.take_cache_counts(),
        rejected.close(),
        encoder.backend_fallback,
        spill.close() if spill is not None else (),
    )


def _encode(
    records: Iterable[tuple[str, Any] | DeadLetter],
    encoder: RequestEncoder,
    parse: ParseOptions,
    rejected: SortedRuns,
    progress: RangeCounts | None,
) -> tuple[list[HashedBatch], int]:
    hashed: list[HashedBatch] = []
    read = 0

    def requests() -> Iterator[Request]:
        nonlocal read
        for item in records:
            if isinstance(item, DeadLetter) and item.share is not None:
                rejected.add(item)  # a Parquet file's share (read/sources.RowShare): no record
                continue
            read += 1
            if progress is not None:
                progress.records()
            parsed = item if isinstance(item, DeadLetter) else parse_one(*item, parse)
            if isinstance(parsed, DeadLetter):
                rejected.add(parsed)
            else:
                yield parsed

    def finish(encoded: EncodedBatch | None) -> None:
        if encoded is not None:
            batch, empty = encoded
            for letter in empty:
                rejected.add(letter)
            if batch is not None:
                hashed.append(batch)
                if progress is not None:
                    progress.tokens(int(batch.requests[INPUT_LENGTH_FIELD].sum()))

    encoding = OverlappedEncoder(encoder)
    try:
        for batch in batches_by_weight(
            requests(), TOKENIZE_BATCH_BYTES, lambda r: len(r.line), TOKENIZE_BATCH_REQUESTS
        ):
            failed, previous = encoding.push(batch)
            for letter in failed:
                rejected.add(letter)
            finish(previous)
        finish(encoding.flush())
    finally:
        encoding.close()
    return hashed, read
