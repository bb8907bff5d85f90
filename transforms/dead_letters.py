"""Dead-letter records: a rejected record, where it came from, and why; written to a file as
they come (a run may reject every record of its input, and each keeps its whole record so that
its provider can repair it), counted in memory."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO

from transforms import storage

DEAD_LETTER_TAG = "rejected"
DAMAGED_FILE = "damaged_file"  # the reason of a file that breaks off, rather than of a record
COPY_CHUNK_BYTES = 1 << 20


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


class LetterFile:
    """Dead letters written to a file as they come, one JSON line each, so holding them costs
    one letter whatever their count; the file is made at the first letter (none: no file).
    `tally` counts what was written."""

    def __init__(self, path: str):
        self.path = path
        self._handle: IO[bytes] | None = None
        self._reasons: Counter[str] = Counter()
        self._count = self._lost = 0

    def add(self, letter: DeadLetter) -> None:
        if self._handle is None:
            self._handle = storage.create(self.path, private=True)  # they hold raw prompts
        self._handle.write(letter.to_json().encode() + b"\n")
        self._count, self._lost = self._count + 1, self._lost + letter.lost_bytes
        self._reasons[letter.reason] += 1

    @property
    def tally(self) -> Tally:
        return Tally(self._count, self._lost, tuple(sorted(self._reasons.items())))

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
