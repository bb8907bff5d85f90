"""Dead-letter records: a rejected record, where it came from, and why; written to a file as
they come (a run may reject every record of its input, and each keeps its whole record so that
its provider can repair it), counted in memory."""

from __future__ import annotations

import contextlib
import heapq
import json
import shutil
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO

from transforms import storage

DEAD_LETTER_TAG = "rejected"
DAMAGED_FILE = "damaged_file"  # the reason of a file that breaks off, rather than of a record
COPY_CHUNK_BYTES = 1 << 20
# Beam's letters: held this much at most to be sorted before written as a run; runs merged at
# most this many at once (each an open file).
SORT_RUN_BYTES = 16 << 20
MERGE_FAN_IN = 64


@dataclass(frozen=True)
class DeadLetter:
    source: str
    line: bytes
    reason: str
    message: str
    # Input bytes that could not become records (a damaged file's cut record or unreadable
    # rest): --max-rejected-fraction weighs them as well as the count of records.
    lost_bytes: int = 0

    def to_json(self) -> str:
        # Undecodable bytes stay visible as \xNN escapes, so the line can be found and fixed.
        return json.dumps(
            {
                "source": self.source,
                "error": self.reason,
                "message": self.message,
                "line": self.line.decode("utf-8", errors="backslashreplace"),
                **({"lost_bytes": self.lost_bytes} if self.lost_bytes else {}),
            },
            ensure_ascii=False,
        )



@dataclass(frozen=True)
class Tally:
    """What a run keeps in memory of its dead letters, however many: counts, the input bytes
    they lost, and how many of each reason."""

    count: int = 0
    lost_bytes: int = 0
    reasons: tuple[tuple[str, int], ...] = ()  # (reason, count), sorted

    @classmethod
    def of(cls, letters: Iterable[DeadLetter]) -> Tally:
        reasons: Counter[str] = Counter()
        count = lost = 0
        for letter in letters:
            count, lost = count + 1, lost + letter.lost_bytes
            reasons[letter.reason] += 1
        return cls(count, lost, tuple(sorted(reasons.items())))

    def __add__(self, other: Tally) -> Tally:
        reasons = Counter(dict(self.reasons)) + Counter(dict(other.reasons))
        return Tally(self.count + other.count, self.lost_bytes + other.lost_bytes,
                     tuple(sorted(reasons.items())))

    def of_reason(self, reason: str) -> int:
        return dict(self.reasons).get(reason, 0)


class _Counting:
    """The tally of the letters seen so far."""

    def __init__(self) -> None:
        self._reasons: Counter[str] = Counter()
        self._count = self._lost = 0

    def _count_in(self, letter: DeadLetter) -> bytes:
        """Counts the letter in; returns its line."""
        self._count, self._lost = self._count + 1, self._lost + letter.lost_bytes
        self._reasons[letter.reason] += 1
        return letter.to_json().encode() + b"\n"

    @property
    def tally(self) -> Tally:
        return Tally(self._count, self._lost, tuple(sorted(self._reasons.items())))


class LetterFile(_Counting):
    """Dead letters written to a file as they come, one JSON line each, so holding them costs
    one letter whatever their count; the file is made at the first letter (none: no file).
    `tally` counts what was written."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self._handle: IO[bytes] | None = None

    def add(self, letter: DeadLetter) -> None:
        line = self._count_in(letter)
        if self._handle is None:
            self._handle = storage.create(self.path, private=True)  # they hold raw prompts
        self._handle.write(line)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()

    def __enter__(self) -> LetterFile:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


@dataclass(frozen=True)
class StagedLetters:
    """Dead letters already written, in files to be joined in this order, and their tally."""

    files: tuple[str, ...] = ()
    tally: Tally = Tally()

    def __add__(self, other: StagedLetters) -> StagedLetters:
        return StagedLetters(self.files + other.files, self.tally + other.tally)

    @classmethod
    def of(cls, written: LetterFile) -> StagedLetters:
        return cls((written.path,) if written.tally.count else (), written.tally)


def join_letters(path: str, staged: StagedLetters, more: Iterable[DeadLetter] = ()) -> None:
    """One file of dead letters at path: the staged files' bytes in order (a chunk at a time;
    each file removed once copied), then more. Made even when there are none."""
    with storage.create(path, private=True) as joined:
        for part in staged.files:
            with storage.open_read(part) as letters:
                shutil.copyfileobj(letters, joined, COPY_CHUNK_BYTES)
        for letter in more:
            joined.write(letter.to_json().encode() + b"\n")
    if staged.files:
        storage.delete(list(staged.files))


class SortedRuns(_Counting):
    """Dead letters that come in no set order (Beam's bundles), written as they come into files
    of sorted lines (runs) in a folder: at most run_bytes of them held to be sorted at once.
    merge_runs then makes one file of them whose bytes do not depend on the order."""

    def __init__(self, folder: str, run_bytes: int = SORT_RUN_BYTES):
        super().__init__()
        self._folder, self._run_bytes = folder, run_bytes
        self._lines: list[bytes] = []
        self._held = 0
        self._files: list[str] = []

    def add(self, letter: DeadLetter) -> None:
        line = self._count_in(letter)
        self._lines.append(line)
        self._held += len(line)
        if self._held >= self._run_bytes:
            self._spill()

    def close(self) -> StagedLetters:
        """The runs written, and their tally."""
        if self._lines:
            self._spill()
        return StagedLetters(tuple(self._files), self.tally)

    def _spill(self) -> None:
        self._lines.sort()
        self._files.append(_write_run(self._folder, self._lines))
        self._lines, self._held = [], 0


def merge_runs(path: str, staged: StagedLetters, fan_in: int = MERGE_FAN_IN) -> str:
    """One file of dead letters at path: every line of the staged runs (SortedRuns), sorted,
    one line of each run held at a time (at most fan_in runs open: more are merged in passes).
    The runs are removed once merged. Made even when there are none; returns path."""
    folder = path.rsplit("/", 1)[0] if "/" in path else "."  # a URL's or a local path's
    runs = list(staged.files)
    while len(runs) > fan_in:
        runs = runs[fan_in:] + [_merge(runs[:fan_in], storage.join(folder, _run_name()))]
    return _merge(runs, path)


def _merge(runs: list[str], path: str) -> str:
    with contextlib.ExitStack() as stack:
        opened = [stack.enter_context(storage.open_read(run)) for run in runs]
        with storage.create(path, private=True) as merged:
            merged.writelines(heapq.merge(*opened))
    if runs:
        storage.delete(runs)
    return path


def _write_run(folder: str, lines: list[bytes]) -> str:
    path = storage.join(folder, _run_name())
    with storage.create(path, private=True) as run:
        run.writelines(lines)
    return path


def _run_name() -> str:
    """A name no other bundle (nor a retried one) takes."""
    return f"run-{uuid.uuid4().hex}.jsonl"
