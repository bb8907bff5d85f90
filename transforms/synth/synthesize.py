"""`kvtrace synthesize`, the pure part: a trace in, a reshaped trace out (as columns).

Order of operations: with --num-requests, new requests are drawn first (sample.py); tree
copies are drawn per session (or per request) from the seed; every
request is reshaped (reshape.py); timestamps are divided by the speed-up; output lengths are
scaled and clamped; rows outside the input-length bounds are dropped; ids are numbered densely
in order of first appearance in the output, whose rows are in time order, ties by content
(output_order).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import xxhash

from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.read.trace_io import HIGHEST, Trace
from kvtrace.transforms.stats.trace_blocks import prefix_ids
from kvtrace.transforms.synth.parts import RowParts, session_text
from kvtrace.transforms.synth.reshape import MAX_TREE_COPIES, Knobs, mix64, reshape
from kvtrace.transforms.synth.sample import sample_requests
from kvtrace.transforms.trace_format import OUTPUT_LENGTH_FIELD, TIMESTAMP_FIELD


@dataclass(frozen=True)
class SynthConfig:
    knobs: Knobs = field(default_factory=Knobs)
    speedup_ratio: float = 1.0
    osl_multiplier: float = 1.0
    min_isl: int | None = None
    max_isl: int | None = None
    min_osl: int | None = None
    max_osl: int | None = None
    num_requests: int | None = None  # draw this many new requests from the trace first
    seed: int = 0

    def check(self) -> None:
        knobs = self.knobs
        if (
            self.speedup_ratio <= 0
            or knobs.prefix_len_multiplier < 0
            or knobs.prompt_len_multiplier < 0
            or self.osl_multiplier < 0
        ):
            raise ValueError("--speedup-ratio must be > 0 and the multipliers >= 0")
        if not 1 <= knobs.prefix_root_multiplier <= MAX_TREE_COPIES:
            raise ValueError(f"--prefix-root-multiplier must be in 1..{MAX_TREE_COPIES}")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError("--num-requests must be >= 1")
        for low, high, name in (
            (self.min_isl, self.max_isl, "isl"),
            (self.min_osl, self.max_osl, "osl"),
        ):
            if low is not None and high is not None and low > high:
                raise ValueError(f"--min-{name} is above --max-{name}")


def synthesize(trace: Trace, block_size: int, config: SynthConfig) -> Trace:
    config.check()
    parts = RowParts.of(trace, block_size)
    if config.num_requests is not None:
        trace = sample_requests(
            trace, parts, config.num_requests, block_size, np.random.default_rng([config.seed, 1])
        )
        parts = RowParts.of(trace, block_size)
    copies = tree_copies(trace, config.knobs.prefix_root_multiplier, config.seed)
    reshaped = reshape(trace, parts, config.knobs, copies, block_size)
    keep = np.ones(len(trace), dtype=bool)
    if config.min_isl is not None:
        keep &= reshaped.input_length >= config.min_isl
    if config.max_isl is not None:
        keep &= reshaped.input_length <= config.max_isl
    # Rows in content order first (as they were reshaped), so rows output_order leaves tied,
    # alike in all they hold, keep the roles reshaping gave them in that order.
    rows = parts.order[keep[parts.order]]
    timestamp = scaled_timestamps(trace.timestamp[rows], config)
    output_length = scaled_osl(trace.output_length[rows], config)
    fingerprint = content_fingerprints(trace)[rows]
    order = output_order(
        timestamp, trace.timestamp[rows], reshaped.input_length[rows], output_length, fingerprint
    )
    rows, timestamp, output_length = rows[order], timestamp[order], output_length[order]
    labels = [reshaped.labels[r] for r in rows.tolist()]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(part) for part in labels], out=offsets[1:])
    output = Trace(
        timestamp=timestamp.astype(np.float64),
        input_length=reshaped.input_length[rows],
        output_length=output_length,
        offsets=offsets,
        ids=np.concatenate(labels + [np.empty(0, np.int64)]),
        session=trace.session[rows] if trace.session is not None else None,
        line=np.arange(1, len(rows) + 1),
        file_index=np.zeros(len(rows), dtype=np.int32),
        files=["synthesized"],
    )
    output.ids = dense_by_first_appearance(prefix_ids(output))
    return output


def tree_copies(trace: Trace, copies: int, seed: int) -> np.ndarray:
    """A tree copy per row, drawn once per session (a request without one is its own): turns
    of a conversation stay in one tree. Drawn from a hash of the seed and the session, or of
    what a request without one holds (time, lengths, ids), never of where it sits: the same rows
    in any order or split draw the same trees, and a shard of conversations draws what the
    whole trace does."""
    if copies == 1:
        return np.zeros(len(trace), dtype=np.int64)
    seed_key = int(mix64(np.array([seed], dtype=np.uint64))[0])
    sessions = trace.session.tolist() if trace.session is not None else [None] * len(trace)
    drawn = np.array(
        [
            xxhash.xxh3_64_intdigest(_unit_bytes(trace, row, session), seed=seed_key)
            for row, session in enumerate(sessions)
        ],
        dtype=np.uint64,
    )
    return (drawn % np.uint64(copies)).astype(np.int64)


def _unit_bytes(trace: Trace, row: int, session: object) -> bytes:
    """What names a row's unit: its session as hashed (session_text), else the row's content
    (a NUL after "row" keeps it apart from every session text, which starts with a type name)."""
    if session is not None:
        return session_text(session).encode()
    lengths = np.array([trace.input_length[row], trace.output_length[row]], dtype="<i8")
    return b"".join(
        [
            b"row\0",
            np.array([trace.timestamp[row]], dtype="<f8").tobytes(),
            lengths.tobytes(),
            trace.ids[trace.offsets[row] : trace.offsets[row + 1]].astype("<i8").tobytes(),
        ]
    )


# A row's content digest, 128 bits as two uint64 fields.
FINGERPRINT = np.dtype([("hi", "<u8"), ("lo", "<u8")])


def content_fingerprints(trace: Trace) -> np.ndarray:
    """Per row, a digest (FINGERPRINT) of everything it holds: time, lengths, ids, session as
    hashed (session_text). Computed from the row alone, so every shard gives a row the same."""
    sessions = trace.session.tolist() if trace.session is not None else [None] * len(trace)
    out = np.empty(len(trace), dtype=FINGERPRINT)
    for row, session in enumerate(sessions):
        ids = trace.ids[trace.offsets[row] : trace.offsets[row + 1]]
        head = np.array([trace.input_length[row], trace.output_length[row], len(ids)], "<i8")
        digest = xxhash.xxh3_128_intdigest(
            b"".join(
                [
                    np.array([trace.timestamp[row]], dtype="<f8").tobytes(),
                    head.tobytes(),  # the id count ends the ids: the session's text follows
                    ids.astype("<i8").tobytes(),
                    b"\0" if session is None else b"\1" + session_text(session).encode(),
                ]
            )
        )
        out[row] = (digest >> 64, digest & ((1 << 64) - 1))
    return out


def output_order(
    timestamp: np.ndarray,
    source_ms: np.ndarray,
    input_length: np.ndarray,
    output_length: np.ndarray,
    fingerprint: np.ndarray,
) -> np.ndarray:
    """The output rows' order, of their content alone (both engines: shards.rank_bucket): output
    time, then source time (a session's turns stay causal where the speed-up floors them
    together), output lengths, then the source row's fingerprint (content_fingerprints). Rows
    tied in all of it come from rows alike in everything and are reshaped alike, so their order
    changes no byte; never where a row sat in its file."""
    return np.lexsort(
        (fingerprint["lo"], fingerprint["hi"], output_length, input_length, source_ms, timestamp)
    )


def scaled_timestamps(timestamp: np.ndarray, config: SynthConfig) -> np.ndarray:
    scaled = np.floor(timestamp / config.speedup_ratio)
    return _readable(scaled, TIMESTAMP_FIELD, "raise --speedup-ratio").astype(np.int64)


def scaled_osl(output_length: np.ndarray, config: SynthConfig) -> np.ndarray:
    scaled = np.floor(output_length * config.osl_multiplier + 0.5)
    low = config.min_osl if config.min_osl is not None else 0
    high = config.max_osl if config.max_osl is not None else HIGHEST[OUTPUT_LENGTH_FIELD]
    return _readable(
        np.clip(scaled, low, high), OUTPUT_LENGTH_FIELD, "lower --osl-multiplier or set --max-osl"
    ).astype(np.int64)


def _readable(values: np.ndarray, name: str, remedy: str) -> np.ndarray:
    """Synthesized values every trace reader accepts (trace_io.HIGHEST), or a one-line refusal
    before anything is written: what synthesize writes, its own readers read."""
    if len(values) and not values.max() <= HIGHEST[name]:
        raise JobStopped(
            f"the synthesized {name} would reach {values.max():.0f}, past the "
            f"{HIGHEST[name]} a trace reader accepts; {remedy}"
        )
    return values


def dense_by_first_appearance(ids: np.ndarray) -> np.ndarray:
    """Renumber dense ids (0..m-1, as prefix_ids gives them) 0, 1, 2, ... in order of first
    appearance."""
    if not len(ids):
        return ids.astype(np.int64)
    first = np.full(int(ids.max()) + 1, len(ids), dtype=np.int64)
    first[ids[::-1]] = np.arange(len(ids) - 1, -1, -1)  # the last write, the first occurrence
    renumbered = np.empty(len(first), dtype=np.int64)
    renumbered[np.argsort(first, kind="stable")] = np.arange(len(first))
    return renumbered[ids]
