"""`kvtrace audit`: the publication gate for an output folder. It accepts only the bytes kvtrace
itself would write for the rows it finds, and flags everything else.

Each published file is parsed with the declared format (trace_format.py) and serialized again
by the writers' own functions; the file must equal those bytes. So a trace shard is exactly its
rows in kvtrace's JSONL and its Parquet twin exactly the same rows in kvtrace's Parquet (schema,
metadata and all; never decoded, so nothing its footer or pages claim is read); stats.json is exactly the statistics of those rows; manifest.json is
canonical JSON of the closed manifest schema of its provenance (a night, a night of an id map, a
stream's window), each of its fields held against its one confirmer (MANIFEST_CONFIRMERS: the
rows and files, where the numbering began, the auditing release, or an audit option as the run
was given it); a field without one is refused. The folder holds nothing else: no other,
hidden or special file, no subfolder, no extended attribute or inode flag kvtrace does not set.
The report shows every line escaped: nothing a folder names reaches the terminal but as one line
of printable text.

Measured, not flagged: timestamp granularity, the share of rows an outsider could single out
(by their whole id sequence; by their lengths), sessions.

Memory: one shard at a time, plus 32 bytes per row and 24 per distinct block id for the figures
and checks that span the folder (10M rows: benchmarks/README.md), and 16 per published minute
of each shard (the shard cuts).
"""

from __future__ import annotations

import errno
import io
import os
import re
import stat
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kvtrace.transforms import storage
from kvtrace.transforms.dead_letters import shown_name
from kvtrace.transforms.ids.row_order import in_published_order
from kvtrace.transforms.read.timestamps import DAY_MS, MAX_GAP_DAYS, widest_kept_gap_ms
from kvtrace.transforms.storage import SELINUX_ATTRIBUTE, is_url
from kvtrace.transforms.trace_format import (
    CAPTURE_FIELD,
    CAPTURE_MAP_NIGHT,
    CAPTURE_NIGHT,
    CAPTURE_ROW_FIELDS,
    CAPTURED_FIELDS,
    DERIVED_FROM,
    DERIVING_COMMANDS,
    FORMAT,
    HASH_IDS_FIELD,
    INPUT_LENGTH_FIELD,
    KEYED_SCHEME,
    MANIFEST,
    MANIFEST_SCHEMAS,
    MAP_NIGHT,
    MAX_BLOCK_SIZE,
    MODEL_NAME,
    NIGHT,
    NIGHT_ORIGIN,
    NO_PARENT,
    NO_RESPONSE_MS,
    NO_SESSION,
    OUTPUT_IDS_FIELD,
    OUTPUT_LENGTH_FIELD,
    PARENT_FIELD,
    PARENT_SCOPE,
    RESPONSE_FIELD,
    ROW_FIELDS,
    RUN_SETTINGS,
    SESSION_FIELD,
    STATS,
    STREAM_TOTALS,
    STREAM_TOTALS_SCHEMA,
    STREAM_WINDOW,
    TIME_ORIGIN_FIELD,
    TIMESTAMP_FIELD,
    TRACE_FILE,
    VLLM_SCHEME_PREFIX,
    WINDOW_NAME,
    FormatError,
    TraceColumns,
    canonical_json,
    capture_manifest,
    columns_of_jsonl,
    is_jsonl_of,
    manifest_provenance,
    parquet_forms,
    parse_json,
    schema_problems,
    shard_name,
    window_index,
    window_name,
)
from kvtrace.transforms.write.coarsen import (
    coarse_input_lengths,
    granularity_problem,
    round_to,
    timestamp_floor,
    timing_problem,
)
from kvtrace.transforms.write.manifest import (
    KVTRACE_VERSION,
    content_time,
    folder_content_time,
    public_tokenizer,
    replay_contract,
)
from kvtrace.transforms.write.publish import (
    MAX_MARK_BYTES,
    OUTPUT_MARK,
    OUTPUT_MARK_OBJECT,
    is_stream_mark,
    is_stream_mark_object,
    sha256_of,
)
from kvtrace.transforms.write.replayers import replay_commands
from kvtrace.transforms.write.rows import published_room
from kvtrace.transforms.write.shards import cuts_unlike_plan
from kvtrace.transforms.write.totals import (
    MEASURED_COUNTS,
    ExportTotals,
    export_stats,
    with_measured,
)

if TYPE_CHECKING:  # annotations only: the id map's modules load where a night of one is audited
    from kvtrace.transforms.ids.id_map import NightRows

MAX_MANIFEST_BYTES = 1 << 20  # a manifest of 99,999 shards is ~10 MB; ours are KBs: 1 MiB
MAX_STATS_BYTES = 1 << 16
# A shard holds at most 8M ids and rows (write/shards.MAX_BLOCKS_PER_SHARD): at most ~20 bytes
# per id and ~120 per row in JSONL, so no shard kvtrace writes comes near 2 GiB.
MAX_SHARD_BYTES = 2 << 30
# A trace file audited alone is only measured: read within a bound that keeps its rows well
# inside a worker's memory.
MAX_LONE_FILE_BYTES = 64 << 20
MAX_FLAGS = 50
# Distinct ids of later shards wait, and are merged in one sort once they outnumber the merged
# ones: each id is sorted O(log shards) times, never once per shard.
MERGE_AT_LEAST = 1 << 20


class _Gate:
    """What the audit found: flags, each once."""

    def __init__(self) -> None:
        self.flags: list[str] = []
        self.sha256: dict[str, str] = {}  # of every file read whole
        self.stat: dict[str, os.stat_result] = {}  # of every local entry, "" for the folder
        self.labels: dict[str, bytes] = {}  # each local entry's SELinux label, where it has one

    def flag(self, message: str) -> None:
        if message not in self.flags and len(self.flags) < MAX_FLAGS:
            self.flags.append(message)


@dataclass(frozen=True)
class Given:
    """What the operator gives the audit as the run was given it (its command line): the
    manifest's fields no row proves are held against these (MANIFEST_CONFIRMERS)."""

    tokenizer: str | None = None
    hash_scheme: str | None = None
    numbering: list[MapVersionNumbering] | None = None
    template_kwargs: dict | None = None
    settings: dict[str, int] = field(default_factory=dict)
    model_name: str | None = None
    capture: str | None = None  # anonymize --capture FORMAT, as the run was given it


def audit(
    target: str,
    tokenizer: str | None = None,
    hash_scheme: str | None = None,
    numbering: list[MapVersionNumbering] | None = None,
    template_kwargs: dict | None = None,
    settings: dict[str, int] | None = None,
    model_name: str | None = None,
    capture: str | None = None,
) -> dict:
    """The report on a folder (or one trace file, or a stream's output folder: each of its
    windows in order). What the manifest holds but no row proves is checked against what the
    operator gives: tokenizer (the folder, hub name or pkg: name the run used; else only none:
    write/manifest.public_tokenizer) and hash_scheme (the identity of the scheme the run hashed
    with, else only the keyed default passes: a vllm suffix derives from the engine's
    NONE_HASH) and numbering (the id map's versions, map_numbering: where a night that extends
    it may begin) and template_kwargs (the run's chat template kwargs as the manifest publishes
    them under the run's salt: write/manifest.public_template_kwargs) and settings (the run's
    block_size, timestamp_ms and output_length granularity, as far as given) and model_name
    (anonymize --model-name; else only none) and capture (anonymize --capture; else only a night
    read from text passes)."""
    given = Given(
        tokenizer, hash_scheme, numbering, template_kwargs, settings or {}, model_name, capture
    )
    folder = target.rstrip("/") or "/"
    if not is_url(folder) and os.path.isdir(folder):
        # Resolved once: a link's own attributes and times are not the folder's, which are
        # what a copy of it carries.
        folder = os.path.realpath(folder)
    windows = None if is_url(folder) else _stream_windows(folder)
    if windows is not None:
        return _audit_stream(folder, windows, replace(given, numbering=None))
    return _audit(folder, given)[0]


# An object store serves more than a listing and the objects' bytes show: each object's user
# metadata, tags and content type, and in a versioned bucket every earlier version under the
# prefix. Beam's file systems read none of them, so a remote folder is measured, never passed.
REMOTE_FOLDER = (
    "an object store's folder: its objects' metadata, tags and earlier versions are "
    "not readable here, so it is never called publishable: audit the local folder "
    "anonymize wrote (--output on local disk, or a copy of it) and publish that, "
    "uploaded to a new prefix"
)


def _audit(
    folder: str, given: Given, window_start: tuple[int, int] | None = None, last_ms: int = -1
) -> tuple[dict, _Rows, _Gate, dict | None]:
    """The report on a folder or trace file, its rows' figures, what the audit read (the
    entries' metadata) and its manifest when whole. window_start: where a stream's window must
    begin numbering, as the audited window before it ended; last_ms: that window's last row's
    time (-1: none), the row before this window's first (time order and the gap rule hold
    across)."""
    gate, rows, manifest = _Gate(), _Rows(last_timestamp=last_ms), None
    if is_url(folder):
        gate.flag(REMOTE_FOLDER)
    if is_url(folder) or os.path.isdir(folder):
        names = _entries(folder, gate)
        manifest = _manifest(folder, names, window_start is not None, gate)
        night = _night_rows(manifest, given, window_start is not None)
        _folder_rows(folder, names, manifest, gate, night, rows)
        if manifest is not None:
            _check_folder_against(folder, names, manifest, rows, gate)
            identity = night.identity() if night is not None and rows.complete else None
            _confirm_manifest(
                _Confirming(folder, names, manifest, rows, given, window_start, gate, identity)
            )
        _check_times(gate)
        _check_file_metadata(gate)
    else:
        folder, name = os.path.dirname(folder) or ".", os.path.basename(folder)
        names = [name]
        # Measured, never passed: no manifest vouches for a lone file's stats, granularity or
        # block size, and kvtrace publishes whole folders.
        gate.flag(
            f"a trace file alone: only a whole output folder (with its {MANIFEST}) is published"
        )
        if not TRACE_FILE.fullmatch(name):
            gate.flag(f"a file kvtrace does not publish: {name}")
        else:
            columns = _shard(
                folder,
                name if name.endswith(".jsonl") else None,
                name if name.endswith(".parquet") else None,
                gate,
                MAX_LONE_FILE_BYTES,
            )
            if columns is None:
                rows.complete = False
            else:
                rows.add(columns, None)
    if not rows.count and rows.complete:
        gate.flag("no trace rows: nothing to publish, or not a kvtrace output")
    if manifest is None:
        _check_first_time(rows, 0, gate)
    ids = rows.all_ids()
    if rows.complete and manifest is None and not id_report(ids)["dense"]:
        gate.flag(
            "hash_ids are not dense from 0, and no manifest says from where (token ids "
            "or raw hashes?)"
        )
    report = rows.report(names, id_report(ids))
    report["manifest"] = (
        None
        if manifest is None
        else {k: manifest[k] for k in ("hash_scheme", "hash_scheme_keyed", "granularity")}
    )
    report["flags"] = gate.flags
    report["publishable"] = not gate.flags
    return report, rows, gate, manifest


