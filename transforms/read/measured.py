"""The measured file: per published row, the prompt tokens the serving engine reported cached.

A private figure (it tells, per request, how much of its prompt other requests shared): never
a trace column. `anonymize` stages one part per trace shard that holds a row with a count,
beside its dead letters; once the output and its manifest are staged, and before anything is
published, they are joined into one file there (join_measured), which publishing the run's
letters renames to DEAD/measured-RUNID.jsonl (owner-only, beside rejected-RUNID.jsonl;
write/publish.py): from the publication on, settling the letters writes nothing.

Its first line names the trace its rows belong to, `{"manifest_sha256": H}`: H the sha256 of
the output's manifest.json, which lists every file's sha256, so it names that one output (its
rows, its stats.json) and not another with the same shards and rows. Then one JSON object a
line, `{"shard": S, "row": R, "cached_tokens": N}`: R the row's index in the trace shard
numbered S. Written and read here only, so the form is declared once. Its totals are its
output's `measured` aggregate, where stats.json publishes one (check_totals).
"""

from __future__ import annotations

import json
import posixpath
import re
import shutil
from collections.abc import Sequence

import numpy as np

from kvtrace.transforms import storage
from kvtrace.transforms.errors import ConfigError
from kvtrace.transforms.read.paths import open_raw
from kvtrace.transforms.read.trace_inputs import pin_of
from kvtrace.transforms.storage import open_read
from kvtrace.transforms.trace_format import MAX_INPUT_LENGTH, TRACE_FILE

NOT_MEASURED = -1  # a row whose log carried no cached-token count
FIELDS = ("shard", "row", "cached_tokens")
MAX_LINE_BYTES = 96  # {"shard": 2^63, "row": 2^63, "cached_tokens": 2^31} and the line's end
MEASURED_PART = re.compile(r"measured-\d{5}\.jsonl", re.ASCII)
HEADER = "manifest_sha256"  # the first line's one field: the trace's manifest.json sha256
# The joined file in the letters' staging, which the letters' publication renames as it is.
MEASURED_STAGED = "measured.jsonl"
_DIGEST = re.compile(r"[0-9a-f]{64}", re.ASCII)


def measured_part(shard: int) -> str:
    """A shard's part, staged beside the run's letters until the run is published."""
    return f"measured-{shard:05d}.jsonl"


def measured_file(run_id: str) -> str:
    """A published run's measured file, in its dead-letter folder."""
    return f"measured-{run_id}.jsonl"


def join_measured(staging: str, manifest_sha256: str) -> str | None:
    """The run's parts in its letters' staging, in shard order, joined there under
    MEASURED_STAGED after the header naming the trace's manifest; the parts removed. Run while
    the output is still staged (a full disk here fails the run before it publishes anything).
    Returns the joined file; None without any part."""
    parts = [n for n in storage.files_in(staging) if MEASURED_PART.fullmatch(n)]
    if not parts:
        return None
    joined = storage.join(staging, MEASURED_STAGED)
    with storage.create(joined, private=True) as out:
        out.write(json.dumps({HEADER: manifest_sha256}).encode() + b"\n")
        for name in parts:  # files_in sorts: shard order
            with open_read(storage.join(staging, name)) as part:
                shutil.copyfileobj(part, out)
    storage.delete([storage.join(staging, name) for name in parts])
    return joined


def measured_bytes(shard: int, cached_tokens: np.ndarray) -> bytes | None:
    """A shard's part for its rows' counts in published order (NOT_MEASURED where none); None
    when no row has one."""
    rows = np.flatnonzero(cached_tokens != NOT_MEASURED)
    if not len(rows):
        return None
    return b"".join(
        json.dumps(dict(zip(FIELDS, (shard, int(row), int(cached_tokens[row]))))).encode() + b"\n"
        for row in rows
    )


def trace_manifest(path: str, files: Sequence[str]) -> str:
    """The sha256 of the manifest of the output whose shards files are, read whole and in shard
    order: a measured file's rows are keyed by that output's shards. ConfigError (naming path,
    the measured file) for files that are not one whole output's."""
    pins = [pin_of(f) for f in files]
    shards = [TRACE_FILE.fullmatch(posixpath.basename(f)) for f in files]
    output = pins[0] if pins else None
    if output is None or any(
        pin is not output or shard is None or (int(shard[1]), int(shard[2])) != (i, len(files))
        for i, (pin, shard) in enumerate(zip(pins, shards))
    ):
        raise ConfigError(
            f"--measured {path}: its counts are keyed to the rows of the output folder its run "
            f"published: give that folder (every shard of it) as the trace"
        )
    return output.manifest_sha256


