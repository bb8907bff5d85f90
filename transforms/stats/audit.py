"""`kvtrace audit`: the publication gate for an output folder. It fails closed: only what kvtrace
itself publishes passes, each file checked against the schema kvtrace writes it with, and
everything else is flagged.

Allowed: `manifest.json` (kvtrace's own vocabulary only: no path, no free text), `stats.json`
(its numbers and definitions), `trace-SSSSS-of-NNNNN.jsonl` and `.parquet` (exactly the trace
fields, integers only; a Parquet twin holding the same rows as its JSONL file). The manifest
must list exactly the files present, with their sha256. Flagged: any other file (hidden,
compressed, text, dead letters, engine hashes), subfolders, any string or fractional value in
a trace, a field beyond the trace's own, integers too large to be counts or dense ids, ids that
are not dense. Measured, not flagged: timestamp granularity, the share of rows an outsider could
single out (by their whole id sequence; by their lengths), sessions.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from transforms import storage
from transforms.read.paths import (
    NumberedLines,
    Oversized,
    open_raw,
    read_bytes,
    read_parquet_within,
)
from transforms.read.trace_io import MAX_TRACE_LINE_BYTES
from transforms.storage import is_url
from transforms.write.replayers import replay_commands
from transforms.write.manifest import BLOCK_HASHES_WARNING, MANIFEST, STATS
from transforms.write.publish import sha256_of
from transforms.read.trace_fields import OUTPUT_IDS_FIELD, RESPONSE_FIELD
from transforms.write.shards import TRACE_SCHEMA
from transforms.write.totals import BLOCK_WEIGHTED_DEFINITION, TOKEN_WEIGHTED_DEFINITION

TRACE_FILE = re.compile(r"trace-\d{5}-of-\d{5}\.(jsonl|parquet)")
REQUIRED_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
TRACE_FIELDS = (*REQUIRED_FIELDS, "session", OUTPUT_IDS_FIELD, RESPONSE_FIELD)
NULLABLE_FIELDS = ("session", RESPONSE_FIELD)  # Parquet nulls where a row has none
MAX_PLAUSIBLE_INT = 1 << 40  # ~35 years in ms; no length or dense id comes near
MAX_EXAMPLES = 5
STATS_NUMBERS = ("blocks", "input_tokens", "output_tokens", "requests", "unique_block_tokens",
                 "unique_blocks")
STATS_DEFINITIONS = {"token_weighted": TOKEN_WEIGHTED_DEFINITION,
                     "block_weighted": BLOCK_WEIGHTED_DEFINITION}
# What a manifest may say, key by key: kvtrace's own vocabulary, nothing an operator typed.
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+|pkg:[A-Za-z_][\w.]*")
_WORD = re.compile(r"[\w.+-]{1,64}")


def audit(target: str) -> dict:
    """The report on a folder (or one trace file): flags, and what the rows expose."""
    folder = target.rstrip("/")
    gate = _Gate()
    if is_url(folder) or os.path.isdir(folder):
        names = _entries(folder, gate)
    else:
        folder, names = os.path.dirname(folder) or ".", [os.path.basename(folder)]
    traces = [n for n in names if TRACE_FILE.fullmatch(n)]
    jsonl = {n for n in traces if n.endswith(".jsonl")}
    rows: list[tuple] = []
    sessions: Counter = Counter()
    twins: dict[str, list[dict]] = {}  # a JSONL file's rows, for its Parquet twin
    for name in sorted(traces):  # a JSONL file before its twin
        file_rows = list(_trace_rows(storage.join(folder, name), name, gate))
        twin = name.removesuffix(".parquet") + ".jsonl"
        if name.endswith(".jsonl"):
            twins[name] = file_rows
        elif twin in jsonl:  # rows are counted once: from the JSONL file
            if file_rows != twins[twin]:
                gate.flag(f"{name} does not hold the rows of its JSONL twin")
            continue
        rows += [_row_key(row) for row in file_rows]
        gate.fields.update(key for row in file_rows for key in row)
        sessions.update(str(r["session"]) for r in file_rows if r.get("session") is not None)
    if STATS in names:
        _check_stats(storage.join(folder, STATS), gate)
    manifest = _check_manifest(folder, names, gate) if MANIFEST in names else None
    if len(names) > 1 and manifest is None:
        gate.flag("no manifest.json: not a complete kvtrace output")
    if not rows:
        gate.flag("no trace rows: nothing to publish, or not a kvtrace output")
    ids = _id_report(rows)
    if ids["distinct"] and not ids["dense"]:
        gate.flag(f"hash_ids are not dense: {ids['distinct']:,} distinct values up to "
                  f"{ids['max']:,} (token ids or raw hashes?)")
    return {
        "rows": len(rows),
        "files": names,
        "fields": dict(gate.fields),
        "largest_integers": gate.largest,
        "hash_ids": ids,
        "timestamps": _timestamp_report([r[0] for r in rows]),
        "singled_out": _uniqueness(rows),
        "sessions": {"sessions": len(sessions), "rows_with_session": sum(sessions.values()),
                     "max_rows_per_session": max(sessions.values(), default=0)},
        "manifest": {k: manifest.get(k) for k in ("hash_scheme", "hash_scheme_keyed", "granularity")}
        if isinstance(manifest, dict) else None,
        "flags": gate.flags,
        "publishable": not gate.flags,
    }


class _Gate:
    """What the audit found: flags (each once) and what the trace rows hold."""

    def __init__(self) -> None:
        self.flags: list[str] = []
        self.fields: Counter = Counter()
        self.largest: dict[str, int] = {}

    def flag(self, message: str) -> None:
        if message not in self.flags:
            self.flags.append(message)


def _entries(folder: str, gate: _Gate) -> list[str]:
    """Every name in the folder; what kvtrace never publishes is flagged here."""
    if is_url(folder):
        names = sorted(p.rsplit("/", 1)[-1] for p in storage.match(storage.join(folder, "*")))
    else:
        names = sorted(os.listdir(folder))
        for name in names:
            if os.path.isdir(os.path.join(folder, name)):
                gate.flag(f"a subfolder: {name}")
    for name in names:
        if name not in (MANIFEST, STATS) and not TRACE_FILE.fullmatch(name):
            gate.flag(f"a file kvtrace does not publish: {name}"
                      + (" (hidden)" if name.startswith(".") else ""))
    return [n for n in names if n in (MANIFEST, STATS) or TRACE_FILE.fullmatch(n)]


def _trace_rows(path: str, name: str, gate: _Gate) -> Iterator[dict]:
    """The rows of a trace file, each checked; a row that is not a trace row is flagged."""
    if name.endswith(".parquet"):
        yield from _parquet_rows(path, name, gate)
        return
    lines = NumberedLines(path, MAX_TRACE_LINE_BYTES)
    for number, line in lines:
        if isinstance(line, Oversized):
            gate.flag(f"{name}: lines over {MAX_TRACE_LINE_BYTES} bytes (line {number})")
            continue
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            gate.flag(f"{name}: lines that are not JSON (line {number})")
            continue
        if not isinstance(row, dict):
            gate.flag(f"{name}: lines that are not JSON objects (line {number})")
            continue
        if _check_row(row, name, gate):
            yield {k: v for k, v in row.items() if v is not None}
    if lines.broken:
        gate.flag(f"{name}: {lines.broken}")


def _parquet_rows(path: str, name: str, gate: _Gate) -> Iterator[dict]:
    try:
        table = read_parquet_within(path, MAX_TRACE_LINE_BYTES)
    except (OSError, ValueError, pa.ArrowException) as err:
        gate.flag(f"{name}: not a readable Parquet file ({str(err)[:80]})")
        return
    allowed = {f.name: f.type for f in TRACE_SCHEMA} | {
        OUTPUT_IDS_FIELD: TRACE_SCHEMA.field("hash_ids").type, RESPONSE_FIELD: pa.int64()}
    for field in table.schema:
        if field.name not in allowed:
            gate.flag(f"fields beyond the trace's own: {field.name} ({name})")
        elif field.type != allowed[field.name]:
            gate.flag(f"{name}: column {field.name} is {field.type}, not {allowed[field.name]}")
    known = [f.name for f in table.schema if f.name in allowed]
    for row in table.select(known).to_pylist():
        if _check_row(row, name, gate):
            yield {k: v for k, v in row.items() if v is not None}


def _check_row(row: dict, name: str, gate: _Gate) -> bool:
    """Flags what a trace row must not hold; True when the row is a trace row."""
    whole = True
    for key, value in row.items():
        if value is None and key in NULLABLE_FIELDS:
            continue
        if key not in TRACE_FIELDS:
            gate.flag(f"fields beyond the trace's own: {key}")
            whole = False
        for kind in _value_kinds(value):
            if kind == "string":
                gate.flag(f"string values: {key} ({name})")
            elif kind == "fraction":
                gate.flag(f"numbers that are not whole (a trace holds counts and ids): {key}")
            elif kind == "other":
                gate.flag(f"values that are neither integers nor lists of them: {key} ({name})")
            whole = whole and kind == "int"
        for number in _ints(value):
            gate.largest[key] = max(gate.largest.get(key, number), number)
            if number > MAX_PLAUSIBLE_INT:
                gate.flag(f"integers too large for counts or dense ids (hashes?): {key}")
    missing = [k for k in REQUIRED_FIELDS if k not in row]
    if missing:
        gate.flag(f"rows without {', '.join(missing)} ({name})")
    return whole and not missing


def _value_kinds(value: Any) -> Iterator[str]:
    """'int', 'string', 'fraction' or 'other' for a value and, in a list, for each item."""
    items = value if isinstance(value, list) else [value]
    for item in items:
        if isinstance(item, bool) or isinstance(item, (dict, list)) or item is None:
            yield "other"
        elif isinstance(item, int):
            yield "int"
        elif isinstance(item, float):
            yield "int" if item.is_integer() else "fraction"
        elif isinstance(item, str):
            yield "string"
        else:
            yield "other"


def _ints(value: Any) -> Iterator[int]:
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, int) and not isinstance(item, bool):
            yield abs(item)
        elif isinstance(item, float) and item.is_integer():
            yield int(abs(item))


def _row_key(row: dict) -> tuple:
    ids, outputs = row.get("hash_ids"), row.get(OUTPUT_IDS_FIELD)
    return (row.get("timestamp"), row.get("input_length"), row.get("output_length"),
            tuple(ids) if isinstance(ids, list) else None,
            tuple(outputs) if isinstance(outputs, list) else (), row.get(RESPONSE_FIELD))


def _read_json(path: str, gate: _Gate) -> Any:
    try:
        return json.loads(read_bytes(path, MAX_TRACE_LINE_BYTES))
    except (OSError, ValueError, RecursionError) as err:
        gate.flag(f"{path.rsplit('/', 1)[-1]} is not readable JSON ({str(err)[:80]})")
        return None


def _check_stats(path: str, gate: _Gate) -> None:
    stats = _read_json(path, gate)
    if stats is None:
        return
    ok = isinstance(stats, dict) and set(stats) == {*STATS_NUMBERS, "definitions", "hit_rates"}
    ok = ok and all(_is_count(stats[k]) for k in STATS_NUMBERS)
    ok = ok and stats["definitions"] == STATS_DEFINITIONS and isinstance(stats["hit_rates"], dict)
    ok = ok and set(stats["hit_rates"]) == set(STATS_DEFINITIONS) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in stats["hit_rates"].values())
    if not ok:
        gate.flag("stats.json holds more, or other, than kvtrace's statistics")


def _check_manifest(folder: str, names: list[str], gate: _Gate) -> dict | None:
    manifest = _read_json(storage.join(folder, MANIFEST), gate)
    if manifest is None:
        return None
    problems = manifest_problems(manifest)
    for problem in problems:
        gate.flag(f"manifest.json: {problem}")
    if problems:
        return manifest if isinstance(manifest, dict) else None
    present = sorted(n for n in names if n != MANIFEST)
    if sorted(manifest["files"]) != present:
        gate.flag(f"manifest.json lists {sorted(manifest['files'])}, the folder holds {present}")
    for name in present:
        expected = manifest["sha256"].get(name)
        if expected is not None and sha256_of(_raw(storage.join(folder, name))) != expected:
            gate.flag(f"{name} is not the file manifest.json lists (sha256 differs)")
    return manifest


def _raw(path: str) -> bytes:
    with open_raw(path) as handle:
        return handle.read()


def manifest_problems(manifest: Any) -> list[str]:
    """What in a manifest is not kvtrace's own vocabulary (free text, paths, unknown keys)."""
    if not isinstance(manifest, dict):
        return ["not a JSON object"]
    checks = {
        "kvtrace_version": lambda v: isinstance(v, str) and bool(_WORD.fullmatch(v)),
        "format": lambda v: v == "mooncake-trace",
        "tokenizer": _tokenizer_ok,
        "block_size": _is_count,
        "hash_scheme": lambda v: isinstance(v, str) and bool(_WORD.fullmatch(v)),
        "hash_scheme_keyed": lambda v: isinstance(v, bool),
        "granularity": lambda v: isinstance(v, dict) and set(v) == {"timestamp_ms", "output_length"}
        and all(_is_count(x) for x in v.values()),
        "output_hash_ids": lambda v: isinstance(v, bool),
        "block_hashes": _block_hashes_ok,
        "input_format": lambda v: v in ("auto", "chat", "prompt", "tokens"),
        "timestamp_unit": lambda v: v in ("auto", "s", "ms", "us", "ns"),
        "chat_template_kwargs": _kwargs_ok,
        "records": lambda v: isinstance(v, dict) and all(
            isinstance(k, str) and _WORD.fullmatch(k) and _is_count(x) for k, x in v.items()),
        "files": lambda v: isinstance(v, list) and all(
            isinstance(f, str) and (f == STATS or TRACE_FILE.fullmatch(f)) for f in v),
        "sha256": lambda v: isinstance(v, dict) and all(
            isinstance(h, str) and _HEX64.fullmatch(h) for h in v.values()),
        # exactly the commands kvtrace writes for these files: nothing typed in between
        "replay": lambda v: _replay_ok(v, manifest),
    }
    problems = [f"unknown key {key!r}" for key in manifest if key not in checks]
    problems += [f"{key} is not what kvtrace writes there" for key, ok in checks.items()
                 if key not in manifest or not ok(manifest[key])]
    return problems