# A stream's output folder (pipelines/anonymize_streaming.py): its windows and cumulative.json,
# both declared in trace_format.py. The file holds five counts, ~150 bytes.
MAX_STREAM_TOTALS_BYTES = 1 << 12


def _stream_windows(folder: str) -> list[str] | None:
    """A stream's windows in their order when folder is a stream's output folder (it holds a
    window-* folder), else None."""
    if not os.path.isdir(folder):
        return None
    names = sorted(os.listdir(folder))
    if not any(WINDOW_NAME.fullmatch(n) for n in names):
        return None
    return names


def _audit_stream(folder: str, names: list[str], given: Given) -> dict:
    """Each window of a stream audited in order, each beginning where the audited window before
    it ended ((0, 0) for the first): a window's start is checked only against a window the
    audit has itself passed, never against a sibling read on trust. Every cut is recomputed
    from the rows' times and cumulative.json's window length; block ids stand for one prefix
    across the stream; cumulative.json is what the windows' rows give; the folder's own
    metadata is checked as a night folder's."""
    gate, reports, start, rows_seen = _Gate(), {}, (0, 0), 0
    windows = [
        n
        for n in names
        if os.path.isdir(os.path.join(folder, n)) and not os.path.islink(os.path.join(folder, n))
    ]
    # Its one attribute kvtrace sets: the stream's mark, exactly as the stream writes it on the
    # folder as it stands (a claim of any other window would be a free number).
    marked = is_stream_mark(folder, len(windows))
    _check_attributes(
        folder, "the stream's folder", gate, frozenset({OUTPUT_MARK} if marked else ())
    )
    gate.stat[""] = os.stat(folder)
    kept = _stream_mark_object(folder, names, gate)
    for name in sorted(set(names) - set(windows) - {STREAM_TOTALS} - kept):
        gate.flag(f"not a window of the stream: {name}")
    if [window_index(n) for n in windows] != list(range(len(windows))):
        gate.flag(f"the windows are not the stream's, numbered from 0 in order: {windows[:5]}")
        return {"windows": {}, "flags": gate.flags, "publishable": False}
    totals = _stream_totals(folder, gate)
    window_ms = _window_length(totals, given.settings, gate)
    chains, last_slot, first_settings, writers, last_ms = _Rows(), None, None, [], -1
    for name in windows:
        if start is None:
            gate.flag(
                f"{name}: not audited: the window before it is not publishable, so where "
                f"it begins cannot be checked"
            )
            continue
        report, rows, window_gate, manifest = _audit(
            os.path.join(folder, name), given, start, last_ms
        )
        writers.append(window_gate.stat)
        reports[name] = report
        for flag in report["flags"]:
            gate.flag(f"{name}: {flag}")
        rows_seen += rows.count
        if not report["publishable"]:
            start = None
            continue
        start = _numbering_end(start, rows)
        settings_here = {key: manifest.get(key) for key in RUN_SETTINGS}  # some optional
        first_settings = first_settings or settings_here
        differ = [key for key in RUN_SETTINGS if settings_here[key] != first_settings[key]]
        if differ:
            gate.flag(
                f"{name}: run settings other than the first window's ({', '.join(differ)})"
                f": one stream is one run"
            )
        last_slot = _check_window_cut(name, rows, window_ms, last_slot, gate)
        last_ms = rows.last_timestamp
        _chain_across_windows(chains, rows)
    chains._merge()
    chains.check_output_chains()
    for problem in chains.problems:
        gate.flag(f"across windows: {problem}")
    if start is not None and windows and totals is not None:  # else the stream is refused
        figures = {
            "windows": len(windows),
            "rows": rows_seen,
            "unique_blocks": start[0],
            "sessions": start[1],
        }
        granularity = reports[windows[-1]]["manifest"]["granularity"]["timestamp_ms"]
        _check_stream_totals(totals, figures, granularity, window_ms, last_slot, gate)
    _check_times(gate)
    _check_file_metadata(gate)
    _check_one_writer(writers, gate)
    return {"windows": reports, "flags": gate.flags, "publishable": not gate.flags}


def _window_length(totals: dict | None, given: dict[str, int], gate: _Gate) -> int | None:
    """The stream's window length (cumulative.json's window_ms) once it is the one the run was
    given (audit --window-ms), else a round value: any other length would be a free choice of
    where the windows are cut. None when unknown or not accepted."""
    if totals is None:
        return None
    window_ms = totals["window_ms"]
    if "window_ms" in given and window_ms != given["window_ms"]:
        gate.flag(
            f"{STREAM_TOTALS}: window_ms is {window_ms}, the run was given --window-ms "
            f"{given['window_ms']}"
        )
        return None
    if "window_ms" not in given and window_ms not in ROUND_STEPS:
        gate.flag(
            f"{STREAM_TOTALS}: window_ms {window_ms} is none of the round values the gate "
            f"passes unconfirmed: pass --window-ms as the run was given --window"
        )
        return None
    return window_ms


def _check_window_cut(
    name: str, rows: _Rows, window_ms: int | None, last_slot: int | None, gate: _Gate
) -> int | None:
    """A window holds the rows of one window of the stream's time, [k W, (k + 1) W) from the
    trace's zero (anonymize_streaming.by_window), later than the window before it's; the first
    window's first row is the zero. Returns its k (None while the window length is unknown)."""
    times = rows.column("times")
    if not len(times):
        return last_slot
    if name == window_name(0) and times.min() != 0:
        gate.flag(
            f"{name}: the stream's first row is not at time 0: its zero is its first "
            f"request (an absolute time?)"
        )
    if window_ms is None:
        return last_slot
    slots = times // window_ms
    if slots.min() != slots.max():
        gate.flag(
            f"{name}: rows of more than one {window_ms} ms window: windows are cut at "
            f"whole windows from the zero"
        )
    if last_slot is not None and slots.min() <= last_slot:
        gate.flag(f"{name}: rows of a window not after the window before it's")
    return int(slots.max())


def _chain_across_windows(chains: _Rows, rows: _Rows) -> None:
    """A window's distinct block ids with their tokens and parents (and its output ids'), folded
    into the stream's: an id stands for one prefix in every window, as in one night."""
    chains.pending.append((rows.ids, rows.weights, rows.merged[2]))
    chains.output_links += rows.output_links
    if sum(len(p[0]) for p in chains.pending) >= max(MERGE_AT_LEAST, len(chains.merged[0])):
        chains._merge()


def _stream_mark_object(folder: str, names: list[str], gate: _Gate) -> set[str]:
    """The mark an object store's stream folder carries as an object (a copy of that folder
    holds it as a file): kept, its metadata checked as every published file's, only when its
    bytes are exactly the stream's (publish.is_stream_mark_object); else nothing kept."""
    if OUTPUT_MARK_OBJECT not in names:
        return set()
    data = _read(folder, OUTPUT_MARK_OBJECT, MAX_MARK_BYTES, gate)
    if data is None or not is_stream_mark_object(data):
        return set()
    path = os.path.join(folder, OUTPUT_MARK_OBJECT)
    gate.stat[OUTPUT_MARK_OBJECT] = os.lstat(path)
    _check_attributes(path, OUTPUT_MARK_OBJECT, gate)
    return {OUTPUT_MARK_OBJECT}


def _stream_totals(folder: str, gate: _Gate) -> dict | None:
    """cumulative.json as the stream writes it: the closed schema (trace_format.
    STREAM_TOTALS_SCHEMA) in canonical JSON; None (flagged) when it is anything else."""
    path = os.path.join(folder, STREAM_TOTALS)
    data = _read_stream_totals(path, gate)
    if data is None:
        return None
    gate.sha256[STREAM_TOTALS] = sha256_of(data)
    return _declared_document(STREAM_TOTALS, data, lambda _: STREAM_TOTALS_SCHEMA, gate)


def _check_stream_totals(
    totals: dict,
    figures: dict[str, int],
    granularity: int,
    window_ms: int | None,
    last_slot: int | None,
    gate: _Gate,
) -> None:
    """Each count what the windows' rows give (figures), published_until_ms the end of the
    last window from the zero, rounded as the rows' times are (granularity): what
    anonymize_streaming.cumulative_summary writes."""
    for key, value in figures.items():
        if totals[key] != value:
            gate.flag(f"{STREAM_TOTALS}: {key} is {totals[key]}, the windows' rows give {value}")
    if window_ms is None or last_slot is None:
        return  # the window length is flagged already
    until = int(round_to(np.int64((last_slot + 1) * window_ms), granularity))
    if totals["published_until_ms"] != until:
        gate.flag(
            f"{STREAM_TOTALS}: published_until_ms is {totals['published_until_ms']}, the "
            f"end of the last window is {until} ms ({window_ms} ms windows from the zero, "
            f"rounded to {granularity} ms)"
        )


def _read_stream_totals(path: str, gate: _Gate) -> bytes | None:
    """cumulative.json's bytes, read only when it is a regular file within its bound."""
    try:
        entry = os.lstat(path)
    except FileNotFoundError:
        gate.flag(f"no {STREAM_TOTALS}: the stream writes one after every window")
        return None
    if not stat.S_ISREG(entry.st_mode):
        gate.flag(f"{STREAM_TOTALS}: not a regular file (a link, FIFO or device)")
        return None
    if entry.st_size > MAX_STREAM_TOTALS_BYTES:
        gate.flag(
            f"{STREAM_TOTALS}: {entry.st_size} bytes, more than kvtrace writes "
            f"({MAX_STREAM_TOTALS_BYTES})"
        )
        return None
    gate.stat[STREAM_TOTALS] = entry
    _check_attributes(path, STREAM_TOTALS, gate)
    try:
        with open(path, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NOFOLLOW)) as f:
            return f.read(MAX_STREAM_TOTALS_BYTES + 1)
    except OSError as err:
        gate.flag(f"{STREAM_TOTALS}: unreadable ({err.strerror or err})")
        return None


def _numbering_end(start: tuple[int, int], rows: _Rows) -> tuple[int, int]:
    """Where the next window begins numbering: past every id and session this one holds."""
    ids, sessions = rows.all_ids(), rows.sessions()
    return (
        max(start[0], int(ids[-1]) + 1 if len(ids) else 0),
        max(start[1], int(sessions[-1]) + 1 if len(sessions) else 0),
    )


