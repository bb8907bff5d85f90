"""`kvtrace audit`: what an output folder exposes, measured before it is published.

Flags (any makes the folder unfit to publish):
- a field beyond the trace's own (timestamp, input_length, output_length, hash_ids, session);
- any string value in a trace row or a string column in a Parquet file;
- hash ids that are not dense (0..n-1): raw hashes or token ids in their place;
- integers too large to be lengths, timestamps or dense ids (over 2^40: hashes, not counts);
- files beside the trace holding unkeyed engine hashes (`--emit-block-hashes`): private.
Measured, not flagged: timestamp granularity, the share of rows an outsider could single out
(by their whole id sequence; by their lengths), sessions.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pyarrow.parquet as pq

from transforms import storage
from transforms.read.paths import read_bytes

# output_hash_ids: with anonymize --emit-output-hashes, ids in the same dense space.
TRACE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids", "session",
                "output_hash_ids")
MAX_PLAUSIBLE_INT = 1 << 40  # ~35 years in ms; no length or dense id comes near
PRIVATE_PREFIXES = ("block-hashes", "output-hashes")
MAX_EXAMPLES = 5


def audit(files: list[str], folder_files: list[str], manifest: dict | None) -> dict:
    """files: the trace files as analyze reads them (a Parquet twin of a JSONL file left out);
    folder_files: every file beside them. Fields, strings and integers are checked in every
    trace file, twins too; row statistics come from files."""
    fields: Counter = Counter()
    strings: Counter = Counter()
    fractions: Counter = Counter()
    largest: dict[str, int] = {}
    rows: list[tuple] = []
    sessions: Counter = Counter()
    twins = [f for f in folder_files if f not in files and _is_trace_data(f)]
    for path in list(files) + twins:
        for row in _rows(path):
            for name, value in row.items():
                fields[name] += 1
                for found in _strings(value):
                    strings[f"{name}{found}"] += 1
                for number in _ints(value):
                    largest[name] = max(largest.get(name, number), number)
                if any(_fractions(value)):
                    fractions[name] += 1
            if path in twins:
                continue
            ids, outputs = row.get("hash_ids"), row.get("output_hash_ids")
            rows.append((_frozen(row.get("timestamp")), _frozen(row.get("input_length")),
                         _frozen(row.get("output_length")),
                         _frozen(ids) if isinstance(ids, list) else None,
                         _frozen(outputs) if isinstance(outputs, list) else ()))
            if row.get("session") is not None:
                sessions[str(row["session"])] += 1
    flags = []
    extra = sorted(set(fields) - set(TRACE_FIELDS))
    if extra:
        flags.append(f"fields beyond the trace's own: {', '.join(extra)}")
    if strings:
        flags.append("string values: " + ", ".join(f"{k} ({v:,})" for k, v in strings.most_common(MAX_EXAMPLES)))
    if fractions:
        flags.append("numbers that are not whole (a trace holds counts and ids): " +
                     ", ".join(f"{k} ({v:,})" for k, v in fractions.most_common(MAX_EXAMPLES)))
    if not rows:
        flags.append("no trace rows: nothing to publish, or not a kvtrace output")
    too_large = {k: v for k, v in largest.items() if v > MAX_PLAUSIBLE_INT}
    if too_large:
        flags.append("integers too large for counts or dense ids (hashes?): " +
                     ", ".join(f"{k} up to {v:,}" for k, v in too_large.items()))
    ids = _id_report(rows)
    if ids["distinct"] and not ids["dense"]:
        flags.append(f"hash_ids are not dense: {ids['distinct']:,} distinct values up to "
                     f"{ids['max']:,} (token ids or raw hashes?)")
    private = [f for f in folder_files if f.rsplit("/", 1)[-1].startswith(PRIVATE_PREFIXES)]
    if private:
        flags.append("unkeyed engine hashes beside the trace (anyone with the tokenizer can "
                     "confirm a guessed prompt): keep private: " +
                     ", ".join(f.rsplit("/", 1)[-1] for f in private))
    return {
        "rows": len(rows),
        "files": [f.rsplit("/", 1)[-1] for f in folder_files],
        "fields": dict(fields),
        "largest_integers": largest,
        "hash_ids": ids,
        "timestamps": _timestamp_report([r[0] for r in rows]),
        "singled_out": _uniqueness(rows),
        "sessions": {"sessions": len(sessions), "rows_with_session": sum(sessions.values()),
                     "max_rows_per_session": max(sessions.values(), default=0)},
        "manifest": {k: manifest.get(k) for k in ("hash_scheme", "hash_scheme_keyed", "granularity")}
        if manifest else None,
        "flags": flags,
        "publishable": not flags,
    }


def _is_trace_data(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.startswith("trace-") and name.endswith((".jsonl", ".parquet"))


def _rows(path: str) -> Iterator[dict]:
    if path.endswith(".parquet"):
        with storage.open_read(path) as handle:
            table = pq.read_table(handle)
        yield from table.to_pylist()
        return
    for line in read_bytes(path).splitlines():  # decompressed by suffix
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = {"unparsed_line": line.decode("utf-8", "replace")}
        yield row if isinstance(row, dict) else {"non_object_line": row}


def _strings(value: object, where: str = "") -> Iterator[str]:
    if isinstance(value, str):
        yield where
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item, "[]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, f".{key}")


def _ints(value: object) -> Iterator[int]:
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        yield abs(value)
    elif isinstance(value, float) and value.is_integer():
        yield int(abs(value))
    elif isinstance(value, list):
        for item in value:
            yield from _ints(item)


def _frozen(value: object) -> object:
    """A hashable copy of a JSON value (hostile rows nest lists and objects anywhere)."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value


