"""Dead-letter records: a rejected record, where it came from, and why; written to files as
they come (a run may reject every record of its input), counted in memory. A letter keeps its
record whole up to LETTER_LINE_BYTES, so that its provider can repair it; a longer record keeps
that much of its start with its size and SHA-256, to be found in the input: a letter is at most
~6 x LETTER_LINE_BYTES as JSON (a control byte escapes to 6), whatever the record bound, and so
is what sorting and merging letters hold of each.

The declared order of a published dead-letter file, every engine's: its lines sorted by their
bytes (each letter's JSON line, UTF-8; `source` leads, so a file's letters stand together, then
`error`, `message`, `line`). The key is the letter itself, so every letter has one, those with
no record position among them (a whole damaged file's, a stream window's late letters, a
timestamp letter with no source), and it depends on nothing else: not the engine, the worker
count, how files are split into ranges, nor the order records are read, batched or encoded in.
Equal letters are equal lines, so their order among themselves cannot show. Both engines write
letters as sorted runs (SortedRuns: bounded memory) and merge them (merge_runs).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from kvtrace.transforms.sorted_runs import MERGE_FAN_IN, merge_files, write_run

DEAD_LETTER_TAG = "rejected"
DAMAGED_FILE = "damaged_file"  # the reason of a file that breaks off, rather than of a record
# Letters held this much at most (per bundle, or per worker process) to be sorted before written
# as a run (sorted_runs.py).
SORT_RUN_BYTES = 16 << 20
# A letter's record kept whole up to this (a chat request of ~60K tokens), a longer one cut to
# it: the merge holds one letter of each of MERGE_FAN_IN runs, at most ~1.5 MiB each as JSON.
LETTER_LINE_BYTES = 256 << 10
# A message kvtrace writes is a line; one quoting a library's words is cut to this.
LETTER_MESSAGE_CHARS = 4096
WITHHELD_LINE = b"(withheld: an engine hash capture record, docs/CAPTURES.md)"
# A u64 hash is 16 hex or up to 20 decimal digits; no count kvtrace says runs to 8.
_LONG_NUMBER = re.compile(r"[0-9A-Fa-f]{8,}")


@dataclass(frozen=True)
class DeadLetter:
    source: str  # the input's name as shown (shown_name), one text per name
    line: bytes
    reason: str
    message: str
    # Input bytes that became no record (a damaged file's cut record or unreadable rest, a file
    # or line refused unread, a record's bytes as read: read/records.line_weight):
    # --max-rejected-fraction weighs them as well as the count of records, as one letter may
    # stand for many records' bytes.
    lost_bytes: int = 0
    # A Parquet row's bytes as JSON (read/records.SizedLine): weighed in --max-rejected-fraction
    # at its file's share (Tally), known once the whole file is read, so sized in one pass.
    row_bytes: int = 0
    # Their part in each top-level column of the file, which places the row in each column's
    # stored bytes (Tally); not written.
    row_columns: tuple[int, ...] = ()
    # Set on the one share record of a Parquet file (read/sources.RowShare): (column, bytes as
    # stored, bytes as JSON) of its rows read, per column and WHOLE_ROW; no record, neither
    # written nor counted, only tallied.
    share: tuple[tuple[int, int, int], ...] | None = None
    # Whether the record may hold an engine's raw block hashes: decided once, where the letter
    # is made, by the run (every letter of a capture run) or by the decoded record (a text
    # run's: read/captures.holds_engine_hashes), never by the line's bytes, which an escaped
    # name or a pretty-printed record's lines evade. docs/CAPTURES.md.
    withhold: bool = False

    def __post_init__(self) -> None:
        # Applied before the letter exists anywhere (a sorted run, a pickle between Beam
        # stages): its line withheld, its message without any long run of digits; its reason
        # and counts kept.
        if self.withhold:
            object.__setattr__(self, "line", WITHHELD_LINE)
            object.__setattr__(self, "message", _LONG_NUMBER.sub("...", self.message))

    def to_line(self) -> bytes:
        """The letter as written: its JSON and a newline (no JSON holds a raw newline, and a
        newline sorts below every other byte a line holds, so lines sort as their JSON does)."""
        return self.to_json().encode() + b"\n"

    def to_json(self) -> str:
        # Undecodable bytes stay visible as \xNN escapes, so the line can be found and fixed.
        return json.dumps(
            {
                "source": self.source,  # shown as it was read (read/sources.read_range)
                "error": self.reason,
                "message": shown_name(self.message[:LETTER_MESSAGE_CHARS]),  # may quote a name
                "line": self.line[:LETTER_LINE_BYTES].decode("utf-8", errors="backslashreplace"),
                **_whole_line(self.line),
                **({"lost_bytes": self.lost_bytes} if self.lost_bytes else {}),
                **({"row_bytes": self.row_bytes} if self.row_bytes else {}),
            },
            ensure_ascii=False,
        )


def shown_name(name: str) -> str:
    """A file's name as printable one-line text any UTF-8 writer takes, one text per name: Linux
    names are bytes, and one that is not UTF-8 reaches Python as surrogates (os.fsdecode), shown
    as \\xNN escapes of its bytes, as a letter's `line` shows its undecodable bytes; a character
    that does not print (a newline, a surrogate no byte stands for) as \\uXXXX; and the backslash
    itself as \\\\, so no name's own text reads as another's escape."""
    if name.isprintable() and "\\" not in name:
        return name
    return "".join(_shown_char(char) for char in name)


def _shown_char(char: str) -> str:
    code = ord(char)
    if char == "\\":
        return "\\\\"
    if 0xDC80 <= code <= 0xDCFF:  # the byte os.fsdecode could not decode (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if char.isprintable():
        return char
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _whole_line(line: bytes) -> dict:
    """What identifies a record cut to LETTER_LINE_BYTES in its letter: its size and digest."""
    if len(line) <= LETTER_LINE_BYTES:
        return {}
    return {"line_bytes": len(line), "line_sha256": hashlib.sha256(line).hexdigest()}


# The reasons of records the engine never served (a gateway answered them from its own cache):
# rejected and counted (read = exported + rejected), but no damage to the input nor a refusal of
# it, so --max-rejected-fraction, which judges how much of what the engine served a night lost,
# weighs neither them nor their bytes (manifest.RecordCounts.rejected_fraction).
NEVER_SERVED = frozenset({"gateway_cache_hit"})

# A Parquet file's column (Tally, read/sources.RowShare) for its rows' whole size: weighs what
# its groups own past their columns' bytes.
WHOLE_ROW = -1


@dataclass(frozen=True)
class Tally:
    """What a run keeps in memory of its dead letters, however many: counts, the input bytes
    they lost, and how many of each reason. Parquet rows' letters are summed per file and
    column as JSON bytes (row_bytes in WHOLE_ROW, row_columns in each column), and each file's
    share (shares: per column, its rows' bytes as stored and as JSON) turns them into bytes as
    stored once every part is added: a row weighs the column chunks its values were stored in
    at its part of each, its file's rows together weigh the bytes they were read from, and no
    split or order of the parts changes the sum."""

    count: int = 0
    stored_lost: int = 0  # letters' lost_bytes
    reasons: tuple[tuple[str, int], ...] = ()  # (reason, count), sorted
    # (source, column, its row letters' bytes as JSON in it), sorted
    row_bytes: tuple[tuple[str, int, int], ...] = ()
    shares: tuple[tuple[str, int, int, int], ...] = ()  # (source, column, stored, as JSON)
    # The NEVER_SERVED letters' part of stored_lost and row_bytes.
    unserved_lost: int = 0
    unserved_rows: tuple[tuple[str, int, int], ...] = ()

    @classmethod
    def of(cls, letters: Iterable[DeadLetter]) -> Tally:
        counts = _Counts()
        for letter in letters:
            counts.add(letter)
        return counts.tally

    def __add__(self, other: Tally) -> Tally:
        counts = _Counts()
        for tally in (self, other):
            counts.reasons.update(dict(tally.reasons))
            counts.rows.update({(s, c): b for s, c, b in tally.row_bytes})
            counts.stored.update({(s, c): b for s, c, b, _ in tally.shares})
            counts.sized.update({(s, c): b for s, c, _, b in tally.shares})
            counts.unserved_rows.update({(s, c): b for s, c, b in tally.unserved_rows})
        counts.count = self.count + other.count
        counts.lost = self.stored_lost + other.stored_lost
        counts.unserved_lost = self.unserved_lost + other.unserved_lost
        return counts.tally

    @property
    def lost_bytes(self) -> int:
        """Input bytes as stored that became no record: letters' lost_bytes, and each file's
        row letters' JSON bytes in each column at its share, rounded up, never more than the
        column's bytes (a file with no share, never expected, weighs its rows' JSON bytes:
        more, never less)."""
        return self._lost(self.stored_lost, self.row_bytes)

    @property
    def unserved_bytes(self) -> int:
        """The part of lost_bytes that NEVER_SERVED letters lost, by the same rule."""
        return self._lost(self.unserved_lost, self.unserved_rows)

    def _lost(self, stored_lost: int, row_bytes: tuple[tuple[str, int, int], ...]) -> int:
        shares = {
            (source, column): (stored, sized) for source, column, stored, sized in self.shares
        }
        with_share = {source for source, *_ in self.shares}
        lost = stored_lost
        for source, column, sized_lost in row_bytes:
            if (source, column) in shares:
                stored, sized = shares[source, column]
                lost += min(-(-sized_lost * stored // max(sized, 1)), stored)
            elif column == WHOLE_ROW or source in with_share:
                lost += sized_lost
        return lost

    def of_reason(self, reason: str) -> int:
        return dict(self.reasons).get(reason, 0)


class _Counts:
    """A Tally as letters come, one at a time (Tally.of, SortedRuns)."""

    def __init__(self) -> None:
        self.reasons: Counter[str] = Counter()
        self.rows: Counter[tuple[str, int]] = Counter()  # (source, column) -> bytes as JSON
        self.stored: Counter[tuple[str, int]] = Counter()  # Tally.shares' pair, summed below
        self.sized: Counter[tuple[str, int]] = Counter()
        self.unserved_rows: Counter[tuple[str, int]] = Counter()  # NEVER_SERVED's part of rows
        self.count = self.lost = self.unserved_lost = 0

    def add(self, letter: DeadLetter) -> bool:
        """Count a letter; False for a file's share record, which is no letter."""
        if letter.share is not None:
            for column, stored, sized in letter.share:
                self.stored[letter.source, column] += stored
                self.sized[letter.source, column] += sized
            return False
        self.count, self.lost = self.count + 1, self.lost + letter.lost_bytes
        self.reasons[letter.reason] += 1
        unserved = letter.reason in NEVER_SERVED
        self.unserved_lost += letter.lost_bytes if unserved else 0
        if letter.row_bytes:
            for rows in (self.rows, self.unserved_rows) if unserved else (self.rows,):
                rows[letter.source, WHOLE_ROW] += letter.row_bytes
                for column, sized in enumerate(letter.row_columns):
                    rows[letter.source, column] += sized
        return True

    @property
    def tally(self) -> Tally:
        return Tally(
            self.count,
            self.lost,
            tuple(sorted(self.reasons.items())),
            tuple(sorted((*key, sized) for key, sized in self.rows.items())),
            tuple(sorted((*key, self.stored[key], sized) for key, sized in self.sized.items())),
            self.unserved_lost,
            tuple(sorted((*key, sized) for key, sized in self.unserved_rows.items())),
        )