def read_measured(path: str, shard_rows: Sequence[int], manifest_sha256: str) -> np.ndarray:
    """Per row of a trace whose shards hold shard_rows rows (in order), its measured count or
    NOT_MEASURED; raises ConfigError naming the line of anything else, and in one line a file
    whose header names another trace than the one whose manifest has manifest_sha256."""
    offsets = np.concatenate(([0], np.cumsum(shard_rows, dtype=np.int64)))
    measured = np.full(int(offsets[-1]), NOT_MEASURED, dtype=np.int64)
    try:
        stream = open_raw(path)  # a FIFO named as the file is refused, not waited on
    except storage.UnfitFile as err:
        raise ConfigError(f"--measured {err}") from None
    except OSError as err:
        raise ConfigError(f"--measured {path}: {err.strerror or err}") from None
    with stream:
        _check_header(stream.readline(MAX_LINE_BYTES + 1), path, manifest_sha256)
        for number, line in enumerate(iter(lambda: stream.readline(MAX_LINE_BYTES + 1), b""), 2):
            where = f"--measured {path} line {number}"
            shard, row, tokens = _entry(line, where)
            if shard >= len(shard_rows) or row >= shard_rows[shard]:
                raise ConfigError(
                    f"{where}: shard {shard} row {row} is not a row of these "
                    f"{len(shard_rows)} trace file(s) (give the output folder its run published)"
                )
            if measured[offsets[shard] + row] != NOT_MEASURED:
                raise ConfigError(f"{where}: shard {shard} row {row} given twice")
            measured[offsets[shard] + row] = tokens
    return measured


def check_totals(
    path: str,
    measured: np.ndarray,
    input_length: np.ndarray,
    published: tuple[int, int, int] | None,
) -> None:
    """A measured file (measured: per row in file order, input_length its rows' published
    lengths) holds the counts its output published (published: stats.json's measured requests,
    cached tokens and their prompt tokens), when it published them: a copy cut at a line's end,
    or with a line dropped or altered, still reads line by line, but not to the same totals.
    ConfigError in one line. Under MIN_MEASURED_REQUESTS no aggregate is published, and nothing
    tells a cut file from a whole one."""
    if published is None:
        return
    rows = measured != NOT_MEASURED
    counts = (int(rows.sum()), int(measured[rows].sum()), int(input_length[rows].sum()))
    if counts != published:
        raise ConfigError(
            f"--measured {path} holds {_said(counts)}, its output's stats.json "
            f"{_said(published)}: a copy cut short or altered; give the file its run wrote"
        )


def _said(counts: tuple[int, int, int]) -> str:
    requests, cached, inputs = counts
    return f"{requests:,} requests with {cached:,} of {inputs:,} prompt tokens cached"


def _check_header(line: bytes, path: str, manifest_sha256: str) -> None:
    where = f"--measured {path} line 1"
    if len(line) > MAX_LINE_BYTES:
        raise ConfigError(f"{where}: longer than {MAX_LINE_BYTES} bytes")
    try:
        header = json.loads(line)
    except ValueError:
        raise ConfigError(f"{where}: not JSON") from None
    named = header.get(HEADER) if isinstance(header, dict) and len(header) == 1 else None
    if not isinstance(named, str) or not _DIGEST.fullmatch(named):
        raise ConfigError(f'{where}: not the header {{"{HEADER}": SHA256}} kvtrace writes')
    if named != manifest_sha256:
        raise ConfigError(
            f"--measured {path} is the measured file of another output (its manifest's sha256 "
            f"{named[:12]}..., this trace's {manifest_sha256[:12]}...): give the measured file "
            f"of the run that published this trace"
        )


def _entry(line: bytes, where: str) -> tuple[int, int, int]:
    if len(line) > MAX_LINE_BYTES:
        raise ConfigError(f"{where}: longer than {MAX_LINE_BYTES} bytes")
    try:
        entry = json.loads(line)
    except ValueError:
        raise ConfigError(f"{where}: not JSON") from None
    if not isinstance(entry, dict) or sorted(entry) != sorted(FIELDS):
        raise ConfigError(f"{where}: not an object of exactly {', '.join(FIELDS)}")
    shard, row, tokens = (entry[name] for name in FIELDS)
    for name, index in (("shard", shard), ("row", row)):
        if type(index) is not int or not 0 <= index < 2**63:
            raise ConfigError(f"{where}: {name} is not an index")
    if type(tokens) is not int or not 0 <= tokens <= MAX_INPUT_LENGTH:
        raise ConfigError(f"{where}: cached_tokens is not a count in [0, {MAX_INPUT_LENGTH}]")
    return shard, row, tokens
