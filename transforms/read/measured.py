"""The measured file: per published row, the prompt tokens the serving engine reported cached.

A private figure (it tells, per request, how much of a prompt another request shared): it is
never a trace column. One JSON object a line, `{"row": R, "cached_tokens": N}`, R the row's
index in the trace as read (its files in order, their lines in order), only for the rows whose
log carried a count; written and read here only, so its form is declared once.
"""

from __future__ import annotations

import json

import numpy as np

from kvtrace.transforms.errors import ConfigError
from kvtrace.transforms.storage import open_read
from kvtrace.transforms.trace_format import MAX_INPUT_LENGTH

NOT_MEASURED = -1  # a row whose log carried no cached-token count
FIELDS = ("row", "cached_tokens")
MAX_LINE_BYTES = 64  # {"row": 2^63, "cached_tokens": 2^31} and the line's end fit


def measured_line(row: int, cached_tokens: int) -> bytes:
    return json.dumps(dict(zip(FIELDS, (row, cached_tokens))), separators=(",", ":")).encode() + (
        b"\n"
    )


def read_measured(path: str, rows: int) -> np.ndarray:
    """Per row of a trace of `rows` rows (file order), its measured count or NOT_MEASURED;
    raises ConfigError naming the line of anything else."""
    measured = np.full(rows, NOT_MEASURED, dtype=np.int64)
    with open_read(path) as stream:
        for number, line in enumerate(iter(lambda: stream.readline(MAX_LINE_BYTES + 1), b""), 1):
            row, tokens = _entry(line, f"--measured {path} line {number}")
            if row >= rows:
                raise ConfigError(
                    f"--measured {path} line {number}: row {row}, but the trace has {rows} rows "
                    "(a measured file belongs to the trace its anonymize run published)"
                )
            if measured[row] != NOT_MEASURED:
                raise ConfigError(f"--measured {path} line {number}: row {row} given twice")
            measured[row] = tokens
    return measured


def _entry(line: bytes, where: str) -> tuple[int, int]:
    if len(line) > MAX_LINE_BYTES:
        raise ConfigError(f"{where}: longer than {MAX_LINE_BYTES} bytes")
    try:
        entry = json.loads(line)
    except ValueError:
        raise ConfigError(f"{where}: not JSON") from None
    if not isinstance(entry, dict) or sorted(entry) != sorted(FIELDS):
        raise ConfigError(f"{where}: not an object of exactly {', '.join(FIELDS)}")
    row, tokens = (entry[name] for name in FIELDS)
    if type(row) is not int or not 0 <= row < 2**63:
        raise ConfigError(f"{where}: row is not a row index")
    if type(tokens) is not int or not 0 <= tokens <= MAX_INPUT_LENGTH:
        raise ConfigError(f"{where}: cached_tokens is not a count in [0, {MAX_INPUT_LENGTH}]")
    return row, tokens
