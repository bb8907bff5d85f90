"""An external sort of lines: lines held up to a bound, sorted and written as runs (files of
sorted lines), then merged into one sorted file holding one line of each open run at a time.
Dead letters are sorted so (dead_letters.py), and the halves of OpenAI Batch files are brought
together so (read/batch_join.py). A line is bytes ending in a newline and holding no other."""

from __future__ import annotations

import contextlib
import heapq
import uuid
from collections.abc import Iterable

from kvtrace.transforms import storage

# Runs merged at most this many at once (each an open file); more are merged in passes.
MERGE_FAN_IN = 64


def write_run(folder: str, lines: list[bytes], prefix: str = "run") -> str:
    """The lines, sorted, as a new private file in folder; returns its path."""
    lines.sort()
    path = storage.join(folder, f"{prefix}-{uuid.uuid4().hex}.jsonl")  # no other bundle's name
    with storage.create(path, private=True) as run:
        run.writelines(lines)
    return path


def merge_files(
    runs: Iterable[str], path: str, held: Iterable[bytes] = (), fan_in: int = MERGE_FAN_IN
) -> str:
    """One sorted file at path of every line of the runs and of held (sorted, in memory), at
    most fan_in runs open at once (more are merged in passes, beside path). The runs are
    removed once merged. Made even when there are none; returns path."""
    folder = path.rsplit("/", 1)[0] if "/" in path else "."  # a URL's or a local path's
    runs = list(runs)
    while len(runs) > fan_in:
        runs = runs[fan_in:] + [_merge(runs[:fan_in], storage.join(folder, _run_name()))]
    return _merge(runs, path, held)


def _merge(runs: list[str], path: str, held: Iterable[bytes] = ()) -> str:
    with contextlib.ExitStack() as stack:
        opened = [stack.enter_context(storage.open_read(run)) for run in runs]
        with storage.create(path, private=True) as merged:
            merged.writelines(heapq.merge(*opened, held))
    if runs:
        storage.delete(runs)
    return path


def _run_name() -> str:
    return f"run-{uuid.uuid4().hex}.jsonl"