def _entries(folder: str, gate: _Gate) -> list[str]:
    """The names kvtrace publishes that the folder holds; anything else is flagged here."""
    if is_url(folder):
        # Every object under the folder's prefix (nested ones too), as a copy of the folder
        # would take them all.
        names = storage.files_in(folder, nested=True)
        for name in [n for n in names if "/" in n]:
            gate.flag(f"an object in a subfolder: {name}")
    else:
        _check_attributes(folder, "the folder itself", gate)
        gate.stat[""] = os.stat(folder)
        names = []
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            kind = entry_kind_problem(entry)
            if kind:
                gate.flag(kind)
            else:
                names.append(entry.name)
                gate.stat[entry.name] = entry.stat(follow_symlinks=False)
                _check_attributes(entry.path, entry.name, gate)
    for name in names:
        if name not in (MANIFEST, STATS) and not TRACE_FILE.fullmatch(name):
            gate.flag(
                f"a file kvtrace does not publish: {name}"
                + (" (hidden)" if name.startswith(".") else "")
            )
    return [n for n in names if n in (MANIFEST, STATS) or TRACE_FILE.fullmatch(n)]


def entry_kind_problem(entry: os.DirEntry) -> str | None:
    """Why a local folder's entry is no file kvtrace publishes, as the gate flags it, without
    following it: a subfolder, anything but a regular file (a link, FIFO, socket or device), or
    a file of more than one name (a hard link: a write to the other name changes the published
    bytes in place); None for a regular file of its own. The launcher holds a staged folder's
    entries to this, and to entry_metadata_problems, before publishing them."""
    if entry.is_dir(follow_symlinks=False):
        return f"a subfolder: {entry.name}"
    if not entry.is_file(follow_symlinks=False):
        return f"not a regular file (a link, FIFO or device): {entry.name}"
    links = entry.stat(follow_symlinks=False).st_nlink
    if links != 1:
        return f"{entry.name}: a file of {links} names (a hard link), not one of its own"
    return None


def entry_metadata_problems(path: str, name: str, kept: frozenset[str] = frozenset()) -> list[str]:
    """What a local entry carries beside its bytes that kvtrace does not set, as the gate flags
    it (_check_attributes): foreign metadata (storage.foreign_metadata) and foreign owners."""
    problems = storage.foreign_metadata(path, name, kept, owners=False)
    if storage.foreign_owners(os.lstat(path)):  # one line for the folder: never crowds out others
        problems.append(f"the folder or its entries: {storage.FOREIGN_OWNERS}")
    return problems


# An SELinux context as the kernel stores it: user:role:type[:level], ASCII, NUL-terminated.
SELINUX_CONTEXT = re.compile(
    rb"[a-z_][a-z0-9_]*:[a-z_][a-z0-9_]*:[a-z_][a-z0-9_]*"
    rb"(:s[0-9]+(-s[0-9]+)?(:c[0-9]+([.,]c[0-9]+)*)?)?\x00?"
)
MAX_SELINUX_LABEL = 255
SELINUX_FS = "/sys/fs/selinux"  # mounted where the SELinux module labels files


def _check_attributes(
    path: str, name: str, gate: _Gate, kept: frozenset[str] = frozenset()
) -> None:
    """What a copy that keeps them carries (cp -a, rsync -X, tar --xattrs, bsdtar's --fflags)
    beside the bytes: storage.foreign_metadata, the one rule a run also holds its staging
    folder to (extended attributes, inode flags, owners). The SELinux label, which a security
    module sets on every file, is kept for _check_file_metadata; so are kept attributes (a
    stream's folder's output mark, its bytes checked by the caller)."""
    for problem in entry_metadata_problems(path, name, kept):
        gate.flag(problem)
    try:
        gate.labels[name] = os.getxattr(path, SELINUX_ATTRIBUTE, follow_symlinks=False)
    except OSError as err:
        if err.errno not in NO_LABEL:
            gate.flag(f"{name}: unreadable SELinux label ({err.strerror or err})")


# What reading an entry's SELinux label fails with where it has none
NO_LABEL = frozenset({errno.ENODATA, errno.EOPNOTSUPP, errno.ENOTSUP})


# The umasks a writer's files may have been made under: the verdict on the same bytes must not
# depend on the auditor's own umask; a choice among three is under 2 bits per folder.
WRITERS_UMASKS = (0o022, 0o027, 0o077)


# (folder, files) modes of one writer: a published folder rwxr-xr-x (publish sets it) with its
# files rw-r--r-- under the writer's umask, or a private one's rwx------ with rw-------.
WRITERS_MODES = frozenset(
    {(storage.PUBLIC_FOLDER, storage.PUBLIC_FILE & ~umask) for umask in WRITERS_UMASKS}
    | {(storage.PRIVATE_FOLDER, storage.PRIVATE_FILE)}
)


def _one_writers_modes(folders: set[int], files: set[int]) -> bool:
    """Whether folders and their files carry the modes one writer gives: one mode for every
    folder, one for every file, the pair one writer's (WRITERS_MODES)."""
    if len(folders) != 1 or len(files) > 1:
        return False
    (folder,) = folders
    return any(folder == mode and files <= {file_mode} for mode, file_mode in WRITERS_MODES)


def _check_one_writer(windows: list[dict[str, os.stat_result]], gate: _Gate) -> None:
    """A stream's windows were written by one process, under one umask: every window folder of
    one mode and every file of the stream (cumulative.json's too) of one, the pair one
    writer's; a choice per window would carry bits per window."""
    folders = {stat.S_IMODE(entries[""].st_mode) for entries in windows if "" in entries}
    files = {
        stat.S_IMODE(st.st_mode)
        for entries in [*windows, gate.stat]
        for name, st in entries.items()
        if name
    }
    if folders and not _one_writers_modes(folders, files):
        gate.flag(
            f"permission bits of more than one writer across the stream (window folders "
            f"{sorted(oct(m) for m in folders)}, files {sorted(oct(m) for m in files)}): "
            f"one stream is one run; copy without -p"
        )


def _check_file_metadata(gate: _Gate) -> None:
    """What a copy that keeps metadata (cp -p/-a, rsync -a, tar) carries beside the content
    times, as kvtrace leaves it: permission bits storage.create and publish give (the files one
    mode, rw-r--r-- under the writer's umask (one of WRITERS_UMASKS, whatever the auditor's) or a
    private run's rw-------; the folder rwxr-xr-x or
    rwx------), owners as _check_attributes finds them, no access time
    past the audit's clock (kvtrace sets it to the content time, a read moves it to its own),
    and an SELinux label only where SELinux labels files: one well-formed label, the folder's."""
    if "" not in gate.stat:
        return
    folder = stat.S_IMODE(gate.stat[""].st_mode)
    modes = {stat.S_IMODE(st.st_mode) for name, st in gate.stat.items() if name}
    if not _one_writers_modes({folder}, modes):
        gate.flag(
            f"permission bits kvtrace does not set (files {sorted(oct(m) for m in modes)}, "
            f"the folder {oct(folder)}): copy without -p"
        )
    now_ns = time.time_ns()
    if any(not st.st_mtime_ns <= st.st_atime_ns <= now_ns for st in gate.stat.values()):
        gate.flag(
            "access times kvtrace does not set (before the content time or in the "
            "future): copy without -p / rsync -U"
        )
    labels = set(gate.labels.values())
    if labels and (
        not os.path.isdir(SELINUX_FS)
        or len(gate.labels) != len(gate.stat)
        or len(labels) > 1
        or not all(
            len(label) <= MAX_SELINUX_LABEL
            and SELINUX_CONTEXT.fullmatch(label)
            and _policy_knows(label)
            for label in labels
        )
    ):
        gate.flag(
            "security.selinux values no SELinux module set here (free bytes, labels that "
            "differ from the folder's, or a context the loaded policy does not define)"
        )


def _policy_knows(label: bytes) -> bool:
    """Whether the loaded SELinux policy defines the context (the kernel's check_context, as
    libselinux's security_check_context asks it: writing it to selinuxfs fails unless valid).
    A context root stored unmapped, or one from another host's policy, is not."""
    try:
        with open(os.path.join(SELINUX_FS, "context"), "r+b", buffering=0) as check:
            check.write(label.rstrip(b"\x00") + b"\x00")
        return True
    except OSError:  # EINVAL: not a context of this policy; no selinuxfs: nothing vouches for it
        return False


def _tokenizer_here(name: str) -> Any:
    """The operator's tokenizer where it loads without the network (a folder, a pkg: package,
    the local hub cache), else None."""
    from kvtrace.transforms.encode.fast_tokenizer import FastTokenizer
    from kvtrace.transforms.encode.tokenize import _HUB_PATTERNS, PACKAGE_PREFIX, load_tokenizer

    try:
        if name.startswith(PACKAGE_PREFIX) or os.path.isdir(name):
            return load_tokenizer(name)
        from huggingface_hub import snapshot_download

        folder = snapshot_download(name, allow_patterns=_HUB_PATTERNS, local_files_only=True)
        return FastTokenizer.from_directory(Path(folder))
    except (OSError, ValueError):  # not here, or not a tokenizer kvtrace loads
        return None


# The run settings a manifest may hold unconfirmed (the rows bound them only partly: a night
# whose times all round to 0, or whose prompts all fit one block, would leave them free): block
# sizes engines page by (powers of two) and round steps of time and length. Any other value the
# CLI accepts passes when audit is given it as the run was (--block-size, ...).
ROUND_STEPS = frozenset({1, 10, 100, 1000, 10_000, 60_000, 600_000, 3_600_000, 86_400_000})
SETTING_VALUES = {
    "block_size": ("--block-size", frozenset(1 << k for k in range(MAX_BLOCK_SIZE.bit_length()))),
    "timestamp_ms": ("--timestamp-granularity-ms", ROUND_STEPS),
    OUTPUT_LENGTH_FIELD: (
        "--length-granularity",
        ROUND_STEPS | frozenset(1 << k for k in range(MAX_BLOCK_SIZE.bit_length())),
    ),
}


def _check_times(gate: _Gate) -> None:
    """Each file's mtime and the folder's are the ones kvtrace derives from their content
    (write/manifest.set_content_times): any other time is a number someone chose."""
    files = {name: entry.st_mtime_ns for name, entry in gate.stat.items() if name}
    expected = {name: content_time(gate.sha256[name]) for name in files if name in gate.sha256}
    if "" in gate.stat and expected.keys() == files.keys():
        expected[""] = folder_content_time({n: gate.sha256[n] for n in files})
    if any(gate.stat[name].st_mtime_ns != stamp * 10**9 for name, stamp in expected.items()):
        gate.flag(
            "file times are not the ones kvtrace sets (each derived from its content): "
            "copy the folder with times preserved (cp -p, rsync -t)"
        )


def _read(
    folder: str,
    name: str,
    limit: int,
    gate: _Gate,
    lengths: frozenset[int] | None = None,
    unlike: str = "",
) -> bytes | None:
    """A published file's bytes, read once, refused before reading when it is not a regular
    file or is larger than any file kvtrace writes under that name (limit). lengths: the only
    sizes kvtrace writes it in (a Parquet twin's forms): a local file of any other size is
    flagged (unlike) unread, with no digest (_check_times then holds no time to it), and no
    more than the longest is read of a remote one."""
    path = storage.join(folder, name)
    bound = limit if lengths is None else min(limit, max(lengths))
    try:
        if is_url(path):
            handle, size = storage.open_read(path), bound
        else:
            handle, size = storage.open_regular(path, limit)
        with handle:  # a buffer of the file's size, not of the largest file kvtrace writes
            if lengths is not None and not is_url(path) and size not in lengths:
                gate.flag(unlike)
                return None
            data = handle.read(min(size, bound) + 1)  # one more tells a file that grew
    except storage.UnfitFile as err:
        gate.flag(str(err))  # not a regular file (a link, FIFO or device), or too large
        return None
    except OSError as err:
        gate.flag(f"{name}: unreadable ({err.strerror or err})")
        return None
    if len(data) > bound:
        gate.flag(f"{name}: larger than kvtrace writes")
        return None
    gate.sha256[name] = sha256_of(data)
    return data


