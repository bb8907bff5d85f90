"""OpenAI Batch files joined: each line of an input file (a request, by `custom_id`, with no
time) with the line of an output file that answers it (a response, by `custom_id`, with no
request), before either is parsed, so a run reads the two files as the API leaves them.

One pure function decides each custom_id's fate on every engine (join_halves): an input line
and an output line are one joined record (the input's fields, then the output's that it lacks),
parsed as any record is; a line alone is an `unjoined_batch` dead letter (an input line has no
time to publish, an output line no request); a custom_id on two input or two output lines is a
`duplicate_custom_id` letter for each of its lines, naming the side repeated (which response
answers which request is unknown; the same letters whatever order the lines come in); a pair that cannot be one record
(nested deeper than a record may) is one letter, on its input line. So every line is exported
(as part of one joined record) or rejected, and a joined pair counts as one record read.

How the lines meet, in bounded memory: on Beam a GroupByKey by custom_id (read/steps.py
JoinBatchHalves); on the local engine an external sort (sorted_runs.py): each worker spills the
halves it reads (BatchSpill, at most SPILL_RUN_BYTES held) into runs per hash partition of the
custom_id, each partition's runs are merged into one sorted file, and a worker reads each file
in custom_id order (joined_partition), holding at most two lines of a custom_id
(docs/BOUNDS.md). Only JSONL lines are halves: the API writes Batch files so.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import xxhash

from kvtrace.transforms import storage
from kvtrace.transforms.dead_letters import DeadLetter
from kvtrace.transforms.errors import UNANTICIPATED, Rejected, unanticipated
from kvtrace.transforms.read.json_tree import check_tree
from kvtrace.transforms.read.records import (
    ParseOptions,
    StoredLine,
    decode_record,
    line_weight,
    load_json_line,
)
from kvtrace.transforms.sorted_runs import merge_files, write_run

INPUT, OUTPUT = "input", "output"
UNJOINED = "unjoined_batch"
DUPLICATE = "duplicate_custom_id"
# Halves a local worker holds before it sorts and writes them as runs (one per partition).
SPILL_RUN_BYTES = 32 << 20
# Runs merged at once: the merge holds a line of each, and a line may be --max-record-bytes
# (16 x 16 MiB at most; dead letters, cut to 256 KiB, merge 64 at once).
MERGE_FAN_IN = 16
# What a Batch line holds and no other log line does, looked for before a line is decoded: a
# line without it is read as it is, decoded once (a key written with escapes, `custom\u005fid`,
# is then read alone, an unjoined_batch letter).
CUSTOM_ID_KEY = b'"custom_id"'


@dataclass(frozen=True)
class Half:
    """One line of a Batch file: which file it is of (INPUT or OUTPUT), where it was read, and
    whether a letter of it withholds its line (decided once, where it was decoded)."""

    side: str
    source: str
    line: bytes
    withhold: bool = False


def batch_half(record: Any, options: ParseOptions) -> tuple[str, str, bool] | None:
    """(custom_id, INPUT or OUTPUT, whether its letters withhold it: ParseOptions.withholds)
    of a Batch file's line: an input line has a `body` and no
    answer, an output line a `response` or `error` and no `body`. None for any other record (a
    line joined already, a log line, a line that is not a JSON object, a Parquet row, a line
    whose custom_id holds a lone surrogate): it is parsed as it is, and refused there if it
    must be. A custom_id is a key every engine can shuffle (Beam's str coder is strict UTF-8),
    so a line with one that is not UTF-8 is no half on any engine. A capture run joins none:
    each of its lines is parsed alone, and its letter made there (ParseOptions.withholds)."""
    if options.capture is not None or not isinstance(record, bytes) or CUSTOM_ID_KEY not in record:
        return None
    try:
        value, _ = decode_record(record, options)
    except Rejected:
        return None
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not _utf8(custom_id):
        return None
    asks = value.get("body") is not None
    answers = value.get("response") is not None or value.get("error") is not None
    if asks == answers:
        return None
    return custom_id, INPUT if asks else OUTPUT, options.withholds(record, value)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def join_halves(custom_id: str, halves: Iterable[Half]) -> Iterator[tuple[str, bytes] | DeadLetter]:
    """A custom_id's lines, in any order, as one joined record (source, line) or a dead letter
    for each line; at most one line of each side held."""
    held: dict[str, Half] = {}
    repeated: set[str] = set()  # the sides with more than one line
    for half in halves:
        if half.side in repeated:
            yield _duplicate(custom_id, half, half.side)
        elif half.side in held:
            repeated.add(half.side)
            yield _duplicate(custom_id, held.pop(half.side), half.side)
            yield _duplicate(custom_id, half, half.side)
        else:
            held[half.side] = half
    if repeated:
        # a side's one line, its letter held to the end: whether its side repeats, and so
        # what its letter says, is known only then (the same letters in any order)
        for half in held.values():
            yield _duplicate(custom_id, half, *repeated)
        return
    if len(held) == 2:
        both = line_weight(held[INPUT].line) + line_weight(held[OUTPUT].line)
        try:
            joined = joined_line(held[INPUT].line, held[OUTPUT].line)
        except (Rejected, *UNANTICIPATED) as err:  # the pair is one record: one letter
            failed = err if isinstance(err, Rejected) else unanticipated(err)
            message = f"the joined Batch record: {failed.message}"
            yield _letter(held[INPUT], failed.reason, message, both)
            return
        # the pair's letter, if it is refused, weighs both lines' bytes as read
        yield held[INPUT].source, StoredLine.weighing(joined, both)
    elif INPUT in held:
        yield _letter(
            held[INPUT],
            UNJOINED,
            f"a Batch input line whose custom_id {custom_id[:64]!r} is on no output line of "
            "the run's inputs: it has no time (give its output file to the same run)",
        )
    else:
        yield _letter(
            held[OUTPUT],
            UNJOINED,
            f"a Batch output line whose custom_id {custom_id[:64]!r} is on no input line of "
            "the run's inputs: it holds no request (give its input file to the same run)",
        )


def joined_line(input_line: bytes, output_line: bytes) -> bytes:
    """One record of both lines: the input line's fields, then each of the output line's that
    the input line lacks or holds null (its `response`, `error`, `id`), as one JSON line.
    Rejected (too_deep) when it nests deeper than any record may (json_tree's rule, every line
    reader's), checked before it is written: json.dumps recurses, and a line orjson read 1,000
    levels deep would take it past Python's recursion limit."""
    joined, _ = load_json_line(input_line)
    answer, _ = load_json_line(output_line)
    for name, value in answer.items():
        if joined.get(name) is None:
            joined[name] = value
    check_tree(joined, check_strings=False)
    text = json.dumps(joined, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: escaped, as its line wrote it, for the parser
        return json.dumps(joined, separators=(",", ":")).encode("ascii")


def _duplicate(custom_id: str, half: Half, side: str) -> DeadLetter:
    """The letter of a line of a custom_id on more than one line of side: its own, or the
    other (the line then its side's only one)."""
    where = "is" if half.side == side else f"of this Batch {half.side} line is"
    return _letter(
        half,
        DUPLICATE,
        f"custom_id {custom_id[:64]!r} {where} on more than one Batch {side} line of the run's "
        "inputs: which response answers which request is unknown (custom_ids are unique within "
        "one batch: give each batch's files to a run of their own)",
    )


def _letter(half: Half, reason: str, message: str, lost: int | None = None) -> DeadLetter:
    """A letter of a line, weighing its bytes as read (lost: the pair's, for a joined pair)."""
    weight = line_weight(half.line) if lost is None else lost
    return DeadLetter(
        half.source, half.line, reason, message, lost_bytes=weight, withhold=half.withhold
    )


# ---- The local engine's external sort --------------------------------------------------------


def partition_of(custom_id: str, partitions: int) -> int:
    """The partition a custom_id's lines are joined in, the same in every worker."""
    return xxhash.xxh3_64_intdigest(custom_id.encode("utf-8")) % partitions


def spill_line(custom_id: str, half: Half) -> bytes:
    """A half as one line that sorts with the other lines of its custom_id: an ASCII JSON head
    (no tab, no newline; its weight as read, line_weight, kept as Beam's pickle keeps it), a
    tab, the line as read (which holds no newline)."""
    weight = line_weight(half.line)
    head = json.dumps([custom_id, half.side, half.source, half.withhold, weight]).encode("ascii")
    return head + b"\t" + half.line + b"\n"


def _spilled(line: bytes) -> tuple[str, Half]:
    head, record = line.rstrip(b"\n").split(b"\t", 1)
    custom_id, side, source, withhold, weight = json.loads(head)
    return custom_id, Half(side, source, StoredLine.weighing(record, weight), withhold)


class BatchSpill:
    """The halves one worker reads, written as runs into folder, a run per partition each time
    run_bytes of them are held; close() gives (partition, run, its bytes) for every run."""

    def __init__(self, folder: str, partitions: int, run_bytes: int = SPILL_RUN_BYTES):
        self._folder, self._partitions, self._run_bytes = folder, partitions, run_bytes
        self._lines: dict[int, list[bytes]] = {}
        self._held = 0
        self._runs: list[tuple[int, str, int]] = []

    def add(self, custom_id: str, half: Half) -> None:
        line = spill_line(custom_id, half)
        self._lines.setdefault(partition_of(custom_id, self._partitions), []).append(line)
        self._held += len(line)
        if self._held >= self._run_bytes:
            self._spill()

    def close(self) -> tuple[tuple[int, str, int], ...]:
        if self._lines:
            self._spill()
        return tuple(self._runs)

    def _spill(self) -> None:
        for partition, lines in sorted(self._lines.items()):
            size = sum(len(line) for line in lines)
            self._runs.append((partition, write_run(self._folder, lines, "batch-halves"), size))
        self._lines, self._held = {}, 0


def merge_partition(runs: list[str], path: str) -> str:
    """One partition's runs merged into one file at path, sorted by custom_id; bytes only,
    nothing decoded. The runs are removed."""
    return merge_files(runs, path, fan_in=MERGE_FAN_IN)


def joined_partition(path: str) -> Iterator[tuple[str, bytes] | DeadLetter]:
    """The joined records and dead letters of a sorted partition file (a merge of BatchSpill's
    runs), custom_id by custom_id, one line read at a time."""
    with storage.open_read(path) as lines:
        spilled = (_spilled(line) for line in lines)
        for custom_id, group in itertools.groupby(spilled, key=lambda item: item[0]):
            yield from join_halves(custom_id, (half for _, half in group))