def _replay_ok(value: Any, manifest: dict) -> bool:
    try:
        expected = replay_commands(manifest["block_size"], manifest["records"]["exported"],
                                   list(manifest["files"]))
    except (KeyError, TypeError, AttributeError):
        return False
    return value == expected


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_PLAUSIBLE_INT


def _tokenizer_ok(value: Any) -> bool:
    """A public hub id or pkg: name (or none), and file hashes: never a local path."""
    return (isinstance(value, dict) and set(value) == {"name", "sha256"}
            and (value["name"] is None or (isinstance(value["name"], str)
                                           and bool(_HUB_ID.fullmatch(value["name"]))))
            and isinstance(value["sha256"], dict)
            and all(isinstance(k, str) and _WORD.fullmatch(k) and isinstance(h, str)
                    and _HEX64.fullmatch(h) for k, h in value["sha256"].items()))


def _block_hashes_ok(value: Any) -> bool:
    return value is None or value == {"emitted": True, "private": BLOCK_HASHES_WARNING}


def _kwargs_ok(value: Any) -> bool:
    """Template variables: identifier keys; values without free text (strings are hashed)."""
    if not isinstance(value, dict):
        return False
    return all(isinstance(k, str) and re.fullmatch(r"[A-Za-z_]\w{0,63}", k) and _no_text(v)
               for k, v in value.items())