def _shard_pairs(names: list[str], gate: _Gate) -> list[tuple[str | None, str | None]]:
    """The shards a folder should hold, from the shard count its file names give: every one of
    them, each as a JSONL file and its Parquet twin."""
    counts = {int(TRACE_FILE.fullmatch(n).group(2)) for n in names if TRACE_FILE.fullmatch(n)}
    if len(counts) > 1:
        gate.flag(f"trace files of different shard counts: {sorted(counts)}")
    shards = max(counts, default=0)
    expected = {shard_name(i, shards, s) for i in range(shards) for s in (".jsonl", ".parquet")}
    for name in sorted(set(n for n in names if TRACE_FILE.fullmatch(n)) - expected):
        gate.flag(f"a trace file outside the folder's shards: {name}")
    for name in sorted(expected - set(names)):
        gate.flag(f"missing: {name}")
    present = set(names)
    return [
        (j if j in present else None, p if p in present else None)
        for j, p in (
            (shard_name(i, shards, ".jsonl"), shard_name(i, shards, ".parquet"))
            for i in range(shards)
        )
    ]


def _night_rows(manifest: dict | None, given: Given, stream_window: bool) -> NightRows | None:
    """What the night's identity is taken from, shard by shard as the audit reads them, when
    its id_map is to be confirmed against an id map's record (a night of a map, audited with
    --id-map); else None."""
    if given.numbering is None or manifest is None:
        return None
    if manifest_provenance(manifest, stream_window) not in (MAP_NIGHT, CAPTURE_MAP_NIGHT):
        return None
    from kvtrace.transforms.ids.id_map import NightRows

    return NightRows(manifest)


def _shard(
    folder: str,
    jsonl: str | None,
    parquet: str | None,
    gate: _Gate,
    limit: int = MAX_SHARD_BYTES,
    night: NightRows | None = None,
) -> TraceColumns | None:
    """A shard's rows when its files are exactly kvtrace's bytes for them, else None (flagged).
    The rows come from the JSONL file alone (a bounded parse: trace_format.columns_of_jsonl),
    which must then be kvtrace's JSONL of them; a Parquet file is never decoded, only compared
    whole with the bytes kvtrace writes for those rows: whatever its footer or pages claim,
    nothing of it is read by Arrow, so no claim of it is trusted. night: given the JSONL bytes
    as read, so the night's identity is of the bytes audited, never of a second read."""
    if jsonl is None:  # a Parquet file audited alone: nothing to compare it with
        gate.flag(
            f"{parquet}: a Parquet shard is not read alone: the audit reads a shard's rows from "
            f"its JSONL twin"
        )
        return None
    lines = _read(folder, jsonl, limit, gate)
    if lines is None:
        return None
    if night is not None:
        night.add(io.BytesIO(lines))
    try:
        columns = columns_of_jsonl(lines)
    except FormatError as err:
        gate.flag(f"{jsonl}: {err}")
        return None
    ok = is_jsonl_of(lines, columns)
    if not ok:
        gate.flag(
            f"{jsonl}: not the bytes kvtrace writes for its rows (spacing, key order, "
            f"duplicate keys, number forms)"
        )
    if parquet is None:
        return columns if ok else None
    forms = parquet_forms(columns)
    unlike = (
        f"{parquet}: not the bytes kvtrace writes for the rows of its JSONL twin ({jsonl}):"
        f" other rows, metadata, encoding or another writer"
    )
    # Read only a file of a length kvtrace's bytes for these rows have: any other is not them,
    # whatever it holds (a sparse 2 GiB twin beside six rows is refused by its size).
    twin = _read(folder, parquet, limit, gate, frozenset(map(len, forms)), unlike)
    if twin is None:
        return None
    if twin not in forms:
        ok = False
        gate.flag(unlike)
    return columns if ok else None


def _manifest(folder: str, names: list[str], stream_window: bool, gate: _Gate) -> dict | None:
    """manifest.json when it is canonical JSON of the closed manifest schema of its provenance
    (trace_format.MANIFEST_SCHEMAS: a stream's window when stream_window), else None."""
    if MANIFEST not in names:
        gate.flag(f"no {MANIFEST}: not a complete kvtrace output")
        return None
    data = _read(folder, MANIFEST, MAX_MANIFEST_BYTES, gate)
    if data is None:
        return None
    derived = _derived_by(data)
    if derived:
        gate.flag(
            f"{MANIFEST}: a trace derived by kvtrace {derived}, not an anonymize output: the "
            f"audit passes only what anonymize publishes, checked against its settings; "
            f"publish the trace it came from"
        )
        return None
    return _declared_document(
        MANIFEST,
        data,
        lambda document: MANIFEST_SCHEMAS[manifest_provenance(document, stream_window)],
        gate,
    )


def _derived_by(data: bytes) -> str | None:
    """The command a derived trace's manifest names (synth/derived.py), else None."""
    try:
        document = parse_json(data)
    except FormatError:
        return None
    derived = document.get(DERIVED_FROM) if isinstance(document, dict) else None
    command = derived.get("command") if isinstance(derived, dict) else None
    return command if command in DERIVING_COMMANDS else None


def _declared_document(
    name: str, data: bytes, schema_of: Callable[[Any], dict], gate: _Gate
) -> dict | None:
    """A JSON file kvtrace writes (the manifest, a stream's totals): parsed, within its declared
    schema (schema_of the document: a manifest's depends on its provenance), and exactly the
    canonical bytes of its values; None (flagged) when it is not whole."""
    try:
        document = parse_json(data)
    except FormatError as err:
        gate.flag(f"{name}: {err}")
        return None
    problems = schema_problems(document, schema_of(document))
    for problem in problems:
        gate.flag(f"{name}: {problem}")
    if problems:
        return None
    if canonical_json(document) != data:
        gate.flag(
            f"{name}: not the bytes kvtrace writes for its values (canonical JSON: sorted "
            f"keys, two-space indent, number forms)"
        )
    return document


def _check_folder_against(
    folder: str, names: list[str], manifest: dict, rows: _Rows, gate: _Gate
) -> None:
    """What the folder holds beside the manifest's fields (those are _confirm_manifest's):
    stats.json the statistics of its rows, shards cut where kvtrace cuts them, the rows as the
    manifest describes them (_Rows._check)."""
    stats = _read(folder, STATS, MAX_STATS_BYTES, gate) if STATS in names else None
    if STATS not in names:
        gate.flag(f"no {STATS}")
    if not rows.complete:
        return  # the shards' own flags say why; figures over all rows would only add noise
    if stats is not None and stats != canonical_json(_stats_of(rows, stats)):
        gate.flag(f"{STATS} holds more, or other, than the statistics of these rows")
    cut = cuts_unlike_plan(rows.shard_rooms)
    if cut:
        gate.flag(cut)
    rows.check_output_chains()
    for problem in rows.problems:
        gate.flag(problem)


def row_flags(folder: str, names: list[str], manifest: dict) -> tuple[list[str], dict[str, str]]:
    """The gate's row, twin and stats checks of a local folder's shards and stats.json (names:
    its files) against its manifest, as _audit makes them: the launcher holds a staged night to
    these before it publishes it. Returns the flags and the sha256 of every file read, so the
    caller holds the bytes checked to those it digested."""
    gate = _Gate()
    _check_folder_against(
        folder, names, manifest, _folder_rows(folder, names, manifest, gate), gate
    )
    return gate.flags, gate.sha256


def _folder_rows(
    folder: str,
    names: list[str],
    manifest: dict | None,
    gate: _Gate,
    night: NightRows | None = None,
    rows: _Rows | None = None,
) -> _Rows:
    """The rows of a folder's shards (names: its files), each shard checked as it is read;
    added to rows when given (a stream's window continuing from the one before it)."""
    rows = _Rows() if rows is None else rows
    for jsonl, parquet in _shard_pairs(names, gate):
        # A shard without its twin is flagged already; its rows are not read (a JSONL file
        # alone would be parsed into Python objects).
        columns = _shard(folder, jsonl, parquet, gate, night=night) if jsonl and parquet else None
        if columns is None:
            rows.complete = False
        else:
            rows.add(columns, manifest)
    return rows


def _stats_of(rows: _Rows, published: bytes) -> dict:
    """The statistics of the rows; with the engine's measured aggregate where the published
    file has one that these rows can hold (its three counts, rebuilt by the writer's own
    function: nothing else passes, an aggregate of fewer than MIN_MEASURED_REQUESTS requests
    included), which the rows cannot confirm: the per-request values stay private, in the run's
    measured file."""
    stats = rows.stats()
    try:
        measured = parse_json(published).get("measured")
    except (ValueError, AttributeError):  # FormatError is one
        return stats  # not the stats kvtrace writes: the bytes differ
    counts = [measured.get(name) for name in MEASURED_COUNTS] if isinstance(measured, dict) else []
    if len(counts) != len(MEASURED_COUNTS) or any(type(c) is not int for c in counts):
        return stats
    requests, cached, inputs = counts
    if 0 < requests <= stats["requests"] and 0 <= cached <= inputs <= stats["input_tokens"]:
        return with_measured(stats, requests, cached, inputs)
    return stats


@dataclass(frozen=True)
class MapVersionNumbering:
    """The night an id map version records: where it began (block id, session, time) and its
    identity (ids/id_map.night_identity); both None in a version made before id map format 6."""

    start: tuple[int, int, int] | None
    night: str | None
    # What the map's ids are over: its capture format (id_map.MapIdentity.engine_capture), None
    # for text blocks. A night is confirmed only by a map of its kind.
    capture: str | None = None


def map_numbering(directory: str, salt: bytes) -> list[MapVersionNumbering]:
    """Every version of an id map, as its published record (verified with the map's key)
    lists them (ids/id_map.published_record)."""
    from kvtrace.transforms.ids.id_map import published_record
    from kvtrace.transforms.ids.map_record import map_key

    record = published_record(directory, map_key(salt)) or {"history": []}
    return [
        MapVersionNumbering(
            _start_figures(entry["start"]) if "start" in entry else None,
            entry.get("night"),
            record.get("engine_capture"),
        )
        for entry in record["history"]
    ]


def _start_figures(start: dict) -> tuple[int, int, int]:
    return start["block_ids_from"], start["sessions_from"], start["time_from_ms"]


