"""`kvtrace synthesize --engine beam`, the pure part: synthesis cut into shards one worker holds.

Reshaping a request needs three things that look across rows:
- which of its leading prefixes two or more conversations visit (parts.py's "shared"): blocks
  go to prefix shards, where units are counted per prefix (`shared_counts`);
- its conversation's earlier turns: conversations go whole to conversation shards, where the
  local code reshapes them (`reshape_conversations`), prefixes named by 64-bit keys instead of
  dense ids (reshape.hashed_label), so every shard labels a shared prefix alike;
- the output's order, for dense ids numbered by first appearance: output rows go to time
  buckets, whose sizes give each row its global rank (`rank_bucket`, in synthesize's
  output_order: by content, each row carrying its source row's fingerprint); ids are then numbered by
  ids/steps.AssignDenseIds over the exact prefixes of the label sequences.
With distinct labels the ids equal the local engine's: the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xxhash

from kvtrace.transforms.ids.buckets import buckets_of
from kvtrace.transforms.ids.dense_ids import OCCURRENCE
from kvtrace.transforms.read.trace_io import Trace
from kvtrace.transforms.stats.trace_shards import prefix_hashes, rowkeys
from kvtrace.transforms.synth.parts import RowParts, session_text
from kvtrace.transforms.synth.reshape import hashed_label, mix64, reshape
from kvtrace.transforms.synth.synthesize import (
    FINGERPRINT,
    SynthConfig,
    content_fingerprints,
    output_order,
    scaled_osl,
    scaled_timestamps,
    tree_copies,
)

VISIT = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("unit", "<u8"), ("rowkey", "<i8")])
SHARED = np.dtype([("rowkey", "<i8"), ("unit", "<u8"), ("shared", "<i8")])
OUT = np.dtype(
    [
        ("ts_out", "<i8"),
        ("ts", "<f8"),
        ("rowkey", "<i8"),
        ("isl", "<i8"),
        ("osl", "<i8"),
        ("fp", FINGERPRINT),  # the source row's content_fingerprints: output_order's last key
        ("rank", "<i8"),
    ]
)
_ROW_UNIT = np.uint64(1 << 63)  # marks units that are a request of their own, not a session


@dataclass
class Conversations:
    """Rows of some whole conversations, file order, with each block's 64-bit prefix key."""

    trace: Trace
    prefix_key: np.ndarray  # int64 per block


@dataclass
class Synthesized:
    """Output rows (OUT; rank set once ordered), their label sequences and source sessions."""

    rows: np.ndarray
    offsets: np.ndarray
    labels: np.ndarray  # int64
    session: np.ndarray | None  # object array, or None when the trace has no sessions

    def __len__(self) -> int:
        return len(self.rows)


def unit_keys(trace: Trace) -> np.ndarray:
    """Per row, its conversation: a hash of its session, or its own row key."""
    units = mix64(rowkeys(trace).astype(np.uint64)) | _ROW_UNIT
    if trace.session is not None:
        for row in np.flatnonzero(trace.session != None).tolist():  # noqa: E711 (elementwise)
            units[row] = xxhash.xxh3_64_intdigest(session_text(trace.session[row]).encode()) & ~int(
                _ROW_UNIT
            )
    return units


def visits(trace: Trace, hi: np.ndarray, lo: np.ndarray, units: np.ndarray) -> np.ndarray:
    """Per block: its prefix (128-bit hash), the conversation visiting it and its row."""
    row = np.repeat(np.arange(len(trace)), trace.lengths)
    table = np.empty(len(row), dtype=VISIT)
    table["hi"], table["lo"] = hi, lo
    table["unit"], table["rowkey"] = units[row], rowkeys(trace)[row]
    return table