def _no_text(value: Any) -> bool:
    if isinstance(value, str):
        return bool(re.fullmatch(r"sha256:[0-9a-f]{64}", value))
    if isinstance(value, list):
        return all(_no_text(v) for v in value)
    if isinstance(value, dict):
        return all(_no_text(k) and _no_text(v) for k, v in value.items())
    return value is None or isinstance(value, (bool, int, float))


def _id_report(rows: list[tuple]) -> dict:
    values = [i for r in rows for i in (r[3] or ()) + r[4]
              if isinstance(i, int) and not isinstance(i, bool)]
    if not values:
        return {"distinct": 0, "max": None, "dense": True}
    distinct, top = len(set(values)), max(values)
    return {"distinct": distinct, "max": top, "dense": min(values) == 0 and top == distinct - 1}


def _timestamp_report(timestamps: list) -> dict:
    """The precision the timestamps carry (the largest step every one is a multiple of) and the
    spacing of requests (the median gap), which together say what rounding would hide."""
    values = np.array([t for t in timestamps if isinstance(t, int) and not isinstance(t, bool)
                       and -(1 << 63) <= t < 1 << 63], dtype=np.int64)
    if not len(values):
        return {"granularity_ms": None}
    gaps = np.diff(np.sort(values))
    positive = gaps[gaps > 0]
    return {"granularity_ms": int(np.gcd.reduce(values)) if values.any() else None,
            "smallest_gap_ms": int(positive.min()) if len(positive) else None,
            "median_gap_ms": float(np.median(gaps)) if len(gaps) else None,
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
    """The report for a person: each figure, what it means, what the publisher can do."""
    ts, single, sessions = report["timestamps"], report["singled_out"], report["sessions"]
    lines = [f"{where}: {report['rows']:,} rows (each counted once) in {', '.join(report['files'])}",
             f"  fields present: {', '.join(f'{k} ({v:,} rows)' for k, v in report['fields'].items())}",
             f"  largest integers: {', '.join(f'{k} {v:,}' for k, v in report['largest_integers'].items())}"
             " (counts and dense ids stay small; token ids or hashes would not)",
             f"  hash ids: {report['hash_ids']['distinct']:,} distinct, "
             f"{'dense from 0' if report['hash_ids']['dense'] else 'NOT dense'}"]
    if ts.get("granularity_ms") is not None:
        lines.append(f"  timestamps: every one a multiple of {ts['granularity_ms']:,} ms; requests "
                     f"{_ms(ts.get('median_gap_ms'))} apart at the median, {_ms(ts.get('smallest_gap_ms'))} "
                     f"at the closest. To publish coarser timing: anonymize "
                     f"--timestamp-granularity-ms N")
    if single:
        lines.append(
            f"  rows unique in the trace: {single['unique_id_sequence']:.1%} by their id sequence, "
            f"{single['unique_lengths']:.1%} by their (input, output) lengths. Expected for "
            f"prefix traces and no text is exposed; it matters only to someone who already knows "
            f"a request's token count or block structure and wants to find its row. To blur "
            f"lengths: --length-granularity N (output lengths)")
    lines.append(f"  sessions: {sessions['sessions']:,} ({sessions['rows_with_session']:,} rows, at "
                 f"most {sessions['max_rows_per_session']:,} per session)"
                 + (": they link a user's turns; leave session ids out of the logs to publish "
                    "none" if sessions["sessions"] else ""))
    if report["manifest"]:
        m = report["manifest"]
        lines.append(f"  manifest: hash scheme {m['hash_scheme']}"
                     f"{'' if m.get('hash_scheme_keyed', True) else ' (unkeyed)'}, granularity "
                     f"{m.get('granularity')}")
    lines += [f"  FLAG {flag}" for flag in report["flags"]]
    lines.append("verdict: publishable: only what kvtrace publishes, nothing flagged"
                 if report["publishable"] else
                 f"verdict: NOT publishable: {len(report['flags'])} problem(s) flagged above")
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:,.1f} s" if value >= 1000 else f"{value:,.0f} ms"