@dataclass(frozen=True)
class _Confirming:
    """What a manifest's fields are held against: the folder and its rows, where the audited
    window before ended (window_start, in a stream), what the operator gave the audit."""

    folder: str
    names: list[str]
    manifest: dict
    rows: _Rows
    given: Given
    window_start: tuple[int, int] | None
    gate: _Gate
    # The night's identity (ids/id_map.NightRows) from the shards as the audit read them: only
    # under --id-map, and None when a shard was not read whole
    night: str | None = None

    @property
    def provenance(self) -> str:
        return manifest_provenance(self.manifest, self.window_start is not None)

    def flag(self, message: str) -> None:
        self.gate.flag(f"{MANIFEST}: {message}")


def _confirm_release(c: _Confirming) -> None:
    """kvtrace_version and format: the auditing release's own; a manifest of another release is
    held to that release's rules, which this one does not know."""
    version = c.manifest["kvtrace_version"]
    if (version, c.manifest["format"]) != (KVTRACE_VERSION, FORMAT):
        c.flag(
            f"written by kvtrace {version}, audited by {KVTRACE_VERSION}: audit with the "
            f"release that wrote it"
        )


def _confirm_replay_contract(c: _Confirming) -> None:
    """ids and hit_rates: this release's vocabulary (write/manifest.replay_contract), the
    same for every night it writes; the rows are held to the ids' width as they are read."""
    expected = replay_contract()
    if {key: c.manifest[key] for key in expected} != expected:
        c.flag("ids or hit_rates are not what this release writes")


def _confirm_files(c: _Confirming) -> None:
    """files and sha256: exactly the folder's files, each with its digest as read."""
    present = sorted(n for n in c.names if n != MANIFEST)
    files, digests = c.manifest["files"], c.manifest["sha256"]
    if files != present or sorted(digests) != present:
        c.gate.flag(
            f"{MANIFEST} lists {files} (sha256 of {sorted(digests)}), the folder holds {present}"
        )
    for name in present:
        if name in c.gate.sha256 and digests.get(name) != c.gate.sha256[name]:
            c.gate.flag(f"{name} is not the file {MANIFEST} lists (sha256 differs)")


def _confirm_replay(c: _Confirming) -> None:
    """replay: what replayers.py writes for the folder's block size, rows and files."""
    manifest = c.manifest
    expected = replay_commands(
        manifest["block_size"], manifest["records"]["exported"], manifest["files"]
    )
    if manifest["replay"] != expected:
        c.flag("replay is not what kvtrace writes there")


def _confirm_output_ids(c: _Confirming) -> None:
    """output_hash_ids: whether the rows hold that field (each shard's rows are held to it as
    read, _Rows._check), never beside coarse output lengths."""
    if c.manifest[OUTPUT_IDS_FIELD] and c.manifest["granularity"][OUTPUT_LENGTH_FIELD] > 1:
        c.gate.flag(
            f"{OUTPUT_IDS_FIELD} beside --length-granularity: output block ids give each "
            "output length to within a block"
        )


def _confirm_records(c: _Confirming) -> None:
    """records.exported: the rows the folder holds."""
    exported = c.manifest["records"]["exported"]
    if c.rows.complete and exported != c.rows.count:
        c.flag(f"records.exported is {exported}, the trace holds {c.rows.count} rows")


def _check_first_time(rows: _Rows, expected: int, gate: _Gate) -> None:
    """A night's clock starts at its first request, or where its manifest's id_map says."""
    if rows.count and rows.first_timestamp != expected:
        gate.flag(
            "the first row is not at time 0 (or the manifest's id_map.time_from_ms): a "
            "night's clock starts at its first request, or the id map's (an absolute time?)"
        )


def _confirm_own_start(c: _Confirming) -> None:
    """A night of its own (id_map null) begins at 0, 0, 0: its ids and sessions dense from 0,
    its first row at time 0."""
    _check_first_time(c.rows, 0, c.gate)
    if not c.rows.complete:
        return
    for kind, ids in (("block", c.rows.all_ids()), (SESSION_FIELD, c.rows.sessions())):
        if len(ids) and ids[-1] != len(ids) - 1:
            c.gate.flag(f"{kind} ids not dense from 0: {len(ids):,} distinct up to {ids[-1]:,}")


def _confirm_first_time(c: _Confirming) -> None:
    """Where the rows' clock starts: the first row at time 0 under time_origin "night" (a night
    of an id map counted from its own start), else at id_map.time_from_ms (the map's origin, or
    a stream's zero)."""
    from_night = c.manifest.get(TIME_ORIGIN_FIELD) == NIGHT_ORIGIN
    _check_first_time(c.rows, 0 if from_night else c.manifest["id_map"]["time_from_ms"], c.gate)


def _confirm_recorded_start(c: _Confirming) -> None:
    """A night that extends an id map is the night a version of the map recorded: its start,
    all three figures, and its identity (its rows on the map's clock, which bind every row: a
    night's references to the map's earlier ids included; or, recorded before that, its files'
    digests). The folder alone shows neither."""
    from kvtrace.transforms.ids.id_map import files_identity, ids_over

    numbering = c.given.numbering
    if numbering is None:
        c.flag(
            "id_map says where this night's numbering began, which only the id map (or, for a "
            "stream's window, the stream's folder audited whole) can confirm: pass --id-map MAP "
            "with the salt the run used (--salt-file or --salt-secret), or audit the stream's "
            "output folder"
        )
        return
    if c.night is None:
        c.flag(
            "id_map cannot be confirmed: the night's identity binds every row, and a shard "
            "was not read (flagged above)"
        )
        return
    identities = (c.night, files_identity(c.manifest))
    begins = _start_figures(c.manifest["id_map"])
    capture = c.manifest[CAPTURE_FIELD]["format"] if CAPTURE_FIELD in c.manifest else None
    if any(MapVersionNumbering(begins, identity, capture) in numbering for identity in identities):
        return
    kinds = {version.capture for version in numbering} - {capture}
    if kinds:
        c.flag(
            f"id_map: the id map numbers {ids_over(kinds.pop())}, this night "
            f"{ids_over(capture)}: no map of the one confirms a night of the other"
        )
        return
    unnamed = [number for number, version in enumerate(numbering, 1) if version.start is None]
    if unnamed:
        c.flag(
            f"id_map names no night the id map recorded, and its versions "
            f"{unnamed[0]}-{unnamed[-1]} record none (made before id map format 6): to "
            f"confirm a night of theirs, anonymize it again with this kvtrace (same input, "
            f"salt and map), which records it, and publish that output"
        )
    else:
        c.flag(
            "id_map and the files are not a night a version of the id map recorded (its "
            "start, time included, and its files' digests)"
        )


def _confirm_window_start(c: _Confirming) -> None:
    """A stream's window begins numbering where the audited window before it ended."""
    begins = _start_figures(c.manifest["id_map"])[:2]
    if begins != c.window_start:
        c.flag(f"id_map begins at {begins}, the window before ends at {c.window_start}")


def _confirm_tokenizer(c: _Confirming) -> None:
    _check_tokenizer(c.manifest, c.given.tokenizer, c.gate)


def _check_tokenizer(manifest: dict, tokenizer: str | None, gate: _Gate) -> None:
    """The schema holds the tokenizer to one kvtrace publishes by name with its pinned digests,
    or none, so nothing of a private tokenizer's files is published. Given the tokenizer, the
    manifest holds what anonymize publishes for its files (write/manifest.public_tokenizer, the
    one decision for both); a name that cannot be checked here is flagged. Not given it, only
    none passes: a name is a claim of the model the night was tokenized for, which no row shows."""
    published = manifest["tokenizer"]
    if tokenizer is None:
        if published["name"] is not None:
            gate.flag(
                f"{MANIFEST}: tokenizer names {published['name']}, which only the run's "
                "tokenizer confirms: pass --tokenizer as the run was given"
            )
        return
    loaded = _tokenizer_here(tokenizer)
    if loaded is None and published["name"] is not None:
        gate.flag(
            f"{MANIFEST}: tokenizer.name cannot be checked: --tokenizer {tokenizer} does not "
            "load here (a folder, a pkg: package or the local hub cache)"
        )
    elif loaded is not None and public_tokenizer(tokenizer, loaded.files_sha256) != published:
        gate.flag(f"{MANIFEST}: tokenizer is not what anonymize publishes for {tokenizer}")


def _confirm_hash_scheme(c: _Confirming) -> None:
    """The scheme is the run's: given it (a vllm scheme's suffix digests the engine's NONE_HASH,
    which only the operator knows), exactly it; else only the default, keyed one. Dense ids look
    the same under every scheme, so the rows cannot tell a keyed run from an unkeyed one;
    hash_scheme_keyed says which the scheme is."""
    scheme, expected = c.manifest["hash_scheme"], c.given.hash_scheme
    if c.provenance in (CAPTURE_NIGHT, CAPTURE_MAP_NIGHT):  # its schema: the capture scheme
        return
    if c.given.capture is not None:
        c.flag(f"--capture {c.given.capture} given, but the night was read from text")
    if c.manifest["hash_scheme_keyed"] != (scheme == KEYED_SCHEME):
        c.flag("hash_scheme_keyed disagrees with hash_scheme")
    if expected is None and scheme.startswith(VLLM_SCHEME_PREFIX):
        c.flag(
            "the vllm hash scheme's suffix cannot be checked without the engine's NONE_HASH: "
            "pass --vllm-hash-seed or --vllm-none-hash as the run did"
        )
    elif expected is None and scheme != KEYED_SCHEME:
        c.flag(
            "hash_scheme is not the default (keyed) one, and the run's cannot be confirmed: "
            "pass --hash-scheme as the run was given"
        )
    elif expected is not None and scheme != expected:
        c.flag(f"hash_scheme is not {expected}")


def _confirm_template_kwargs(c: _Confirming) -> None:
    """chat_template_kwargs are the run's: given them (and the salt), exactly what anonymize
    publishes for them; else none, the default (any switch, even a boolean one, is a setting no
    row shows: 4 values for each of the known ones)."""
    published, expected = c.manifest["chat_template_kwargs"], c.given.template_kwargs
    if expected is not None:
        if published != expected:
            c.flag(
                "chat_template_kwargs are not what anonymize publishes for the kwargs given, "
                "under the salt given"
            )
    elif published:
        c.flag(
            "chat_template_kwargs the run's options alone confirm: pass --chat-template-kwargs "
            "JSON as the run was given, with its salt (--salt-file or --salt-secret)"
        )


