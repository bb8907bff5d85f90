"""The measured file: per published row, the prompt tokens the serving engine reported cached.

A private figure (it tells, per request, how much of its prompt other requests shared): never
a trace column. `anonymize` stages one part per trace shard that holds a row with a count,
beside its dead letters; when the run's output is published they are joined into one file,
DEAD/measured-RUNID.jsonl (owner-only, beside rejected-RUNID.jsonl; write/publish.py). One JSON
object a line, `{"shard": S, "row": R, "cached_tokens": N}`: R the row's index in the trace
shard numbered S. Written and read here only, so the form is declared once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import numpy as np

from kvtrace.transforms.errors import ConfigError
from kvtrace.transforms.storage import open_read
from kvtrace.transforms.trace_format import MAX_INPUT_LENGTH

NOT_MEASURED = -1  # a row whose log carried no cached-token count
FIELDS = ("shard", "row", "cached_tokens")
MAX_LINE_BYTES = 96  # {"shard": 2^63, "row": 2^63, "cached_tokens": 2^31} and the line's end
MEASURED_PART = re.compile(r"measured-\d{5}\.jsonl", re.ASCII)


def measured_part(shard: int) -> str:
    """A shard's part, staged beside the run's letters until the run is published."""
    return f"measured-{shard:05d}.jsonl"


def measured_file(run_id: str) -> str:
    """A published run's measured file, in its dead-letter folder."""
    return f"measured-{run_id}.jsonl"


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


def read_measured(path: str, shard_rows: Sequence[int]) -> np.ndarray:
    """Per row of a trace whose shards hold shard_rows rows (in order), its measured count or
    NOT_MEASURED; raises ConfigError naming the line of anything else."""
    offsets = np.concatenate(([0], np.cumsum(shard_rows, dtype=np.int64)))
    measured = np.full(int(offsets[-1]), NOT_MEASURED, dtype=np.int64)
    try:
        stream = open_read(path)
    except OSError as err:
        raise ConfigError(f"--measured {path}: {err.strerror or err}") from None
    with stream:
        for number, line in enumerate(iter(lambda: stream.readline(MAX_LINE_BYTES + 1), b""), 1):
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