def shared_counts(table: np.ndarray) -> np.ndarray:
    """A prefix shard's visits in; per row (with its conversation), how many of its blocks in
    this shard two or more conversations visit (rows without any are left out)."""
    order = np.lexsort((table["unit"], table["lo"], table["hi"]))
    ordered = table[order]
    new_prefix = np.ones(len(ordered), dtype=bool)
    new_prefix[1:] = (ordered["hi"][1:] != ordered["hi"][:-1]) | (
        ordered["lo"][1:] != ordered["lo"][:-1]
    )
    prefix = np.cumsum(new_prefix) - 1
    new_unit = new_prefix.copy()
    new_unit[1:] |= ordered["unit"][1:] != ordered["unit"][:-1]
    units_per_prefix = np.bincount(
        prefix[new_unit], minlength=int(prefix[-1]) + 1 if len(prefix) else 0
    )
    shared = ordered[units_per_prefix[prefix] >= 2]
    rowkey, first, counts = np.unique(shared["rowkey"], return_index=True, return_counts=True)
    out = np.empty(len(rowkey), dtype=SHARED)
    out["rowkey"], out["unit"], out["shared"] = rowkey, shared["unit"][first], counts
    return out


def take_rows(trace: Trace, rows: np.ndarray) -> Trace:
    """The given rows of a trace (in the order given), as a trace."""
    lengths = trace.lengths[rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    blocks = block_index(trace.offsets[rows], lengths)
    return Trace(
        trace.timestamp[rows],
        trace.input_length[rows],
        trace.output_length[rows],
        offsets,
        trace.ids[blocks],
        trace.session[rows] if trace.session is not None else None,
        trace.line[rows],
        trace.file_index[rows],
        trace.files,
    )


def block_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The flat block indices of rows starting at starts, lengths long, concatenated."""
    total = int(lengths.sum())
    return np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(total)


def split_file(trace: Trace, shards: int) -> tuple[list[tuple[int, Conversations]], np.ndarray]:
    """A file's rows split into conversation shards, each block with its prefix key; and its
    visits (VISIT, every block)."""
    hi, lo = prefix_hashes(trace.ids, trace.offsets)
    key = (lo ^ mix64(hi)).view(np.int64)
    units = unit_keys(trace)
    shard = (units % np.uint64(shards)).astype(np.int64)
    out = []
    for s in np.unique(shard).tolist():
        rows = np.flatnonzero(shard == s)
        out.append(
            (
                s,
                Conversations(
                    take_rows(trace, rows),
                    key[block_index(trace.offsets[rows], trace.lengths[rows])],
                ),
            )
        )
    return out, visits(trace, hi, lo, units)


def merge_conversations(parts: list[Conversations]) -> Conversations:
    """Pieces of one conversation shard (from several files) as one, in file order."""
    traces = [p.trace for p in parts]
    has_sessions = any(t.session is not None for t in traces)
    whole = Trace(
        np.concatenate([t.timestamp for t in traces]),
        np.concatenate([t.input_length for t in traces]),
        np.concatenate([t.output_length for t in traces]),
        np.concatenate([[0], np.cumsum(np.concatenate([t.lengths for t in traces]))]).astype(
            np.int64
        ),
        np.concatenate([t.ids.astype(np.int64) for t in traces]),
        np.concatenate(
            [t.session if t.session is not None else np.full(len(t), None, object) for t in traces]
        )
        if has_sessions
        else None,
        np.concatenate([t.line for t in traces]),
        np.concatenate([t.file_index for t in traces]),
        traces[0].files,
    )
    keys = np.concatenate([p.prefix_key for p in parts])
    order = np.argsort(rowkeys(whole), kind="stable")
    return Conversations(
        take_rows(whole, order), keys[block_index(whole.offsets[order], whole.lengths[order])]
    )


def reshape_conversations(
    conversations: Conversations, shared: np.ndarray, block_size: int, config: SynthConfig
) -> Synthesized:
    """A conversation shard reshaped as the local engine does (synthesize.synthesize), given
    its rows' shared counts (SHARED rows from every prefix shard: a row's are summed)."""
    trace = conversations.trace
    keys = rowkeys(trace)
    counts = np.zeros(len(trace), dtype=np.int64)
    if len(shared):
        np.add.at(counts, np.searchsorted(keys, shared["rowkey"]), shared["shared"])
    parts = RowParts.of(trace, block_size, shared=counts, prefix=conversations.prefix_key)
    copies = tree_copies(trace, config.knobs.prefix_root_multiplier, config.seed)
    reshaped = reshape(trace, parts, config.knobs, copies, block_size, hashed_label)
    keep = np.ones(len(trace), dtype=bool)
    if config.min_isl is not None:
        keep &= reshaped.input_length >= config.min_isl
    if config.max_isl is not None:
        keep &= reshaped.input_length <= config.max_isl
    kept = np.flatnonzero(keep)
    rows = np.zeros(len(kept), dtype=OUT)
    rows["ts_out"] = scaled_timestamps(trace.timestamp[kept], config)
    rows["ts"], rows["rowkey"] = trace.timestamp[kept], keys[kept]
    rows["isl"] = reshaped.input_length[kept]
    rows["osl"] = scaled_osl(trace.output_length[kept], config)
    rows["fp"] = content_fingerprints(trace)[kept]
    labels = [reshaped.labels[r] for r in kept.tolist()]
    offsets = np.zeros(len(kept) + 1, dtype=np.int64)
    np.cumsum([len(label) for label in labels], out=offsets[1:])
    return Synthesized(
        rows,
        offsets,
        np.concatenate(labels + [np.empty(0, np.int64)]),
        trace.session[kept] if trace.session is not None else None,
    )


def take_synthesized(part: Synthesized, rows: np.ndarray) -> Synthesized:
    lengths = np.diff(part.offsets)[rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return Synthesized(
        part.rows[rows],
        offsets,
        part.labels[block_index(part.offsets[rows], lengths)],
        part.session[rows] if part.session is not None else None,
    )


def split_by_bucket(part: Synthesized) -> list[tuple[int, Synthesized]]:
    """Output rows to the time buckets of their output timestamps."""
    buckets = buckets_of(part.rows["ts_out"])
    return [
        (b, take_synthesized(part, np.flatnonzero(buckets == b)))
        for b in np.unique(buckets).tolist()
    ]


def rank_bucket(parts: list[Synthesized], first_rank: int) -> Synthesized:
    """A bucket's rows in output order (synthesize.output_order, as the local engine writes
    them: whichever order the parts arrive in), ranked from first_rank."""
    has_sessions = any(p.session is not None for p in parts)
    for p in parts:
        if has_sessions and p.session is None:
            p.session = np.full(len(p), None, object)
    lengths = np.concatenate([np.diff(p.offsets) for p in parts])
    whole = Synthesized(
        np.concatenate([p.rows for p in parts]),
        np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        np.concatenate([p.labels for p in parts]),
        np.concatenate([p.session for p in parts]) if has_sessions else None,
    )
    rows = whole.rows
    ordered = take_synthesized(
        whole, output_order(rows["ts_out"], rows["ts"], rows["isl"], rows["osl"], rows["fp"])
    )
    ordered.rows["rank"] = first_rank + np.arange(len(ordered))
    return ordered


def label_occurrences(part: Synthesized) -> np.ndarray:
    """Every output block as an OCCURRENCE of its exact label prefix, first-seen order being
    (output timestamp, rank, position): the output's own order."""
    hi, lo = prefix_hashes(part.labels, part.offsets)
    counts = np.diff(part.offsets)
    table = np.empty(len(part.labels), dtype=OCCURRENCE)
    table["hi"], table["lo"] = hi, lo
    table["ts"] = np.repeat(part.rows["ts_out"], counts)
    table["key"], table["fp"] = 0, np.repeat(part.rows["rank"], counts).astype(np.uint64)
    table["pos"] = np.arange(len(part.labels)) - np.repeat(part.offsets[:-1], counts)
    table["req"] = np.repeat(np.arange(len(part)), counts)
    table["weight"] = 1
    return table


def session_occurrences(part: Synthesized) -> np.ndarray:
    """Every row with a session as an OCCURRENCE of its session key."""
    if part.session is None:
        return np.empty(0, dtype=OCCURRENCE)
    index = np.flatnonzero(part.session != None)  # noqa: E711 (elementwise)
    table = np.empty(len(index), dtype=OCCURRENCE)
    for i, row in enumerate(index.tolist()):
        digest = xxhash.xxh3_128_intdigest(session_text(part.session[row]).encode())
        table["hi"][i], table["lo"][i] = digest >> 64, digest & ((1 << 64) - 1)
    table["ts"], table["fp"] = part.rows["ts_out"][index], part.rows["rank"][index]
    table["key"] = 0  # the rank alone orders a synthesized output's rows
    table["pos"], table["weight"], table["req"] = 0, 1, index
    return table