def _confirm_settings(c: _Confirming) -> None:
    """Block size and granularity: as the run was given them (settings), else from the closed
    set of round values (SETTING_VALUES), or for timestamps the floor the published length
    granularity sets (a run's default: no choice of its own); and timestamps coarse enough to
    hide the lengths' rounding (coarsen.timing_problem, the rule anonymize refuses by), and a
    length granularity the blocks do not undo (coarsen.granularity_problem, the same)."""
    published = {"block_size": c.manifest["block_size"], **c.manifest["granularity"]}
    given = c.given.settings
    floor = timestamp_floor(published[OUTPUT_LENGTH_FIELD])
    for key, (option, usual) in SETTING_VALUES.items():
        usual = usual | {floor} if key == "timestamp_ms" else usual
        if key in given and published[key] != given[key]:
            c.flag(f"{key} is {published[key]}, the run was given {option} {given[key]}")
        elif key not in given and published[key] not in usual:
            c.flag(
                f"{key} {published[key]} is none of the round values the gate passes "
                f"unconfirmed: pass {option} as the run was given"
            )
    if too_fine := timing_problem(published["timestamp_ms"], published[OUTPUT_LENGTH_FIELD]):
        c.flag(f"coarse lengths over fine timestamps: {too_fine}; not publishable")
    if too_coarse := granularity_problem(published["block_size"], published[OUTPUT_LENGTH_FIELD]):
        c.flag(f"length granularity above the block size: {too_coarse}; not publishable")


def _confirm_model_name(c: _Confirming) -> None:
    """model_name is the publisher's claim (anonymize --model-name), which no row shows: only
    the name the audit is given, or none when it is given none."""
    published, given = c.manifest.get(MODEL_NAME), c.given.model_name
    if published == given:
        return
    if given is None:
        c.flag(
            f"{MODEL_NAME} is the run's --model-name, which no row shows: pass --model-name "
            "as the run was given"
        )
    else:
        c.flag(f"{MODEL_NAME} is not the --model-name given ({given})")


def _confirm_capture(c: _Confirming) -> None:
    """engine_capture is the run's --capture, which the rows cannot show (ids look alike
    whatever hashed them): only the format the audit is given."""
    published, given = c.manifest[CAPTURE_FIELD], c.given.capture
    if given is None:
        c.flag(f"{CAPTURE_FIELD} is the run's --capture: pass --capture as the run was given")
    elif published != capture_manifest(given):
        c.flag(f"{CAPTURE_FIELD} is not what --capture {given} publishes")


@dataclass(frozen=True)
class Confirmer:
    """What a manifest field is held against (by) and the check that holds it there."""

    by: str
    check: Callable[[_Confirming], None]


# What confirms a field: the auditing release itself; the folder's rows and files, recomputed;
# where the numbering began (the id map's record, the audited window before); or an option the
# operator gives the audit as the run was given it (its flag; without it only the run's default
# passes: none, the keyed scheme, round values).
RELEASE, ROWS, START = "the auditing release", "the rows and files", "the recorded start"
_ANY_PROVENANCE: dict[str, Confirmer] = {
    "kvtrace_version": Confirmer(RELEASE, _confirm_release),
    "format": Confirmer(RELEASE, _confirm_release),
    "files": Confirmer(ROWS, _confirm_files),
    "sha256": Confirmer(ROWS, _confirm_files),
    "replay": Confirmer(ROWS, _confirm_replay),
    OUTPUT_IDS_FIELD: Confirmer(ROWS, _confirm_output_ids),
    "records/exported": Confirmer(ROWS, _confirm_records),
    "tokenizer/name": Confirmer("--tokenizer", _confirm_tokenizer),
    "tokenizer/sha256": Confirmer("--tokenizer", _confirm_tokenizer),
    "hash_scheme": Confirmer("--hash-scheme", _confirm_hash_scheme),
    "hash_scheme_keyed": Confirmer("--hash-scheme", _confirm_hash_scheme),
    "chat_template_kwargs": Confirmer("--chat-template-kwargs", _confirm_template_kwargs),
    "block_size": Confirmer("--block-size", _confirm_settings),
    "granularity/timestamp_ms": Confirmer("--timestamp-granularity-ms", _confirm_settings),
    f"granularity/{OUTPUT_LENGTH_FIELD}": Confirmer("--length-granularity", _confirm_settings),
    MODEL_NAME: Confirmer("--model-name", _confirm_model_name),
    **{
        f"{key}/{name}": Confirmer(RELEASE, _confirm_replay_contract)
        for key, values in replay_contract().items()
        for name in values
    },
}
_ID_MAP_FIELDS = ("id_map/block_ids_from", "id_map/sessions_from", "id_map/time_from_ms")
_CAPTURE_FIELDS = dict.fromkeys(
    (f"{CAPTURE_FIELD}/format", f"{CAPTURE_FIELD}/partial_last_block"),
    Confirmer("--capture", _confirm_capture),
)
# Every field a manifest of each provenance may hold (trace_format.MANIFEST_SCHEMAS), by path,
# and its one confirmer; a field of none is refused (_confirm_manifest).
MANIFEST_CONFIRMERS: dict[str, dict[str, Confirmer]] = {
    NIGHT: {**_ANY_PROVENANCE, "id_map": Confirmer(ROWS, _confirm_own_start)},
    MAP_NIGHT: {
        **_ANY_PROVENANCE,
        **dict.fromkeys(_ID_MAP_FIELDS, Confirmer("--id-map", _confirm_recorded_start)),
        TIME_ORIGIN_FIELD: Confirmer(ROWS, _confirm_first_time),
    },
    CAPTURE_NIGHT: {
        **_ANY_PROVENANCE,
        "id_map": Confirmer(ROWS, _confirm_own_start),
        **_CAPTURE_FIELDS,
    },
    CAPTURE_MAP_NIGHT: {
        **_ANY_PROVENANCE,
        **dict.fromkeys(_ID_MAP_FIELDS, Confirmer("--id-map", _confirm_recorded_start)),
        TIME_ORIGIN_FIELD: Confirmer(ROWS, _confirm_first_time),
        **_CAPTURE_FIELDS,
    },
    STREAM_WINDOW: {
        **_ANY_PROVENANCE,
        **dict.fromkeys(_ID_MAP_FIELDS[:2], Confirmer(START, _confirm_window_start)),
        _ID_MAP_FIELDS[2]: Confirmer(ROWS, _confirm_first_time),
    },
}


def _confirm_manifest(c: _Confirming) -> None:
    """Every field of the manifest held against its one confirmer (MANIFEST_CONFIRMERS for its
    provenance), each confirmer run once; a field with none is refused, whatever the schema let
    through."""
    confirmers = MANIFEST_CONFIRMERS[c.provenance]
    for path in unconfirmed_fields(c.manifest, confirmers):
        c.flag(f"{path}: a field nothing confirms (kvtrace writes none there)")
    for check in dict.fromkeys(confirmer.check for confirmer in confirmers.values()):
        check(c)


def unconfirmed_fields(document: dict, confirmers: dict[str, Confirmer], at: str = "") -> list[str]:
    """The paths ("granularity/timestamp_ms") of a document's fields no confirmer holds: a key
    confirmed whole, or an object whose every key is."""
    paths = []
    for key, value in document.items():
        path = f"{at}{key}"
        if path in confirmers:
            continue
        if isinstance(value, dict) and value:
            paths += unconfirmed_fields(value, confirmers, f"{path}/")
        else:
            paths.append(path)
    return paths