@dataclass(frozen=True)
class StagedLetters:
    """Dead letters already written, as sorted runs (SortedRuns) to be merged, and their tally."""

    files: tuple[str, ...] = ()
    tally: Tally = Tally()

    def __add__(self, other: StagedLetters) -> StagedLetters:
        return StagedLetters(self.files + other.files, self.tally + other.tally)


class SortedRuns:
    """Dead letters that come in no set order (Beam's bundles, the local engine's ranges and
    their batches), written as they come into files of sorted lines (runs) in a folder: at most
    run_bytes of them held to be sorted at once. merge_runs then makes one file of them in the
    declared order. `tally` counts what was added."""

    def __init__(self, folder: str, run_bytes: int = SORT_RUN_BYTES):
        self._folder, self._run_bytes = folder, run_bytes
        self._lines: list[bytes] = []
        self._held = 0
        self._files: list[str] = []
        self._counts = _Counts()

    def add(self, letter: DeadLetter) -> None:
        if not self._counts.add(letter):
            return
        line = letter.to_line()
        self._lines.append(line)
        self._held += len(line)
        if self._held >= self._run_bytes:
            self._spill()

    @property
    def tally(self) -> Tally:
        return self._counts.tally

    def close(self) -> StagedLetters:
        """The runs written, and their tally."""
        if self._lines:
            self._spill()
        return StagedLetters(tuple(self._files), self.tally)

    def _spill(self) -> None:
        self._files.append(write_run(self._folder, self._lines))
        self._lines, self._held = [], 0


def merge_runs(
    path: str, staged: StagedLetters, more: Iterable[DeadLetter] = (), fan_in: int = MERGE_FAN_IN
) -> str:
    """One file of dead letters at path, in the declared order: every line of the staged runs
    (SortedRuns) and of more (a few held in memory: a stream window's), one line of each run
    held at a time (a letter's size is bounded: LETTER_LINE_BYTES) (at most fan_in runs open: more are merged in passes). The runs are removed
    once merged. Made even when there are none; returns path."""
    lines = sorted(letter.to_line() for letter in more if letter.share is None)
    return merge_files(staged.files, path, lines, fan_in)