def _fractions(value: object) -> Iterator[bool]:
    if isinstance(value, float) and not value.is_integer():
        yield True
    elif isinstance(value, list):
        for item in value:
            yield from _fractions(item)


def _id_report(rows: list[tuple]) -> dict:
    values = [i for r in rows for i in (r[3] or ()) + r[4]
              if isinstance(i, int) and not isinstance(i, bool)]
    if not values:
        return {"distinct": 0, "max": None, "dense": True}
    distinct, top = len(set(values)), max(values)
    return {"distinct": distinct, "max": top, "dense": min(values) == 0 and top == distinct - 1}


def _timestamp_report(timestamps: list) -> dict:
    values = np.array([t for t in timestamps if isinstance(t, int) and not isinstance(t, bool)
                       and -(1 << 63) <= t < 1 << 63], dtype=np.int64)
    if not len(values):
        return {"granularity_ms": None}
    gaps = np.diff(np.sort(values))
    positive = gaps[gaps > 0]
    return {"granularity_ms": int(np.gcd.reduce(values)) if values.any() else None,
            "smallest_gap_ms": int(positive.min()) if len(positive) else None,
            "distinct": int(len(np.unique(values)))}


def _uniqueness(rows: list[tuple]) -> dict:
    """Shares of rows unique by what an outsider could match: the whole id sequence (its
    prefix structure), and the (input_length, output_length) pair."""
    if not rows:
        return {}
    by_ids = Counter(r[3] for r in rows)
    by_lengths = Counter((r[1], r[2]) for r in rows)
    total = len(rows)
    return {"unique_id_sequence": sum(1 for r in rows if by_ids[r[3]] == 1) / total,
            "unique_lengths": sum(1 for r in rows if by_lengths[(r[1], r[2])] == 1) / total}


def report_text(report: dict, where: str) -> str:
    ts, single = report["timestamps"], report["singled_out"]
    lines = [
        f"{where}: {report['rows']:,} rows in {', '.join(report['files'])}",
        f"  fields: {', '.join(f'{k} ({v:,})' for k, v in report['fields'].items())}",
        f"  largest integers: {', '.join(f'{k} {v:,}' for k, v in report['largest_integers'].items())}",
        f"  hash ids: {report['hash_ids']['distinct']:,} distinct, "
        f"{'dense' if report['hash_ids']['dense'] else 'NOT dense'}",
        f"  timestamps: granularity {ts.get('granularity_ms')} ms, smallest gap "
        f"{ts.get('smallest_gap_ms')} ms",
    ]
    if single:
        lines.append(f"  rows an outsider could single out: {single['unique_id_sequence']:.1%} by "
                     f"their whole id sequence, {single['unique_lengths']:.1%} by their lengths")
    sessions = report["sessions"]
    lines.append(f"  sessions: {sessions['sessions']:,} ({sessions['rows_with_session']:,} rows, "
                 f"at most {sessions['max_rows_per_session']:,} per session)")
    if report["manifest"]:
        m = report["manifest"]
        lines.append(f"  manifest: hash scheme {m['hash_scheme']}"
                     f"{'' if m.get('hash_scheme_keyed', True) else ' (unkeyed)'}, granularity "
                     f"{m.get('granularity')}")
    lines += [f"  FLAG {flag}" for flag in report["flags"]]
    lines.append("publishable" if report["publishable"] else "NOT publishable")
    return "\n".join(lines)