@dataclass
class _Rows:
    """What the rows of every shard add up to, held as arrays: 32 bytes per row (time, a digest
    of its id sequence, a digest of its lengths, its session), 24 per distinct block id (tokens,
    parent); checks as they go."""

    count: int = 0
    first_timestamp: int | None = None
    complete: bool = True  # every shard's rows were read (else cross-file figures are unknown)
    parts: dict[str, list[np.ndarray]] = field(
        default_factory=lambda: {k: [] for k in ("times", "sequence", "lengths", "sessions")}
    )
    # Distinct prompt ids, sorted, with their first tokens and parents; and later shards' own
    merged: tuple[np.ndarray, ...] = field(
        default_factory=lambda: tuple(np.empty(0, np.int64) for _ in range(3))
    )
    pending: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    # Each shard's distinct output ids (all_ids: the folder's numbering end)
    output_ids: list[np.ndarray] = field(default_factory=list)
    # Each shard's (published minutes, their room), to recompute where kvtrace cuts the shards
    shard_rooms: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    # Each shard's distinct output ids with their token counts and parents (_distinct's form)
    output_links: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    fields: Counter = field(default_factory=Counter)
    largest: dict[str, int] = field(default_factory=dict)
    totals: ExportTotals = ExportTotals()
    problems: list[str] = field(default_factory=list)
    last_timestamp: int = -1
    block_size: int = 0  # the manifest's; 0 without one (no token weights then)
    # The next new id and session a night numbers (first seen, first numbered): from 0, or
    # from where the manifest says an id map's (a stream's) numbering stood (its id_map)
    next_id: int = 0
    next_session: int = 0
    started: bool = False

    def add(self, columns: TraceColumns, manifest: dict | None) -> None:
        n = len(columns)
        if n and self.first_timestamp is None:
            self.first_timestamp = int(columns.timestamp[0])
        self._check_parents(columns)
        self.count += n
        self.parts["times"].append(columns.timestamp)
        self.parts["sequence"].append(_sequence_digests(columns.ids, columns.num_ids))
        self.parts["lengths"].append(_mix(columns.input_length) ^ _mix(~columns.output_length))
        self.parts["sessions"].append(columns.session)  # every row's: a parent's is looked up
        self.shard_rooms.append(
            published_room(
                columns.timestamp,
                columns.num_ids + (0 if columns.num_output_ids is None else columns.num_output_ids),
            )
        )
        self._count_fields(columns)
        self.totals = ExportTotals(
            self.totals.requests + n,
            self.totals.input_tokens + int(columns.input_length.sum()),
            self.totals.output_tokens + int(columns.output_length.sum()),
            self.totals.blocks + int(columns.num_ids.sum()),
        )
        if manifest is not None:
            self._check(columns, manifest)
            self.block_size = manifest["block_size"]
            if manifest["id_map"] and not self.started:
                self.next_id = manifest["id_map"]["block_ids_from"]
                self.next_session = manifest["id_map"]["sessions_from"]
            self.started = True
        self._check_order(columns)
        self._merge_ids(columns)
        if columns.output_ids is not None:
            self.output_ids.append(_first_appearances(columns.output_ids))
            if self.block_size:
                self.output_links.append(self._output_links(columns))

    def _check_parents(self, columns: TraceColumns) -> None:
        """Each parent is a row before its own, in the rows' order across shards (so, the rows
        being in time order, never later in time), of the row's own session
        (trace_format.PARENT_SCOPE): write/parents.py writes no other. Called before the
        shard's rows are added."""
        if columns.parent is None:
            return
        rows = self.count + np.arange(len(columns))
        linked = columns.parent != NO_PARENT
        if (columns.parent[linked] >= rows[linked]).any():
            self.problems.append(f"{PARENT_FIELD} rows that do not precede their own")
        linked &= (columns.parent >= 0) & (columns.parent < rows)  # the rest flagged already
        scope = self._sessions_of(columns.parent[linked], columns.session)
        own = columns.session[linked]
        if ((own == NO_SESSION) | (scope != own)).any():
            self.problems.append(
                f"{PARENT_FIELD} rows outside their row's {PARENT_SCOPE}: a row's parent is "
                f"an earlier row of its own {PARENT_SCOPE}, and a row of none has none"
            )

    def _sessions_of(self, rows: np.ndarray, latest: np.ndarray) -> np.ndarray:
        """The sessions of these earlier rows (numbered across shards), each looked up in its
        shard: the shards added, then latest (the shard being added)."""
        shards = [*self.parts["sessions"], latest]
        starts = np.cumsum([0, *(len(s) for s in shards)])
        shard = np.searchsorted(starts, rows, side="right") - 1
        found = np.empty(len(rows), np.int64)
        for k in np.unique(shard):
            at = shard == k
            found[at] = shards[k][rows[at] - starts[k]]
        return found

    def _count_fields(self, columns: TraceColumns) -> None:
        n = len(columns)
        present = {
            **dict.fromkeys(ROW_FIELDS, n),
            SESSION_FIELD: int(np.count_nonzero(columns.session >= 0)),
            RESPONSE_FIELD: int(np.count_nonzero(columns.response_ms >= 0)),
            OUTPUT_IDS_FIELD: n if columns.output_ids is not None else 0,
            PARENT_FIELD: 0
            if columns.parent is None
            else int(np.count_nonzero(columns.parent != NO_PARENT)),
        }
        self.fields.update({k: v for k, v in present.items() if v})
        for key, values in (
            (TIMESTAMP_FIELD, columns.timestamp),
            (INPUT_LENGTH_FIELD, columns.input_length),
            (OUTPUT_LENGTH_FIELD, columns.output_length),
            (HASH_IDS_FIELD, columns.ids),
            (SESSION_FIELD, columns.session),
            (RESPONSE_FIELD, columns.response_ms),
            (OUTPUT_IDS_FIELD, columns.output_ids),
            (PARENT_FIELD, columns.parent),
        ):
            # Values are held to [0, 2^40) (trace_format.check_values) but for an absent
            # session or response time (-1): a field no row holds has no largest value.
            largest = int(values.max()) if values is not None and len(values) else -1
            if largest >= 0:
                self.largest[key] = max(self.largest.get(key, 0), largest)

    def _check(self, columns: TraceColumns, manifest: dict) -> None:
        """The rows as the manifest describes them: block counts by block size, values
        multiples of the granularity (input lengths coarsened within their last block beside
        coarse output lengths: write/coarsen.coarse_input_lengths), time order across shards."""
        block_size, grain = manifest["block_size"], manifest["granularity"]
        if (columns.num_ids != -(-columns.input_length // block_size)).any():
            self.problems.append(f"hash_ids counts differ from ceil(input_length / {block_size})")
        known = columns.response_ms[columns.response_ms != NO_RESPONSE_MS]
        for values, step, what in (
            (columns.timestamp, grain["timestamp_ms"], "timestamps"),
            (known, grain["timestamp_ms"], RESPONSE_FIELD),
            (columns.output_length, grain[OUTPUT_LENGTH_FIELD], "output lengths"),
        ):
            if (values % step).any():
                self.problems.append(f"{what} finer than the manifest's granularity ({step})")
        step = grain[OUTPUT_LENGTH_FIELD]
        if (
            coarse_input_lengths(columns.input_length, block_size, step) != columns.input_length
        ).any():
            self.problems.append(
                f"input lengths finer than the manifest's granularity ({step}): "
                "a session's next prompt would give each reply's length"
            )
        if step > 1 and len(known):  # write/coarsen.coarse_response_ms publishes none
            self.problems.append(
                f"{RESPONSE_FIELD} beside output lengths of granularity {step}: a response "
                "time (TTFT + tokens x TPOT) would give each reply's length"
            )
        if (manifest[OUTPUT_IDS_FIELD]) != (columns.output_ids is not None):
            self.problems.append(f"{OUTPUT_IDS_FIELD} present where the manifest says otherwise")
        elif columns.output_ids is not None:  # the full blocks decoding adds, or none known
            decoded = np.maximum(
                0,
                (columns.input_length + columns.output_length) // block_size
                - columns.input_length // block_size,
            )
            if ((columns.num_output_ids != decoded) & (columns.num_output_ids != 0)).any():
                self.problems.append(f"{OUTPUT_IDS_FIELD} counts that decoding does not give")
        if (columns.session < NO_SESSION).any() or (columns.response_ms < NO_RESPONSE_MS).any():
            self.problems.append("negative sessions or response times")
        self._check_gaps(columns.timestamp, grain["timestamp_ms"])
        if CAPTURE_FIELD in manifest:
            self._check_captured(columns, manifest[CAPTURE_FIELD]["format"])

    def _check_captured(self, columns: TraceColumns, capture: str) -> None:
        """A capture night's rows hold only the fields its format gives (trace_format.
        CAPTURE_ROW_FIELDS, the table its reader builds rows from): every other field none,
        an output length 0."""
        given = CAPTURE_ROW_FIELDS[capture]  # the manifest's schema names only these formats
        held = {
            OUTPUT_LENGTH_FIELD: bool(columns.output_length.any()),
            SESSION_FIELD: bool((columns.session != NO_SESSION).any()),
            RESPONSE_FIELD: columns.has_response,
            PARENT_FIELD: columns.has_parent,
        }
        extra = [name for name in CAPTURED_FIELDS if held[name] and name not in given]
        if extra:
            self.problems.append(
                f"{', '.join(extra)} in rows of {capture} captures: the format logs none "
                f"(a capture night publishes only what its format gives)"
            )

    def _check_gaps(self, times: np.ndarray, granule_ms: int) -> None:
        """No row a gap over the batch rule's (read/timestamps.MAX_GAP_DAYS) from the row before
        it, across shards and a stream's windows (last_timestamp): the reader letters such a
        request `implausible_timestamp` (a clock reset, another clock) and no night, map night,
        capture night or stream window publishes it. Only gaps wider than any two rows the
        rule keeps can have once rounded to the granule (read/timestamps.widest_kept_gap_ms)
        are flagged: a shorter one may lie within the rule's days, which the zero's epoch
        (never published) decides. Rows out of order are flagged by _check_order."""
        before = [self.last_timestamp] if self.last_timestamp >= 0 else []
        widest = int(np.diff(np.concatenate([np.array(before, np.int64), times])).max(initial=0))
        if widest > widest_kept_gap_ms(granule_ms):
            self.problems.append(
                f"rows {widest // DAY_MS} days apart, over the {MAX_GAP_DAYS} days the batch "
                f"job allows between requests: a clock gone wrong was published"
            )

    def _check_order(self, columns: TraceColumns) -> None:
        """What numbering in first-seen order gives, checked in the rows' own order: rows in
        time order; a night's new block ids (each row's prompt blocks, then its output blocks:
        dense_ids.block_keys) and sessions first appear as 0, 1, 2, ..."""
        if len(columns):
            if (
                not in_published_order(
                    columns.timestamp, columns.input_length, columns.output_length
                )
                or columns.timestamp[0] < self.last_timestamp
            ):
                self.problems.append("rows out of time order")
            self.last_timestamp = int(columns.timestamp[-1])
        sessions = columns.session[columns.session != NO_SESSION]
        for kind, values, expected in (
            ("block ids", _blocks_first_seen(columns), self.next_id),
            ("sessions", sessions, self.next_session),
        ):
            new = _first_appearances(values[values >= expected])
            if not np.array_equal(new, np.arange(expected, expected + len(new))):
                self.problems.append(
                    f"{kind} not numbered in first-seen order (dense from the night's first)"
                )
            if kind == "sessions":
                self.next_session = expected + len(new)
            else:
                self.next_id = expected + len(new)

    def _output_links(self, columns: TraceColumns) -> tuple[np.ndarray, ...]:
        """Each distinct output id with its parent: output blocks continue the chain of prompt +
        output past the prompt's full blocks, so the first one follows the prompt's last full
        block (none: the prompt has no full block) and each later one the output block before
        it; every one is a full block."""
        ids, counts = columns.output_ids, columns.num_output_ids
        position = np.arange(len(ids)) - np.repeat(np.cumsum(counts) - counts, counts)
        full = columns.input_length // self.block_size
        last_full = np.cumsum(columns.num_ids) - columns.num_ids + full - 1
        # Clipped: rows of other block counts are flagged already (_check), never an IndexError
        prompt_parent = np.where(
            full > 0,
            columns.ids[np.clip(last_full, 0, len(columns.ids) - 1)] if len(columns.ids) else -1,
            -1,
        )
        parent = np.where(position == 0, np.repeat(prompt_parent, counts), np.roll(ids, 1))
        return self._distinct(ids, np.full(len(ids), self.block_size), parent)

    def check_output_chains(self) -> None:
        """An output id that is also a prompt id (a later turn reusing the blocks) stands for
        the same prefix: one parent, and a full block, wherever it appears."""
        if self.output_links:
            self._merge()
            self._distinct(
                *(
                    np.concatenate([self.merged[i], *(o[i] for o in self.output_links)])
                    for i in range(3)
                )
            )

    def _merge_ids(self, columns: TraceColumns) -> None:
        """Each distinct prompt block id with its tokens at its first occurrence and the id
        before it in its row, folded in: with chained hashes an id stands for its whole prefix,
        so it has one parent wherever it appears."""
        if not len(columns.ids):
            return
        starts = np.repeat(np.cumsum(columns.num_ids) - columns.num_ids, columns.num_ids)
        position = np.arange(len(columns.ids)) - starts
        size = self.block_size
        weight = np.minimum(
            size, np.repeat(columns.input_length, columns.num_ids) - position * size
        )
        parent = np.where(position == 0, -1, np.roll(columns.ids, 1))
        self.pending.append(self._distinct(columns.ids, weight, parent))
        if sum(len(p[0]) for p in self.pending) >= max(MERGE_AT_LEAST, len(self.merged[0])):
            self._merge()

    def _distinct(
        self, ids: np.ndarray, weights: np.ndarray, parents: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each id once, with its weight and parent; an id behind two parents, or of two token
        counts (its block's tokens are part of what it stands for), flagged."""
        order = np.argsort(ids, kind="stable")  # earlier shards first among equal ids
        ids, parents, weights = ids[order], parents[order], weights[order]
        first = np.ones(len(ids), bool)
        first[1:] = ids[1:] != ids[:-1]
        group = np.cumsum(first) - 1
        if (parents != parents[first][group]).any():
            self.problems.append("a block id behind two different parents: not chained hashes")
        if (weights != weights[first][group]).any():
            self.problems.append("a block id of two different token counts: not one block")
        return ids[first], weights[first], parents[first]

    def _merge(self) -> None:
        parts = [self.merged, *self.pending]
        self.merged = self._distinct(*(np.concatenate([p[i] for p in parts]) for i in range(3)))
        self.pending = []

    @property
    def ids(self) -> np.ndarray:
        """Every distinct prompt block id, sorted."""
        if self.pending:
            self._merge()
        return self.merged[0]

    @property
    def weights(self) -> np.ndarray:
        """The tokens of each distinct id's first occurrence, in ids' order."""
        if self.pending:
            self._merge()
        return self.merged[1]

    def stats(self) -> dict:
        return export_stats(self.totals, len(self.ids), int(self.weights.sum()))

    def all_ids(self) -> np.ndarray:
        """Every distinct block id the rows hold, prompt and output, sorted."""
        if not self.output_ids:
            return self.ids
        return _sorted_unique(np.concatenate([self.ids, *self.output_ids]))

    def sessions(self) -> np.ndarray:
        sessions = self.column("sessions")
        return _sorted_unique(sessions[sessions != NO_SESSION])

    def column(self, key: str) -> np.ndarray:
        parts = self.parts[key]
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def report(self, names: list[str], ids: dict) -> dict:
        sessions = self.column("sessions")
        sessions = np.sort(sessions[sessions != NO_SESSION])
        per_session = np.diff(np.flatnonzero(np.diff(sessions, prepend=-2, append=-2)))
        return {
            "rows": self.count,
            "files": names,
            "fields": dict(self.fields),
            "largest_integers": self.largest,
            HASH_IDS_FIELD: ids,
            "timestamps": _timestamp_report(self.column("times")),
            "singled_out": {}
            if not self.count
            else {
                "unique_id_sequence": _unique_share(self.column("sequence")),
                "unique_lengths": _unique_share(self.column("lengths")),
            },
            "sessions": {
                "sessions": int(len(per_session)),
                "rows_with_session": int(len(sessions)),
                "max_rows_per_session": int(per_session.max(initial=0)),
            },
        }


def id_report(ids: np.ndarray) -> dict:
    if not len(ids):
        return {"distinct": 0, "max": None, "dense": True}
    return {
        "distinct": int(len(ids)),
        "max": int(ids[-1]),
        "dense": bool(ids[0] == 0 and ids[-1] == len(ids) - 1),
    }


def _mix(values: np.ndarray) -> np.ndarray:
    """A 64-bit mix of each value (splitmix64's finalizer): equal values, equal digests; others
    collide with chance 2^-64."""
    z = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _sequence_digests(ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """One digest per row of its whole id sequence (ids and their positions), without a
    Python call per row: the sum of each block's mixed (id, position), and the count."""
    if not len(counts):
        return np.empty(0, np.uint64)
    ends = np.cumsum(counts)
    position = np.arange(len(ids)) - np.repeat(ends - counts, counts)
    mixed = _mix(_mix(ids) ^ position.astype(np.uint64))
    sums = np.concatenate([[np.uint64(0)], np.cumsum(mixed, dtype=np.uint64)])
    with np.errstate(over="ignore"):
        return (sums[ends] - sums[ends - counts]) ^ _mix(counts)


def first_seen_order(columns: TraceColumns) -> np.ndarray:
    """Where each of the rows' block ids (hash_ids, then output_hash_ids when published,
    concatenated) comes in the order kvtrace sees them: row by row, its prompt's ids then its
    output's (dense_ids.block_keys)."""
    rows = np.arange(len(columns))
    owner = np.repeat(rows, columns.num_ids)
    if columns.output_ids is not None:
        owner = np.concatenate([owner, np.repeat(rows, columns.num_output_ids)])
    return np.argsort(owner, kind="stable")  # within a row: prompt ids came first


def _blocks_first_seen(columns: TraceColumns) -> np.ndarray:
    """Every block id of the rows in first_seen_order."""
    if columns.output_ids is None:
        return columns.ids
    return np.concatenate([columns.ids, columns.output_ids])[first_seen_order(columns)]


def _first_appearances(values: np.ndarray) -> np.ndarray:
    """The distinct values in the order they first appear."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    first = np.ones(len(values), bool)
    first[1:] = ordered[1:] != ordered[:-1]
    return values[np.sort(order[first])]


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """Distinct values, sorted (a sort: faster than numpy's hashing unique on int64)."""
    values = np.sort(values)
    keep = np.ones(len(values), bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]


def _unique_share(values: np.ndarray) -> float:
    """The share of values that occur once."""
    values = np.sort(values)
    differs = values[1:] != values[:-1]
    alone_left = np.concatenate([[True], differs])
    alone_right = np.concatenate([differs, [True]])
    return float(np.count_nonzero(alone_left & alone_right) / len(values))


def _timestamp_report(values: np.ndarray) -> dict:
    """The precision the timestamps carry (the largest step every one is a multiple of) and the
    spacing of requests (the median gap), which together say what rounding would hide."""
    if not len(values):
        return {"granularity_ms": None}
    gaps = np.diff(np.sort(values))
    positive = gaps[gaps > 0]
    return {
        "granularity_ms": int(np.gcd.reduce(values)) if values.any() else None,
        "smallest_gap_ms": int(positive.min()) if len(positive) else None,
        "median_gap_ms": float(np.median(gaps)) if len(gaps) else None,
        "distinct": int(len(positive)) + 1,
    }


def report_text(report: dict, where: str) -> str:
    """The report for a person: each figure, what it means, what the publisher can do. Every
    line is shown through one escaping (_shown), so nothing the folder named (a file, a
    subfolder, a row's field) reaches the terminal as anything but one line of printable text."""
    lines = [*_report_lines(report, where), *_unseen_lines(), _verdict(report)]
    return "\n".join(_shown(line) for line in lines)


def _shown(line: str) -> str:
    """A line as printable text, whatever names it quotes: as letters show names
    (dead_letters.shown_name: one printable text per text, a line break or an escape as the
    \\u escape of its code point)."""
    return shown_name(line)


# The kernel lists trusted.* extended attributes only to a process holding CAP_SYS_ADMIN
# (linux/capability.h: 21) in the initial user namespace (capable(), not ns_capable()): not to a
# user, nor to root in a container without the capability or in a user namespace of its own.
CAP_SYS_ADMIN = 21
INITIAL_USER_NAMESPACE = "user:[4026531837]"  # /proc/self/ns/user there (PROC_USER_INIT_INO)
TRUSTED_ATTRIBUTES_UNSEEN = (
    "trusted.* extended attributes: the kernel lists them only to root (CAP_SYS_ADMIN), and "
    "a copy made as root (sudo cp -a, rsync -X, tar --xattrs) may carry some unseen here: "
    "publish an archive made without extended attributes (docs/AUDIT.md)"
)


def unseen_channels() -> list[str]:
    """What a copy may carry that this process cannot read: the gate claims nothing of it."""
    return [] if _lists_trusted_attributes() else [TRUSTED_ATTRIBUTES_UNSEEN]


def _lists_trusted_attributes() -> bool:
    try:
        with open("/proc/self/status") as status:
            effective = next(line for line in status if line.startswith("CapEff:"))
        held = int(effective.split()[1], 16) >> CAP_SYS_ADMIN & 1
        return bool(held) and os.readlink("/proc/self/ns/user") == INITIAL_USER_NAMESPACE
    except (OSError, StopIteration, ValueError, IndexError):  # no procfs: nothing vouches
        return False


def _unseen_lines() -> list[str]:
    return [f"  NOT CHECKED {channel}" for channel in unseen_channels()]


def _verdict(report: dict) -> str:
    if "windows" in report:
        verdict = "publishable" if report["publishable"] else "NOT publishable"
        return f"stream verdict: {verdict} ({len(report['windows'])} window(s) audited in order)"
    return (
        "verdict: publishable: exactly what kvtrace publishes, nothing flagged"
        if report["publishable"]
        else f"verdict: NOT publishable: {len(report['flags'])} problem(s) flagged above"
    )


def _report_lines(report: dict, where: str) -> list[str]:
    """The report's lines before its verdict, as the audit found them (unescaped)."""
    if "windows" in report:  # a stream: each window's report, then the stream's own flags
        lines = [
            line
            for name, window in report["windows"].items()
            for line in [*_report_lines(window, f"{where.rstrip('/')}/{name}"), _verdict(window)]
        ]
        return lines + [f"  FLAG {flag}" for flag in report["flags"]]
    ts, single, sessions = report["timestamps"], report["singled_out"], report["sessions"]
    lines = [
        f"{where}: {report['rows']:,} rows (each counted once) in {', '.join(report['files'])}",
        f"  fields present: {', '.join(f'{k} ({v:,} rows)' for k, v in report['fields'].items())}",
        f"  largest integers: {', '.join(f'{k} {v:,}' for k, v in report['largest_integers'].items())}"
        " (counts and dense ids stay small; token ids or hashes would not)",
        f"  hash ids: {report[HASH_IDS_FIELD]['distinct']:,} distinct, "
        f"{'dense from 0' if report[HASH_IDS_FIELD]['dense'] else 'not dense from 0'}",
    ]
    if ts.get("granularity_ms") is not None:
        lines.append(
            f"  timestamps: every one a multiple of {ts['granularity_ms']:,} ms; requests "
            f"{_ms(ts.get('median_gap_ms'))} apart at the median, {_ms(ts.get('smallest_gap_ms'))} "
            f"at the closest. To publish coarser timing: anonymize "
            f"--timestamp-granularity-ms N"
        )
    if single:
        lines.append(
            f"  rows unique in the trace: {single['unique_id_sequence']:.1%} by their id sequence, "
            f"{single['unique_lengths']:.1%} by their (input, output) lengths. Expected for "
            f"prefix traces and no text is exposed; it matters only to someone who already knows "
            f"a request's token count or block structure and wants to find its row. To blur "
            f"lengths: --length-granularity N (output lengths, input lengths within their last "
            f"block)"
        )
    lines.append(
        f"  sessions: {sessions['sessions']:,} ({sessions['rows_with_session']:,} rows, at "
        f"most {sessions['max_rows_per_session']:,} per session)"
        + (
            ": they link a user's turns; leave session ids out of the logs to publish none"
            if sessions["sessions"]
            else ""
        )
    )
    if report["manifest"]:
        m = report["manifest"]
        lines.append(
            f"  manifest: hash scheme {m['hash_scheme']}"
            f"{'' if m.get('hash_scheme_keyed', True) else ' (unkeyed)'}, granularity "
            f"{_granularity(m.get('granularity'))}"
        )
    return lines + [f"  FLAG {flag}" for flag in report["flags"]]


def _granularity(steps: object) -> str:
    """The manifest's rounding steps as a reader says them: `timestamps 1 ms, output lengths 1`."""
    if not isinstance(steps, dict) or not steps:
        return "not stated"
    said = {"timestamp_ms": "timestamps {:,} ms", OUTPUT_LENGTH_FIELD: "output lengths {:,}"}
    return ", ".join(
        said.get(field, f"{field} {{:,}}").format(step)
        if isinstance(step, int)
        else f"{field} {step!r}"
        for field, step in sorted(steps.items(), key=lambda item: item[0] != "timestamp_ms")
    )


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:,.1f} s" if value >= 1000 else f"{value:,.0f} ms"
