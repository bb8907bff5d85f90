"""The one write protocol of every command that writes: an output, file or folder, published
whole or not at all, its location checked and locked before any work.

A run writes every file of its output (trace shards, stats.json, manifest.json last) into a
staging folder beside the output, each file synced as it closes; publishing then swaps the
staging folder with the output in one atomic step, so a reader, a crash or a full disk never
meets a mix of two runs or a half-written file: before the swap the folder is the previous
output, after it the new one.

    parent/.NAME.kvtrace-lock               held (flock) by the run writing NAME: one at a time
    parent/.NAME.kvtrace-staging-RUNID/     the run's output while it is written (owner-only)
    parent/NAME/                            the published output

Local filesystems swap with renameat2(RENAME_EXCHANGE) (Linux), or, where a filesystem lacks it,
two renames whose gap a later run closes (restore_interrupted). Object stores have no atomic
folder: files are copied in, the manifest last, so the manifest (listing every file's sha256)
is what marks a complete output there; one writer per output folder.

Every command first plans its locations (plan_locations): every location it reads and writes,
placed, compared by what they are (each folder's st_dev and st_ino, so a bind mount is the
folder it mounts), checked together before any work, so nothing is computed or committed for a
location that cannot be published (one written inside, over or around another, over what the
run reads or where an input glob would read it next run; a file where a folder goes; another
command's output folder, or anything inside one, or inside a private folder of kvtrace's
(storage.make_folder marks each); a folder where no folder can be renamed: the plan renames one
there). A glob's folders are also placed as glob(3) walks them (through `..` and links).

A run refuses an output folder holding anything kvtrace did not write (files its manifest does
not list, or for a folder without a manifest, files its output mark does not: mark_output),
checked again at the swap and on the folder swapped out: it publishes only what it produced,
and removes only what an earlier run published. A folder is never taken for an output by the
names of its files, nor by a manifest kvtrace's readers refuse or another user's. Beside an
output, nothing goes by its name alone: a lock only if kvtrace made it (_own_lock), a staging
leftover only if its name is exactly a staging name and it is the running user's.

A single file (a rendered request file, an exported trace, a report page) is the same protocol
for one file: written and synced as parent/.NAME.kvtrace-staging-RUNID, renamed over NAME, the
folder synced; object stores publish an object whole when its upload completes, so a file there
is written in place. Commands use file_output and folder_output, which check the location and
take its lock before the work and publish when the work ends without an error.

A run's dead letters (DeadLetterRun) are staged in its dead-letter folder and published when
its output is. Whether a killed run's output was published is read from what stands, never
from a mark on the output (a published folder carries nothing kvtrace does not publish): beside
the folder it stages, the run keeps a pointer (.NAME.kvtrace-staging-RUNID.letters) naming its
letters and that folder's identity (st_dev, st_ino, which a rename keeps). The next run of the
output, under its lock, settles it before it clears any staging (restore_interrupted): the
letters are published if the output is that folder, dropped if it is still staged, whatever
--dead-letter the next run was given: a published run's letters are never lost to another
folder's run.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import glob
import hashlib
import json
import os
import posixpath
import re
import shutil
import stat
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import IO

from kvtrace.transforms import storage
from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.ids.exclusive import folder_lock
from kvtrace.transforms.ids.id_map import new_run_id
from kvtrace.transforms.read.measured import MEASURED_STAGED, measured_file
from kvtrace.transforms.read.paths import read_bytes
from kvtrace.transforms.read.trace_inputs import MAX_MANIFEST_BYTES, published_folder
from kvtrace.transforms.storage import folded, is_url, place
from kvtrace.transforms.trace_format import (
    DERIVED_FROM,
    DERIVING_COMMANDS,
    FORMAT,
    MANIFEST,
    TRACE_FILE,
    parse_json,
    window_name,
)
from kvtrace.transforms.write.interrupts import stops_deferred
from kvtrace.transforms.write.manifest import set_content_time, set_content_times

STAGING_MARK = ".kvtrace-staging-"
LOCK_MARK = ".kvtrace-lock"
LOCK_ATTEMPTS = 100  # each retry means another run took and released the lock meanwhile
# The one file of dead letters each engine writes into a run's (or a window's) letters folder.
DEAD_LETTER_FILE = "rejected-00000-of-00001.jsonl"
# The longest file name local filesystems take (bytes); a longer output name is refused, and
# the staging and lock names of a long one are named by its digest (_stem).
NAME_MAX = 255
# The longest run id a staging name carries: new_run_id's 12 hex digits, a block-hashes folder's
# 16 (shards.hashes_staging); staging_folder refuses a longer one, so the room always holds.
MAX_RUN_ID_CHARS = 16
_DIGEST_MARK = "~"  # leads a stem that is a digest of its output's name (_stem)
_HIDDEN_ROOM = len(".") + len(STAGING_MARK) + MAX_RUN_ID_CHARS + len(".previous")
_RENAME_EXCHANGE = 2
# Every staging name this process made up (its runs' own) and its lock files are noted in the
# run's one registry of what it removes on any exit (storage.remove_on_exit), for a stop that
# ends the process without waiting for it to unwind (the CLI's deadline): abandon_staged
# removes them. Each publication holds _PUBLISHING (publication), so that removal never meets
# one half done: a name it removes is still staged, or published and gone.
_PUBLISHING = threading.RLock()
# Held for each swap, its undoing and its record, so a hard end that stops waiting for a
# publication (abandon_staged) meets none half made: it takes this, bars any further swap
# (_ABANDONED) and puts back every swap of the publications under way.
_SWAPPING = threading.Lock()
_ABANDONED = threading.Event()
# Set once this process's run holds an output's lock: every check is made before it (the
# output's parent, the inputs, the id map's settings), so a failure from then on is a job that
# stopped, never a run refused before it started (the CLI's exit code: began_writing).
_BEGAN_WRITING = threading.Event()
SHOWN_PUBLISHED = 3  # the latest publications a stop names (a stream publishes one per window)
_AT_FDCWD = -100


class OutputRefused(ValueError):
    """The output folder cannot be published into: the message says why and what to do."""


def staging_folder(output: str, run_id: str) -> str:
    """Where a run stages its output, a folder or a file: beside it, hidden, named by the run."""
    if len(run_id) > MAX_RUN_ID_CHARS:
        raise ValueError(
            f"a run id of {len(run_id)} characters: staging names room for {MAX_RUN_ID_CHARS}"
        )
    parent, name = _split(output)
    return _staged_here(
        storage.join(parent, f".{_stem(name)}{STAGING_MARK}{run_id}")
        if parent
        else f".{_stem(name)}{STAGING_MARK}{run_id}"
    )


def make_staging(staging: str, gated: bool = True) -> None:
    """A run's staging folder made (owner-only, marked private; storage makes it inherit
    nothing of its parent) and, if it stages an output the audit gates (a night, a derived
    folder, a stream's window), held to what the gate holds every published entry to before
    any work (check_inherited); removed again if that fails. A private or report output
    (analyze's) is never audited, so never refused for it."""
    storage.make_folder(staging, private=True)
    if not gated:
        return
    try:
        check_inherited(staging, kept=frozenset({storage.PRIVATE_MARK}))
    except OutputRefused:
        storage.remove_folder(staging)
        raise


# Attributes a file system lists on every entry, which no one removes: NFSv4's ACL and Lustre's
# striping layout. An output staged there is refused whatever its parent.
LISTED_ON_EVERY_FILE = ("system.nfs4_acl", "lustre.lov")


def check_inherited(folder: str, kept: frozenset[str] = frozenset(), given: bool = False) -> None:
    """Refuse, in one line, a local folder about to hold a published output that carries what
    the gate refuses in every entry (storage.foreign_metadata): what storage.inherit_nothing
    could not take off it (an inode flag only privilege clears, an attribute the file system
    lists on every file) would be in every entry made in it, and the audit would refuse it.
    given: the folder is the user's own output (named), not a staging folder (its parent is)."""
    if is_url(folder):
        return
    problems = storage.foreign_metadata(folder, os.path.basename(folder), kept)
    if not problems:
        return
    attributes = storage.foreign_attributes(folder, kept)
    for listed in LISTED_ON_EVERY_FILE:
        if listed in attributes:
            raise OutputRefused(
                f"this file system lists {listed} on every file; stage nights on a local "
                f"disk and copy the published folder"
            )
    raise OutputRefused(
        f"{folder if given else os.path.dirname(folder) or '.'} passes on to what is made "
        f"in it what kvtrace cannot clear and the audit refuses ({problems[0]}): write the "
        f"output into a folder that passes nothing on (lsattr -d, getfacl, ls -ld)"
    )


def _staged_here(path: str) -> str:
    """A staging name of this process's run (and its parts: Beam's synthesize), noted for
    abandon_staged."""
    storage.remove_on_exit(f"{path}.parts")
    return storage.remove_on_exit(path)


@dataclass(frozen=True)
class Intended:
    """A publication's step about to stand (an id map's version record, before its link), told
    to the parent that reports before it is taken (intend): name stands once path holds exactly
    the bytes of this size and sha256 digest, so a child that dies at any point of the step is
    told by what storage holds, whatever it could still say."""

    name: str
    path: str
    size: int
    digest: str

    def stands(self) -> bool:
        """Whether path holds exactly the intended bytes (unreadable, absent: it does not)."""
        try:
            held = read_bytes(self.path, self.size)
        except (OSError, ValueError):
            return False
        return hashlib.sha256(held).hexdigest() == self.digest


# What a child tells its parent (forward_publications): an Intended step, or the names a
# publication published as it ended, which settles every step it intended.
Told = Intended | list[str]


class _Published:
    """What this process has published, as its publications stand once whole: how many, and
    the latest names (bounded), for a stop to say (published_here); in a child whose parent
    reports, sent on to the parent's record as each publication ends, nothing published
    included (forward_publications)."""

    def __init__(self) -> None:
        self.count = 0
        self.latest: deque[str] = deque(maxlen=SHOWN_PUBLISHED)
        self.forward: Callable[[Told], None] | None = None

    def note(self, names: Sequence[str]) -> None:
        self.count += len(names)
        self.latest.extend(names)
        if self.forward is not None:
            self.forward(list(names))


_PUBLISHED_HERE = _Published()


# What stands of a publication's steps that are not swaps (an id map's commit), read from
# storage for a hard end that abandons it; its swaps are put back, so they are never among it.
Standing = Callable[[], list[str]]


def only_swaps() -> list[str]:
    """The standing of a publication whose every step is a swap: nothing, once they are back."""
    return []


class _Open:
    """A publication under way: the names it has put in place, and the local swaps done
    (staged, output, where the previous output went), each recorded as it is made (under
    _SWAPPING), put back if an enclosing publication fails or a hard end abandons it, and their
    previous outputs removed only once the outermost one stands whole. standing: what stands of
    its other steps, for a hard end (None: it cannot be told, so it may be half done)."""

    def __init__(self, standing: Standing | None) -> None:
        self.names: list[str] = []
        self.swaps: list[tuple[str, str, str | None]] = []
        self.standing = standing


_OPEN_PUBLICATIONS: list[_Open] = []  # under _PUBLISHING: those under way, outermost first


@contextmanager
def publication(standing: Standing | None = only_swaps) -> Iterator[list[str]]:
    """One publication of one or several outputs (a night's trace, then its block hashes), the
    one section every publication runs in: it holds _PUBLISHING (a hard end waits for it:
    abandon_staged) and defers a stop until it ends (interrupts), so it is whole or rolled back
    whenever the stop comes. What the body appends to the list yielded (the names it put in
    place) is recorded once the outermost publication ends whole: one that fails records only
    what stands of it once its swaps are back (_note_standing), one that an enclosing one rolls
    back nothing. Publications nested in one stand or are put back with it. standing: what
    stands of its steps that are not swaps, read from storage (an id map's version committed);
    None where that cannot be told (an object store's copies)."""
    with _PUBLISHING, stops_deferred():
        current = _Open(standing)
        _OPEN_PUBLICATIONS.append(current)
        try:
            yield current.names
        except BaseException:
            _undo(current.swaps)
            with _SWAPPING:
                _OPEN_PUBLICATIONS.pop()
                if not _ABANDONED.is_set():  # else a hard end recorded it already
                    _note_standing(current)
            raise
        with _SWAPPING:  # a hard end sees it under way (and puts it back) or recorded whole
            _OPEN_PUBLICATIONS.pop()
            if _ABANDONED.is_set():  # put back already: the process ends next
                raise JobStopped("stopped at the deadline; the publication was put back")
            if _OPEN_PUBLICATIONS:
                _OPEN_PUBLICATIONS[-1].names.extend(current.names)
                _OPEN_PUBLICATIONS[-1].swaps.extend(current.swaps)
                return
            _PUBLISHED_HERE.note(current.names)
        _remove_previous(current.swaps)


def _note_standing(failed: _Open) -> None:
    """What stands of a failed publication once its swaps are back (an id map's version
    committed before its mark could be written), recorded as a hard end records it, so that
    the failure's line says it whichever step failed. Read from storage: a read that fails
    too leaves the failure's own error to be said."""
    standing: list[str] = []
    if failed.standing is not None:
        with suppress(Exception):
            standing = failed.standing()
    _PUBLISHED_HERE.note(standing)  # nothing standing too: a parent's intended steps settle


def forward_publications(send: Callable[[Told], None]) -> None:
    """In a child process whose parent reports (child_process.run_in_child): every publication
    of this process is sent on as it ends, still within it (a stop waits for it), so the
    parent's stop says it (note_published there); each step it intends, before it is taken
    (intend)."""
    _PUBLISHED_HERE.forward = send


def intend(name: str, path: str, data: bytes) -> None:
    """Within a publication, before the step that creates path with data (an id map's commit):
    a parent that reports is told it first (Intended), so it learns of the step no later than
    it stands, even if this process dies before it can say the step was taken."""
    if _PUBLISHED_HERE.forward is not None:
        digest = hashlib.sha256(data).hexdigest()
        _PUBLISHED_HERE.forward(Intended(name, path, len(data), digest))


def note_published(names: Sequence[str]) -> None:
    """What a child of this process published (forward_publications), in this one's record."""
    with _PUBLISHING:
        _PUBLISHED_HERE.note(names)


def forget_published() -> None:
    """A new run in this process (the CLI's main called again: a test, a host program): what
    its line says is its own, none of an earlier run's."""
    with _PUBLISHING:
        _PUBLISHED_HERE.count = 0
        _PUBLISHED_HERE.latest.clear()
        _BEGAN_WRITING.clear()


def began_writing() -> bool:
    """Whether this process's run has taken an output's lock (output_lock): past its checks."""
    return _BEGAN_WRITING.is_set()


def published_here() -> str:
    """What this process has published, for a stop to say ("": nothing)."""
    record = _PUBLISHED_HERE
    if not record.count:
        return ""
    latest = list(record.latest)
    if record.count > len(latest):
        return f"{record.count} outputs, the last {', '.join(latest)}"
    return " and ".join([", ".join(latest[:-1]), latest[-1]] if len(latest) > 1 else latest)


def abandon_staged(wait_s: float) -> bool:
    """For a stop that ends this process at once: what its run made and has not removed (its
    staging, its lock files, standard input's spooled copy: storage.remove_leftovers) is
    removed, once no publication is under way (waiting wait_s at most for one; past that, the
    publications under way are put back: _put_back_open). _PUBLISHING stays held, or no swap
    may start: the process ends next. Returns whether what stands is known (recorded for
    published_here); False: a publication may be left half done."""
    if not _PUBLISHING.acquire(timeout=wait_s) and not _put_back_open(wait_s):
        return False
    storage.remove_leftovers()
    return True


def _put_back_open(wait_s: float) -> bool:
    """Bar any further swap, put back every swap of the publications under way (the latest
    first) and record what stands of their other steps. Returns whether all of it is known:
    False if a swap in progress outlasts wait_s, one cannot be put back, or a publication's
    other steps cannot be told."""
    if not _SWAPPING.acquire(timeout=wait_s):
        return False
    try:
        _ABANDONED.set()  # every swap and record reads it under the lock: none after this
        for current in reversed(_OPEN_PUBLICATIONS):
            while current.swaps:
                _swap_back(*current.swaps.pop())
        if any(current.standing is None for current in _OPEN_PUBLICATIONS):
            return False
        _PUBLISHED_HERE.note([n for c in _OPEN_PUBLICATIONS if c.standing for n in c.standing()])
    except Exception:  # noqa: BLE001 - the line then says it may be half done
        return False
    finally:
        _SWAPPING.release()
    return True


def _split(path: str) -> tuple[str, str]:
    path = folded(path)
    if "/" not in path:
        return "", path
    parent, name = path.rsplit("/", 1)
    return parent or "/", name


def _stem(name: str) -> str:
    """The output's name in its staging and lock names: itself, or where those would pass
    NAME_MAX, a digest of it (the same for every run, so the next one finds a killed one's).
    One stem, one output: a name that starts with the digest's mark is digested too, so no
    name stands for itself where it could read as another's digest. So is one that is not
    UTF-8 (Linux names are bytes): the staging names stay text Beam's steps can carry."""
    if (
        len(os.fsencode(name)) + _HIDDEN_ROOM <= NAME_MAX
        and not name.startswith(_DIGEST_MARK)
        and _is_text(name)
    ):
        return name
    return _DIGEST_MARK + sha256_of(os.fsencode(name))[:32]


def _is_text(name: str) -> bool:
    """Whether a name is UTF-8 (no surrogate stands in it for a byte that is not)."""
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def foreign_files(output: str, own: frozenset[str] = frozenset()) -> list[str]:
    """What the output folder holds that neither its kvtrace manifest nor its output mark (a
    command's folder without a manifest) lists (all of it, when it has neither), nor among
    own (the names of a block-hashes folder); subfolders and hidden files included."""
    if not is_url(output) and os.path.exists(output) and not os.path.isdir(output):
        return [output]
    present = _names(output)
    listed = set(_listed(output))
    return [name for name in present if name not in listed and not _own_file(output, name, own)]


def _names(folder: str) -> list[str]:
    """The names a folder holds (none when it does not exist)."""
    if is_url(folder):
        return storage.files_in(folder)  # by its name as spelled, never as a glob
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def _own_file(output: str, name: str, own: frozenset[str]) -> bool:
    """A plain file (not a folder or a link) by a name the command writes."""
    if name not in own:
        return False
    path = storage.join(output, name)
    return is_url(path) or (os.path.isfile(path) and not os.path.islink(path))


def _manifest(folder: str) -> object:
    """The folder's manifest, parsed, if it is kvtrace's (None otherwise): one kvtrace writes
    by the readers' own test (published_folder), and in a local folder the running user's (a
    file anyone may plant in a shared folder makes nothing an output). Read bounded, and only
    a regular file (a FIFO there must not hang the plan that looks at it)."""
    try:
        published = published_folder(folder)
    except (OSError, ValueError):
        return None
    if published is None:
        return None
    published.close()
    path = storage.join(folder, MANIFEST)
    try:
        if not is_url(folder) and os.lstat(path).st_uid != os.geteuid():
            return None
        return json.loads(read_bytes(path, MAX_MANIFEST_BYTES))
    except (OSError, ValueError):
        return None


def _listed(output: str) -> list[str]:
    """The files a folder's manifest, else its output mark, lists as kvtrace's."""
    manifest = _manifest(output)
    try:
        files = manifest["files"]
        if manifest.get("format") != FORMAT or not all(
            isinstance(f, str) and "/" not in f for f in files
        ):
            return []
        return [*files, MANIFEST]
    except (KeyError, TypeError):
        return _marked(output)[1]


# A command's output folder without a manifest (analyze's) is marked as its own when the run
# publishes it, listing what it published: a folder is never taken for an output by its file
# names alone. A local folder carries the mark as an extended attribute (a rename keeps it, and
# the folder's listing stays the run's files); an object store, which has none, as an object.
OUTPUT_MARK = "user.kvtrace.output"
OUTPUT_MARK_OBJECT = "kvtrace-output.json"  # not hidden: every store's "*" matches it
MAX_MARK_BYTES = 4096  # the most an extended attribute holds on common filesystems (ext4)


# The writer a stream's folder is marked by (anonymize --streaming): it adds windows to the
# folder while it stands, so its mark names the last window it claimed, not its files.
STREAM_WRITER = "anonymize --streaming"


def mark_output(folder: str, writer: str, claimed: str = "") -> bool:
    """Mark a staged folder as the writer's output, listing the files it holds; False where a
    local filesystem keeps no extended attributes (the folder is published unmarked, so a next
    run cannot tell it from a user's, and refuses it unless it is emptied). claimed: a folder
    its writer goes on adding to (a stream's): the last name it claimed, listing no files (a
    stream of any length keeps its mark within MAX_MARK_BYTES)."""
    mark = _mark_bytes(writer, [] if claimed else _names(folder), claimed)
    if is_url(folder):
        with storage.create(storage.join(folder, OUTPUT_MARK_OBJECT)) as handle:
            handle.write(mark)
        return True
    try:
        os.setxattr(folder, OUTPUT_MARK, mark, follow_symlinks=False)
    except OSError as err:
        if err.errno in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM, errno.ENOSPC, errno.E2BIG):
            return False
        raise
    return True


def _mark_bytes(writer: str, files: list[str], claimed: str = "") -> bytes:
    mark = {"writer": writer, "files": files, **({"claimed": claimed} if claimed else {})}
    return json.dumps(mark, sort_keys=True).encode()


def _mark(folder: str) -> bytes:
    """A folder's output mark, as it stands (OSError: none, or more than a mark holds: read
    bounded, as every kvtrace-written file is, before anything parses it)."""
    if is_url(folder):
        return read_bytes(storage.join(folder, OUTPUT_MARK_OBJECT), MAX_MARK_BYTES)
    raw = os.getxattr(folder, OUTPUT_MARK, follow_symlinks=False)
    if len(raw) > MAX_MARK_BYTES:  # a file system may keep 64 KiB under one name (XFS)
        raise OSError(errno.E2BIG, f"an output mark over {MAX_MARK_BYTES} bytes")
    return raw


def _mark_document(folder: str) -> tuple[bytes, dict] | None:
    """A folder's output mark, its bytes and the object they parse to (parse_json: bounded in
    depth, one line refused), None where it has none or another document."""
    try:
        raw = _mark(folder)
        mark = parse_json(raw)
    except (OSError, ValueError):  # FormatError is a ValueError
        return None
    return (raw, mark) if isinstance(mark, dict) else None


def claimed_by(folder: str, writer: str) -> str:
    """The last name writer claimed in its folder (mark_output), "" where the folder's mark is
    none of its, or holds more than such a mark holds (its bytes are exactly what it writes)."""
    document = _mark_document(folder)
    if document is None:
        return ""
    raw, mark = document
    claimed = mark.get("claimed")
    if not isinstance(claimed, str) or raw != _mark_bytes(writer, [], claimed):
        return ""
    return claimed


def is_stream_mark(folder: str, windows: int) -> bool:
    """Whether a stream's folder, its windows 0..windows-1 published, carries byte for byte a
    mark the stream writes on it as it stands: the claim of its last window or of the one after
    it (claim_window claims a window before publishing it, so a failed publish leaves that
    claim), or, before its first claim since the stream (re)started, make_stream_folder's mark
    listing the folder's names. Rebuilt and compared, never parsed: any other name, field or
    spelling is bytes kvtrace did not write (one bit free: which of the two claims)."""
    try:
        raw = _mark(folder)
    except OSError:
        return False
    claims = [window_name(i) for i in (windows - 1, windows) if i >= 0]
    written = [_mark_bytes(STREAM_WRITER, [], claim) for claim in claims]
    return raw in [*written, _mark_bytes(STREAM_WRITER, _names(folder))]


def mark_stream_object(folder: str) -> None:
    """An object store's stream folder marked as the stream's output (folder_writer names
    it): the mark's object, naming its writer and listing nothing, the same bytes whatever the
    folder holds (an object store's stream claims no window in it), so it holds no free bit."""
    with storage.create(storage.join(folder, OUTPUT_MARK_OBJECT)) as handle:
        handle.write(_mark_bytes(STREAM_WRITER, []))


def is_stream_mark_object(data: bytes) -> bool:
    """Whether bytes are the mark mark_stream_object writes (compared, never parsed)."""
    return data == _mark_bytes(STREAM_WRITER, [])


def _marked(folder: str) -> tuple[str, list[str]]:
    """The command a folder's output mark names and the files it lists, its own object
    included (none: no mark that parses)."""
    document = _mark_document(folder)
    if document is None:
        return "", []
    writer, files = document[1].get("writer"), document[1].get("files")
    if (
        not isinstance(writer, str)
        or not isinstance(files, list)
        or not all(isinstance(f, str) and "/" not in f for f in files)
    ):
        return "", []
    return writer, [*files, *([OUTPUT_MARK_OBJECT] if is_url(folder) else [])]


def check_output(output: str, own: frozenset[str] = frozenset(), flag: str = "--output") -> None:
    """Refuse an output folder holding files kvtrace did not write (or a file in its place),
    saying so by the flag that named it."""
    foreign = foreign_files(output, own)
    if foreign:
        shown = ", ".join(foreign[:5]) + (
            f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        )
        raise OutputRefused(
            f"{flag} {output} holds files kvtrace did not write ({shown}); a run replaces an "
            f"output folder whole, so it must be new, empty, or an earlier kvtrace output"
        )


@contextmanager
def output_lock(output: str, private: bool = False) -> Iterator[None]:
    """Hold the output's lock for a run (local outputs, files or folders): a second run on the
    same output is refused at once, and the holder may clear what killed runs left beside the
    output. The lock file goes with the run (one a killed run leaves is taken by the next).
    A private output's missing parents are made owner-only (storage.make_parent)."""
    if is_url(output):
        yield
        return
    storage.make_parent(output, private)
    path = lock_path(os.path.abspath(output))
    with stops_deferred():  # made and in the exit registry at once: a stop between leaves it
        handle = _take_lock(path, output)
        _BEGAN_WRITING.set()
        storage.remove_on_exit(path, functools.partial(_own_lock, path, handle))
    try:
        restore_interrupted(output)
        yield
    finally:
        # One deferred section: a stop landing before the unlink would otherwise forget the
        # lock file with it still standing.
        with stops_deferred():
            try:
                if _own_lock(path, handle):  # still held: one that opened it before sees it gone
                    os.unlink(path)
            finally:
                storage.forget_on_exit(path)
                os.close(handle)


def lock_path(output: str) -> str:
    """The file a run of a local output locks: beside it, hidden, named by it."""
    parent, name = _split(output)
    return (
        storage.join(parent, f".{_stem(name)}{LOCK_MARK}")
        if parent
        else f".{_stem(name)}{LOCK_MARK}"
    )


def _take_lock(path: str, output: str) -> int:
    """The locked descriptor of the lock file at path, which the holder removes when done: a
    file locked after its holder removed it is no lock (the path names another), so retry. A
    file of someone else's by the lock's name is locked as it stands (flock changes nothing in
    it, and every run of the output opens the same name) and never removed (_own_lock)."""
    for _ in range(LOCK_ATTEMPTS):
        try:  # O_NOFOLLOW: a link planted by the lock's name is refused, never followed;
            handle = os.open(
                path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600
            )  # O_NONBLOCK: a FIFO there never hangs
        except OSError as err:
            if err.errno != errno.ELOOP:
                raise
            raise OutputRefused(
                f"{path} is a symbolic link, not a kvtrace lock: remove it to write {output}"
            ) from None
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            os.close(handle)
            raise OutputRefused(
                f"{path} is not a plain file, so not a kvtrace lock: remove it to write {output}"
            )
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(handle)
            raise JobStopped(
                f"another kvtrace run is writing {output}; one run per output at a time"
            ) from None
        try:
            if os.stat(path).st_ino == os.fstat(handle).st_ino:
                return handle
        except FileNotFoundError:
            pass
        os.close(handle)
    raise JobStopped(f"other kvtrace runs kept taking the lock of {output}; try again")


def _own_lock(path: str, handle: int) -> bool:
    """Whether path names the locked file and it is a lock kvtrace made (empty, the running
    user's, owner-only): a file by that name that anything else wrote is never removed."""
    try:
        named = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(handle)
    return (
        (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)
        and held.st_size == 0
        and held.st_uid == os.geteuid()
        and not held.st_mode & 0o077
    )


# The names kvtrace stages under beside an output: .NAME.kvtrace-staging-ID, ID a run id (12
# hex digits) or a block-hashes folder's (16), and the same with .previous (the two-rename
# swap's previous output), .parts (Beam's synthesize writes its parts there before the file) or
# .letters (where a run's dead letters are staged: DeadLetterRun's pointer).
# Only these, and only the running user's, are cleared as leftovers.
_STAGING_ID = re.compile(r"[0-9a-f]{12}(?:[0-9a-f]{4})?(?:\.previous|\.parts|\.letters)?")
_STAGED_NAME = re.compile(rf"\..+{re.escape(STAGING_MARK)}{_STAGING_ID.pattern}", re.DOTALL)
# The name of an output's lock (lock_path): a file there is taken as it stands (it locks all
# the same), a folder there is no lock, so no run of that output could start.
_LOCK_NAME = re.compile(rf"\..+{re.escape(LOCK_MARK)}", re.DOTALL)


def staging_leftover(parent: str, entry: str, name: str) -> bool:
    """Whether entry (a name in parent) is what a run of the output name staged: its staging
    name exactly, and the running user's (a name alone proves nothing)."""
    prefix = f".{_stem(name)}{STAGING_MARK}"
    if not entry.startswith(prefix) or not _STAGING_ID.fullmatch(entry[len(prefix) :]):
        return False
    try:
        return os.lstat(os.path.join(parent, entry)).st_uid == os.geteuid()
    except FileNotFoundError:
        return False


def restore_interrupted(output: str) -> list[str]:
    """Under the output's lock: put back an output a run took away and died before replacing
    (the two-rename path), settle the letters killed runs' pointers name (while the folders
    they staged still stand, so a folder's identity is never another's), then remove killed
    runs' staging folders. Returns what went."""
    parent, name = _split(os.path.abspath(output))
    leftovers = sorted(p for p in os.listdir(parent) if staging_leftover(parent, p, name))
    previous = [p for p in leftovers if p.endswith(".previous")]
    if previous and not os.path.exists(output):
        os.rename(os.path.join(parent, previous[-1]), output)
        leftovers.remove(previous[-1])
    for pointer in [p for p in leftovers if p.endswith(LETTERS_POINTER)]:
        settle_pointed_letters(os.path.join(parent, pointer), output)
    for leftover in leftovers:
        path = os.path.join(parent, leftover)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):  # a single file's staged copy (a pointer went already)
            os.remove(path)
    return leftovers


def publish_folder(
    staging: str,
    output: str,
    own: frozenset[str] = frozenset(),
    private: bool = False,
    report: StagedFile | None = None,
    flag: str = "--output",
) -> None:
    """Replace the output folder with the staging folder, whole, and then the run's report
    (if any) with its staged file: both or neither (publish_in_place); the staging folder's
    files are durable already (storage.create syncs each). A private folder stays owner-only
    from staging through the swap: a kill at any step leaves it unreadable to others. flag:
    the option that named the output, for a refusal."""
    if is_url(output):
        check_output(output, own, flag)  # again: something may have appeared while the run ran
        with publication(None) as published:  # copies: what a hard end meets cannot be told
            _publish_remote(staging, output)
            published.append(output)
            if report:
                report.publish()
        return
    set_content_times(staging)
    storage.sync_folder(staging)
    os.chmod(staging, storage.PRIVATE_FOLDER if private else storage.PUBLIC_FOLDER)
    if not private:
        storage.unmark_private(staging)  # made private to stage; published for all to read
    check_output(output, own, flag)  # again, at the swap: files may have appeared meanwhile
    if report:
        report.stamp()
    publish_in_place([(staging, output), *(report.moves() if report else [])], own)
    if report:
        report.published = True


class StagedFolder:
    """A run's output folder while it is written: files go into path."""

    def __init__(self, path: str):
        self.path, self.withdrawn = path, False

    def withdraw(self) -> None:
        """Publish nothing: the run found it has no output (what it staged is removed)."""
        self.withdrawn = True


@contextmanager
def folder_output(
    output: str,
    writer: str = "",
    report: StagedFile | None = None,
    private: bool = False,
    gated: bool = True,
) -> Iterator[StagedFolder]:
    """An output folder checked (no foreign file) and locked before the work, which writes into
    the staging folder yielded; it is published whole when the block ends without an error,
    and removed when it does not. writer: the command, for a folder the work writes no manifest
    into (marked as its output: mark_output). A report (from file_output, entered first) the
    work wrote is published with it, last. private: published owner-only (publish_folder).
    gated: an output the audit gates (make_staging)."""
    output = folded(output)
    if not is_url(output):
        check_parent(output)
    check_output(output)
    staged = StagedFolder(staging_folder(output, new_run_id()))
    with output_lock(output):
        make_staging(staged.path, gated)
        try:
            yield staged
            if not staged.withdrawn:
                if writer:
                    mark_output(staged.path, writer)
                publish_folder(staged.path, output, private=private, report=report)
        finally:
            storage.remove_folder(staged.path)  # gone once published; else the failed run's


class StagedFile:
    """One output file of a run: written to its staging path (create, write), published whole
    when its file_output block ends without an error; without overwrite, never over a file (not
    even one that appeared while the run ran). A private one is owner-only from its staged
    copy on: the rename that publishes it keeps its mode."""

    def __init__(self, output: str, staging: str, overwrite: bool = True, private: bool = False):
        self.output, self.staging, self.overwrite = output, staging, overwrite
        self.private, self.published = private, False

    @contextmanager
    def create(self) -> Iterator[IO[bytes]]:
        """The file to write (its staged copy, synced when it closes)."""
        with storage.create(self.staging, self.private) as handle:
            yield handle

    def write(self, data: bytes) -> None:
        with self.create() as handle:
            handle.write(data)

    def moves(self) -> list[tuple[str, str]]:
        """What publishing it moves: its staged copy over the output; nothing where the work
        wrote none, or on an object store (written in place, whole once its upload completes)."""
        if self.published or self.staging == self.output or not os.path.lexists(self.staging):
            return []
        return [(self.staging, self.output)]

    def stamp(self) -> None:
        """Give the staged copy its content time, as a published folder's files have
        (manifest.set_content_time): the time a copy keeps is the content's, not the run's."""
        if self.moves():
            set_content_time(self.staging)

    def publish(self, report: StagedFile | None = None) -> None:
        """Put the written file in place, then the report (if any): both or neither."""
        for staged in (self, report) if report else (self,):
            staged.stamp()
        report_moves = report.moves() if report else []
        if self.staging == self.output:
            standing: Standing = lambda: [self.output]  # noqa: E731 - whole once uploaded
        else:
            standing = only_swaps if self.overwrite else _linked(self.staging, self.output)
        with publication(standing) as published:
            if self.staging == self.output:  # an object, whole once its upload completed
                published.append(self.output)
            if self.overwrite or not self.moves():
                publish_in_place([*self.moves(), *report_moves])
            else:  # link(2) refuses a file that appeared meanwhile; the report follows, or goes
                _publish_new(self.staging, self.output)
                try:
                    publish_in_place(report_moves)
                except BaseException:
                    os.remove(self.output)  # ours, made just now
                    raise
        self.published = True
        if report:
            report.published = True


def _publish_new(staging: str, output: str) -> None:
    """Publish a staged file where no file is: link(2) refuses an existing name in the same
    step that makes it (a check before a rename would leave a gap), then the staged name goes."""
    with publication(_linked(staging, output)) as published:
        try:
            os.link(staging, output)
        except FileExistsError:
            raise OutputRefused(
                f"{output} appeared while the run worked; --overwrite replaces it"
            ) from None
        published.append(output)
        os.unlink(staging)


def _linked(staging: str, output: str) -> Standing:
    """What stands of _publish_new: the output, once linked (the staged name gone, or both
    names one file) and not taken back out (its report refused)."""

    def standing() -> list[str]:
        linked = os.path.lexists(output) and (
            not os.path.lexists(staging) or os.path.samefile(staging, output)
        )
        return [output] if linked else []

    return standing


def check_parent(output: str) -> None:
    """Refuse a local output whose folder cannot be made or written (the nearest existing
    ancestor is a file, or not writable): said before any work, not after it."""
    ancestor = os.path.dirname(os.path.abspath(output))
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise OutputRefused(f"cannot write {output}: {ancestor} is not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputRefused(f"cannot write {output}: {ancestor} is not writable")


def check_file(output: str, overwrite: bool) -> None:
    """Refuse a file output that is a folder (or spelled as one) or not a plain file, or that
    exists when it is not to be overwritten."""
    if output.endswith("/") or posixpath.basename(output) in (".", ".."):
        raise OutputRefused(f"{output} names a folder; the output is one file")
    if is_url(output):
        if not overwrite and storage.exists(output):
            raise OutputRefused(f"{output} exists; --overwrite replaces it")
        return
    output = folded(output)
    check_parent(output)
    if not os.path.lexists(output):
        return
    if os.path.isdir(output) and not os.path.islink(output):
        raise OutputRefused(f"{output} is a folder; the output is one file")
    if not os.path.isfile(output) or os.path.islink(output):
        raise OutputRefused(f"{output} is not a plain file; kvtrace replaces only files")
    if not overwrite:
        raise OutputRefused(f"{output} exists; --overwrite replaces it")


FILE, FOLDER = "file", "folder"


@dataclass(frozen=True)
class Location:
    """A location a command writes, as its flag named it. A file is replaced whole (unless it
    exists and overwrite is False); a folder is the output of a command (writer), which
    replaces only its own, or private (owner-only: dead letters, an id map, block hashes)."""

    flag: str
    path: str
    kind: str = FILE
    private: bool = False
    overwrite: bool = True
    writer: str = ""


def plan_locations(reads: Sequence[str], writes: Sequence[Location]) -> None:
    """Every location a command reads (files, folders, globs as given, and the files they
    expand to) and writes (those without a path are not written), checked together before any
    work: no written location equal to, inside or around a read one or another written one,
    whatever the spelling; and each written one publishable (check_written). Refuses with
    OutputRefused, saying why."""
    writes = [w for w in writes if w.path]
    places = [(w, written_place(w.path)) for w in writes]
    known = Known()
    for i, (first, a) in enumerate(places):
        for second, b in places[i + 1 :]:
            if inside(a, b, known) or inside(b, a, known):
                raise OutputRefused(
                    f"{first.flag} {first.path} and {second.flag} {second.path} "
                    f"overlap: give each its own location, neither inside the "
                    f"other"
                )
            if not is_url(a) and lock_path(b) == a or not is_url(b) and lock_path(a) == b:
                raise OutputRefused(
                    f"{first.flag} {first.path} and {second.flag} {second.path}: "
                    f"one is the lock file kvtrace holds while it writes the "
                    f"other; write elsewhere"
                )
    resolved: dict[str, str] = {}  # each folder's links resolved once, however many files
    published: dict[str, bool] = {}  # whether each folder read from is a kvtrace output
    for read in reads:
        for reach in Reach.every(read, resolved):
            reach = reach.whole(published)
            for location, placed in places:
                if reach.meets(placed, location.kind == FOLDER, known):
                    raise OutputRefused(reach.refusal(location, placed, known))
    for location in writes:
        check_written(location)
    proven: set[str] = set()
    for location in writes:
        if location.kind == FOLDER and not is_url(location.path):
            prove_folder_rename(location, proven)


# The errors by which a folder refuses the probe's mkdir or rename however often it is
# retried: no access, read-only, not a folder, a name there kvtrace cannot clear, too long a
# path, too many folders in it, renames across its layers (EXDEV) or of folders unsupported.
# Those alone are "write elsewhere" (2); any other (a full disk or quota, an I/O error, the
# folder gone meanwhile) propagates, and the CLI's one rule on storage running out decides
# the exit.
UNFIT_PLACE = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENOTDIR,
        errno.EEXIST,
        errno.ENOTEMPTY,
        errno.ENAMETOOLONG,
        errno.ELOOP,
        errno.EMLINK,
        errno.EXDEV,
        errno.EINVAL,
        errno.ENOSYS,
        errno.EOPNOTSUPP,
    }
)


def prove_folder_rename(location: Location, proven: set[str]) -> None:
    """Refuse, before the work, a local folder output where folders cannot be renamed (an
    overlay filesystem without redirect_dir refuses with EXDEV): it is published by renaming
    its staging folder into place. Proved as the publish does it, in the nearest existing
    folder on its way (its parent, once made): a folder made there, renamed, removed.
    proven: folders done.

    The probe is the folder's, not an output's: a run's staging name there would be cleared
    only by a run of the output it names, which for a missing folder on the way (K/a of
    K/a/b/out) is no run at all. So it has one name per user (_probe_names), made and removed
    only under the folder's lock: whatever stands by that name when the lock is taken is a
    killed prover's, and goes first. Every later plan that proves in that folder clears it."""
    named = written_place(location.path)
    while not os.path.isdir(os.path.dirname(named)):
        named = os.path.dirname(named)
    folder = os.path.dirname(named)
    if folder in proven:
        return
    made, renamed = _probe_names(folder)
    # Made and removed in one deferred section: a stop between the two removals would leave
    # the renamed probe in the operator's folder.
    with folder_lock(folder), stops_deferred():
        _remove_probe(made, renamed)  # a killed prover's, if any
        try:
            os.mkdir(made, 0o700)
        except OSError as err:
            if err.errno not in UNFIT_PLACE:
                raise
            raise OutputRefused(
                f"{location.flag} {location.path}: no folder can be made in {folder} "
                f"({err.strerror}): write elsewhere"
            ) from None
        try:
            os.rename(made, renamed)
        except OSError as err:
            if err.errno not in UNFIT_PLACE:
                raise
            raise OutputRefused(
                f"{location.flag} {location.path}: no folder can be renamed in "
                f"{folder} ({err.strerror}), and kvtrace publishes "
                f"a folder by renaming it: write elsewhere"
            ) from None
        finally:
            _remove_probe(made, renamed)
    proven.add(folder)


# A rename probe's names (_probe_names), which prove_folder_rename removes as a killed one's.
_PROBE_NAME = re.compile(rf"{re.escape(STAGING_MARK)}probe-[0-9]+(?:\.renamed)?")


def _probe_names(folder: str) -> tuple[str, str]:
    """The rename probe's two names in folder, the running user's (another's may stand beside,
    which this user might not remove)."""
    made = os.path.join(folder, f"{STAGING_MARK}probe-{os.geteuid()}")
    return made, f"{made}.renamed"


def _remove_probe(*names: str) -> None:
    for name in names:
        with suppress(OSError):  # absent; or not an empty folder, which mkdir then refuses
            os.rmdir(name)


def written_place(path: str) -> str:
    """What a written location names (place): its own link is not followed (a link in an
    output's place is refused, never followed)."""
    return place(path)


def read_place(path: str, resolved: dict[str, str]) -> str:
    """What a read location names (place), every link resolved (resolved: folders already
    resolved, by their spelling)."""
    return place(path, follow=True, resolved=resolved)


def inside(path: str, folder: str, known: Known | None = None) -> bool:
    """Whether path is folder or lies beneath it (both placed; known: as in beneath)."""
    return bool(beneath(path, folder, known))


def beneath(path: str, folder: str, known: Known | None = None) -> list[tuple[str, ...]]:
    """The names leading from folder down to path, one tuple for each way path lies beneath
    folder (none: it does not; an empty tuple: it is folder). Local ones are compared by what
    they are, not by spelling: a folder with a second name (a bind mount, the same export
    mounted twice) is one folder, and so is a file with two (hard links). Object stores have
    names only. known: the identities read so far, by path (one plan reads each once)."""
    if is_url(path) or is_url(folder):
        prefix = folder.rstrip("/") + "/"
        if path == folder or path.startswith(prefix):
            return [tuple(n for n in path[len(prefix) :].split("/") if n)]
        return []
    known = Known() if known is None else known
    return spots_beneath(known.spots(path), known.spots(folder))


Identity = tuple[int, int]  # (st_dev, st_ino): what a path is, whatever names it
Spot = tuple[Identity, tuple[str, ...]]  # an existing folder on a path, and the names beyond


class Known:
    """The identities of local paths, each read once (a plan meets every path many times)."""

    def __init__(self) -> None:
        self._identities: dict[str, Identity | None] = {}
        self._spots: dict[str, list[Spot]] = {}

    def spots(self, placed: str) -> list[Spot]:
        """Each existing folder on the way to a placed local location (itself last, if it
        exists), by identity, with the names of the location beyond it. A placed path has no
        link before its last name, so lstat reads each name as the kernel walks it; a name
        that cannot be read (it does not exist, or is not searchable) ends the walk."""
        if placed not in self._spots:
            names = tuple(n for n in placed.split("/") if n)
            spots, prefix = [], ""
            for depth in range(len(names) + 1):
                identity = self._identity(prefix or "/")
                if identity is None:
                    break
                spots.append((identity, names[depth:]))
                prefix = f"{prefix}/{names[depth]}" if depth < len(names) else prefix
            self._spots[placed] = spots
        return self._spots[placed]

    def _identity(self, path: str) -> Identity | None:
        if path not in self._identities:
            try:
                status = os.lstat(path)
                self._identities[path] = (status.st_dev, status.st_ino)
            except OSError:
                self._identities[path] = None
        return self._identities[path]


def spots_beneath(path: Sequence[Spot], folder: Sequence[Spot]) -> list[tuple[str, ...]]:
    """beneath, by spots: the folder's last existing name is one of the path's folders, and
    the names the folder has beyond it (not made yet) begin the path's names beyond that one;
    what follows them leads to the path."""
    if not folder:
        return []
    identity, beyond = folder[-1]
    return [
        names[len(beyond) :]
        for spot, names in path
        if spot == identity and names[: len(beyond)] == beyond
    ]


@dataclass(frozen=True)
class Reach:
    """What reading one path or glob reads: the place itself, or for a glob, what its
    wildcards match beneath its folder (everything beneath it, for an object store's **). A
    local glob is read by glob(3) (paths.expand_inputs), where ** is one name's *: so is it
    here, its folders walked as glob walks them (every), links included."""

    read: str
    place: str
    wildcards: tuple[str, ...] | None = None  # None: a path, not a glob
    recursive: bool = False

    @classmethod
    def of(cls, read: str, resolved: dict[str, str]) -> Reach:
        """An existing path is that path, whatever its characters (the readers read it so)."""
        if not glob.has_magic(read) or os.path.lexists(read):
            return cls(read, read_place(read, resolved))
        head = read[: min(read.find(c) for c in "*?[" if c in read)]
        cut = head.rfind("/") + 1
        return cls(
            read,
            read_place(read[:cut] or ".", resolved),
            tuple(p for p in read[cut:].split("/") if p),
            "**" in read and is_url(read),
        )

    @classmethod
    def every(cls, read: str, resolved: dict[str, str]) -> list[Reach]:
        """The reach of a read (of), and for a glob with wildcards in its folders, that of its
        last name in each folder they match now, placed as glob(3) walks them (through `..`
        and links, which the wildcards, matched name by name, would miss)."""
        reach = cls.of(read, resolved)
        if reach.wildcards is None or reach.recursive or len(reach.wildcards) < 2:
            return [reach]
        folders, last = read.rsplit("/", 1)
        return [
            reach,
            *(
                cls(read, read_place(folder, resolved), (last,))
                for folder in sorted(glob.glob(folders))
                if os.path.isdir(folder)
            ),
        ]

    def whole(self, published: dict[str, bool]) -> Reach:
        """The reach widened to the whole kvtrace output it reads part of (a shard, or a glob
        of its shards): an output is read, and so published, only whole. published: whether
        each folder is one, by its place."""
        folder = self.place if self.wildcards is not None else posixpath.dirname(self.place)
        if folder not in published:
            published[folder] = bool(_listed(folder))
        if not published[folder]:
            return self
        return Reach(f"{self.read} (part of the kvtrace output {folder})", folder)

    def meets(self, place: str, folder: bool = False, known: Known | None = None) -> bool:
        """Whether a written place is read, holds what is read, or would be read next run:
        what the glob could match lies in it (a folder: its names match the glob's first
        ones, the rest free) or it lies in what the glob matches. known: as in beneath."""
        if inside(self.place, place, known):
            return True
        ways = beneath(place, self.place, known)
        if not ways or self.wildcards is None or self.recursive:
            return bool(ways)
        return any(
            below
            and (folder or len(below) >= len(self.wildcards))
            and all(fnmatchcase(name, part) for name, part in zip(below, self.wildcards))
            for below in ways
        )

    def refusal(self, location: Location, place: str, known: Known | None = None) -> str:
        where = f"{location.flag} {location.path}"
        if self.wildcards is None and () in beneath(place, self.place, known):
            return f"{where} is the input {self.read}: an output never replaces what the run reads"
        if inside(self.place, place, known):
            return (
                f"input {self.read} lies inside {where}: an output never replaces what the "
                f"run reads"
            )
        if self.wildcards is not None:
            return (
                f"{where} is in the folder input {self.read} reads; write elsewhere, or the "
                f"next run would read its own output"
            )
        return f"{where} lies inside input {self.read}: write elsewhere"


def check_written(location: Location) -> None:
    """A written location that can be published: a local one's folder can be made, its name
    fits the filesystem, it is no link; none inside a command's output folder; a file no
    folder (check_file); a folder no file, not another command's output (its manifest or
    output mark says which), holding nothing kvtrace did not write (check_output); a private
    one that can be made owner-only, no command's output (a private folder holds what a map,
    its marks or dead letters hold, which no output lists: never checked as an output); a local
    one not a mount point (it cannot be swapped). Local or URL alike, but for what only a local
    folder has (its parent, links, owner, permissions); every refusal names location's flag."""
    path, flag = folded(location.path), location.flag
    if location.path == "-":  # a pipe cannot be staged and renamed whole, and '-' reads as one
        raise OutputRefused(
            f"{flag} -: kvtrace writes only what it can publish whole (staged, then "
            f"renamed), which standard output is not; name a file"
        )
    if not is_url(path) and len(os.fsencode(os.path.basename(written_place(path)))) > NAME_MAX:
        raise OutputRefused(f"{flag} {path}: a name longer than {NAME_MAX} bytes")
    # kvtrace's own names beside an output, by the rules its runs find them by (a staging
    # leftover, a rename probe, a lock), are no output, file or folder: a run clears a staging
    # name or a probe as a killed run's, and a lock holds by the inode a run opens at that
    # name, which publishing a file there (a rename) replaces, so the next run of that output
    # would lock a new one and run beside the holder.
    name = posixpath.basename(path)
    if _STAGED_NAME.fullmatch(name) or _PROBE_NAME.fullmatch(name):
        raise OutputRefused(
            f"{flag} {path}: a name kvtrace stages its outputs under (and "
            f"clears as a killed run's leftover); choose another"
        )
    if _LOCK_NAME.fullmatch(name):
        raise OutputRefused(
            f"{flag} {path}: a name kvtrace locks an output by (one more "
            f"run of that output could start beside its holder); choose another"
        )
    if not is_url(path) and not os.path.islink(path) and os.path.ismount(path):
        raise OutputRefused(
            f"{flag} {path} is a mount point, which kvtrace cannot replace "
            f"whole: name a location inside it"
        )
    if location.kind == FILE and TRACE_FILE.fullmatch(posixpath.basename(path)):
        raise OutputRefused(
            f"{flag} {path}: a shard's name, which kvtrace's readers take only "
            f"with its folder's manifest (a lone one is refused as a partial "
            f"copy); choose another"
        )
    if location.kind == FILE:
        check_file(location.path, location.overwrite)  # as spelled: out/ names a folder
        _check_not_in_an_output(location, path)
        if location.private and not is_url(path):  # staged beside it, as make_folder finds it
            _check_private_parent(location, os.path.dirname(written_place(path)))
        return
    _check_not_in_an_output(location, path)
    local = not is_url(path)
    if local:
        check_parent(path)
        if os.path.islink(written_place(path)):
            raise OutputRefused(
                f"{flag} {path} is a symbolic link; kvtrace writes its own folder "
                f"there, never through a link: name the folder itself"
            )
        if os.path.exists(path) and not os.path.isdir(path):
            raise OutputRefused(f"{flag} {path} is a file; it names a folder")
    writer = folder_writer(path)
    if location.writer and writer and writer != location.writer:
        raise OutputRefused(
            f"{flag} {path} is an output of kvtrace {writer}; "
            f"{location.writer} replaces only its own: write elsewhere"
        )
    if location.private:
        _check_private(location, writer)
    if location.writer:
        check_output(path, flag=flag)
    if local and location.private and os.path.isdir(path) and os.stat(path).st_uid != os.geteuid():
        raise OutputRefused(
            f"{flag} {path} belongs to another user, so it cannot be made "
            f"owner-only; give a folder of your own"
        )


def _check_private(location: Location, writer: str) -> None:
    """A private folder is no command's output (writer: the one path is, if any): it would
    replace a published output."""
    if writer:
        raise OutputRefused(
            f"{location.flag} {location.path} is an output of kvtrace {writer}; "
            f"private files never go there: write elsewhere"
        )
    path = location.path
    if not is_url(path) and os.path.isdir(path) and not storage.is_private_folder(path):
        unfit = storage.unfit_for_private_files(path)  # as make_folder finds it: before the work
        if unfit:
            raise OutputRefused(f"{location.flag} {unfit}")


def _check_private_parent(location: Location, parent: str) -> None:
    """A private file's folder (made owner-only if missing) holds no one else's writes."""
    if os.path.isdir(parent) and not storage.is_private_folder(parent):
        unfit = storage.unfit_for_private_files(parent)
        if unfit:
            raise OutputRefused(f"{location.flag} {location.path}: {unfit}")


def _check_not_in_an_output(location: Location, path: str) -> None:
    """Nothing is written inside a command's output folder, at any depth: that folder is
    published whole, by its command alone, and a file or folder added or replaced in it leaves
    it no longer whole. (Replacing one whole is check_written's.)"""
    folder = posixpath.dirname(path if is_url(path) else written_place(path))
    while not is_url(path) or "://" in folder:
        writer = folder_writer(folder)
        if writer:
            raise OutputRefused(
                f"{location.flag} {location.path} lies inside {folder}, an "
                f"output of kvtrace {writer}, which only its command replaces, "
                f"whole: write elsewhere"
            )
        if not is_url(folder) and storage.is_private_folder(folder):
            raise OutputRefused(
                f"{location.flag} {location.path} lies inside {folder}, a "
                f"private folder of kvtrace's (dead letters, an id map, its "
                f"marks, block hashes), which only its own runs write: write "
                f"elsewhere"
            )
        if folder == posixpath.dirname(folder):
            return
        folder = posixpath.dirname(folder)


def folder_writer(folder: str) -> str:
    """The kvtrace command whose output the folder is ("" for none): by its manifest (a derived
    trace's names its command, as an older convert's says what it converted; anonymize's is any
    other trace manifest), else by its output mark (mark_output), never by its files' names."""
    manifest = _manifest(folder)
    if isinstance(manifest, dict) and manifest.get("format") == FORMAT:
        derived = manifest.get(DERIVED_FROM)
        if isinstance(derived, dict) and derived.get("command") in DERIVING_COMMANDS:
            return derived["command"]
        return "convert" if "converted_from" in manifest else "anonymize"
    return _marked(folder)[0]


@contextmanager
def file_output(
    output: str, overwrite: bool = True, report: StagedFile | None = None, private: bool = False
) -> Iterator[StagedFile]:
    """An output file checked (check_file) and locked before the work; the work writes it with
    StagedFile.create (or write), and it is published when the block ends without an error (a
    report, from file_output entered first, with it, last); what a failed or killed run staged
    never reaches it. private: owner-only (StagedFile)."""
    check_file(output, overwrite)
    output = folded(output)
    if is_url(output):
        staged = StagedFile(output, output, private=private)
        yield staged
        staged.publish(report)
        return
    staged = StagedFile(output, staging_folder(output, new_run_id()), overwrite, private)
    with output_lock(output):
        try:
            yield staged
            staged.publish(report)
        finally:
            for leftover in (staged.staging, f"{staged.staging}.previous"):
                if os.path.lexists(leftover):
                    os.remove(leftover)


class DeadLetterRun:
    """One run's dead letters: staged in a hidden, owner-only folder of the dead-letter folder
    (both engines write the same one file there), published as rejected-RUNID.jsonl when the
    run's output is published, so no run overwrites another's and no letters stand for an
    output that was never published.

        DEAD/.KEY.kvtrace-staging-RUNID/     the run's letters while it runs (KEY: its output's)
        DEAD/rejected-RUNID.jsonl            a published run's letters

    Whether the output was published is read from what stands, never from a mark on the
    output (the published folder carries nothing kvtrace does not publish): the run writes a
    pointer beside the folder it stages (STAGING.letters: its run id, its dead-letter folder's
    place, its letters' key, and the staged folder's identity, st_dev and st_ino, which a
    rename keeps) before it stages a letter. Whoever settles it (the run itself, or the next
    run of the output under its lock: restore_interrupted) publishes the letters if the
    output is that folder, drops them if the folder is still staged (never swapped in), and
    otherwise (the output moved away since) leaves them staged, naming that identity, for a
    run of the folder wherever it is now (recover_letters). The pointer is settled while the
    staged folder still stands (by its own run, by the next run before it clears staging, by
    a hard end's registry only once the folder is gone unpublished), so an identity is never
    taken for a later folder's. So a run that fails after publishing (a full disk while it
    tidies up) still publishes its letters, a run that fails before publishes none (its rerun
    writes them: a step of the settle that fails is settled once more, a drop first has the
    letters name no folder, so what a failed removal leaves a run of the output drops, and
    while the pointer stands no cleanup of the run removes the staged folder it names, so the
    next run of the output still drops them), and a run killed in between is settled by the
    next run of that output, whatever its dead-letter folder. Object stores keep no identity:
    there the run's own word decides, and a killed run's letters go.
    """

    # Present (naming the staged folder's identity) once the run's pointer is written: from
    # then on only the pointer, or a run of that folder, settles the letters.
    PUBLISHES = "publishes"

    def __init__(self, folder: str, output: str, run_id: str):
        self.folder, self.output, self.run_id = folder.rstrip("/"), output, run_id
        self.made_folder = False  # by begin: removed again if the run publishes no letter
        self.pointer: str | None = None  # by begin, where the output's identity is kept
        if not is_url(output):  # as its lock makes it: the folder's identity keys the letters
            storage.make_folder(os.path.dirname(written_place(output)))
        self.staging = _letters_staging(self.folder, output, run_id)

    @property
    def published(self) -> str:
        return storage.join(self.folder, f"rejected-{self.run_id}.jsonl")

    def begin(self, output_staging: str) -> None:
        """Under the output's lock, once its staging folder (or file) exists: the letters'
        staging made, and the pointer from the staged output to them written (the pointer
        first: a kill before the letters say whom they stand for leaves them to go)."""
        self.made_folder = not storage.exists(self.folder)
        storage.make_folder(self.folder, private=True)
        if self.made_folder:  # a hard end leaves no folder of a run that rejected nothing
            storage.remove_on_exit(self.folder, only_if_empty=True)
        storage.make_folder(self.staging, private=True)
        if is_url(output_staging):
            return
        identity = _identity(output_staging)
        pointer = f"{output_staging}{LETTERS_POINTER}"
        settle_pointed_letters(pointer, self.output)  # a killed attempt's (a stream's files)
        # A stop waits for the pointer to be written and known (self.pointer, the exit's
        # cleanup): landing between the two, it left the pointer behind a stopped run.
        with stops_deferred():
            _write_pointer(
                pointer,
                {
                    "folder": identity,
                    "key": output_key(self.output),
                    "letters": place(self.folder),
                    "run": self.run_id,
                },
            )
            self.pointer = pointer
            # A hard end removes the pointer (and the letters) only while the output is not
            # the folder: a published run's are the next run's to settle. Each link of the
            # chain goes only after the one it tells of: the pointer once its letters are
            # gone, the staged output (which tells them unpublished) once its pointer is, by
            # every cleanup of the run (a failure's run_folders too): whatever removal fails,
            # what stands still tells the next run of the output to drop the letters.
            unpublished = functools.partial(_is_not, self.output, identity)
            storage.remove_on_exit(
                pointer, functools.partial(_letters_gone, self.output, identity, self.staging)
            )
            storage.remove_on_exit(self.staging, unpublished)
            storage.remove_on_exit(output_staging, functools.partial(_gone, pointer))
        with storage.create(storage.join(self.staging, self.PUBLISHES), private=True) as handle:
            handle.write(json.dumps(identity).encode())

    def settle(self, run_succeeded: bool) -> list[str]:
        """Publish the letters (and measured file) if the run's output is published, else
        remove them; whether it is published is read from the output where the run could keep
        its pointer, else it is the run's word. Returns the files published. One publication:
        a stop waits for it, so the letters are settled whole."""
        with publication(_letters_standing(self.folder, self.run_id)):
            if self.pointer is not None:
                try:
                    published = settle_pointed_letters(self.pointer, self.output)
                except OSError:
                    # Once more, from what stands; should that fail too, the pointer stands,
                    # and with it the staged folder it names (no cleanup of the run removes
                    # it meanwhile: begin), which the next run of the output settles first.
                    # The failure stays the run's.
                    with suppress(OSError):
                        settle_pointed_letters(self.pointer, self.output)
                    raise
            else:
                published = _settle_staged(
                    self.folder, self.run_id, self.staging, publish=run_succeeded
                )
            storage.forget_on_exit(self.staging)
        if self.made_folder:
            if not published:  # made for this run, which rejected nothing: only while empty
                storage.remove_empty_folder(self.folder)
            storage.forget_on_exit(self.folder)
        return published


def _letters_staging(folder: str, output: str, run_id: str) -> str:
    """Where a run of output stages its letters in the dead-letter folder."""
    return storage.join(folder, f".{output_key(output)}{STAGING_MARK}{run_id}")


# The suffix of a run's pointer to its letters, beside the folder it stages (DeadLetterRun).
LETTERS_POINTER = ".letters"
MAX_POINTER_BYTES = 4096


def settle_pointed_letters(pointer: str, output: str) -> list[str]:
    """Under the output's lock: the letters (and measured file) a run's pointer names, settled
    by what stands: published if the output is the folder the run staged (by its identity),
    dropped if that folder is still staged beside the pointer (never swapped in), otherwise
    (the output moved away since) left staged for a run of that folder (recover_letters). The
    pointer goes last: a kill before leaves it to settle again. Returns the files published."""
    pointed = _read_pointer(pointer)
    settled: list[str] = []
    if pointed is not None:
        run_id, letters, key, identity = pointed
        staging = storage.join(letters, f".{key}{STAGING_MARK}{run_id}")
        if _identity(output) == identity:
            settled = _settle_staged(letters, run_id, staging, publish=True)
        elif _identity(pointer[: -len(LETTERS_POINTER)]) == identity:
            _settle_staged(letters, run_id, staging, publish=False)
    with suppress(FileNotFoundError):
        os.remove(pointer)
    storage.forget_on_exit(pointer)
    return settled


def _write_pointer(pointer: str, pointed: dict[str, object]) -> None:
    """A new owner-only file beside the staged output, durable before a letter is staged: the
    output's parent is the user's, so nothing is made or changed there but this one name."""
    handle = os.open(
        pointer, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        os.write(handle, json.dumps(pointed, sort_keys=True).encode())
        os.fsync(handle)
    finally:
        os.close(handle)
    storage.sync_folder(os.path.dirname(os.path.abspath(pointer)))


def _read_pointer(pointer: str) -> tuple[str, str, str, list[int]] | None:
    """The run id, dead-letter folder place, letters' key and staged folder's identity a
    pointer names (None: no pointer, or none kvtrace writes: another user's or not a plain
    file, a run id that is a path, a place that is relative, a key not of output_key's
    form)."""
    try:
        if os.lstat(pointer).st_uid != os.geteuid():
            return None
        pointed = json.loads(read_bytes(pointer, MAX_POINTER_BYTES))
        run_id, letters, key, identity = (pointed[k] for k in ("run", "letters", "key", "folder"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if (
        set(pointed) != {"folder", "key", "letters", "run"}
        or not isinstance(key, str)
        or not re.fullmatch("[0-9a-f]{12}", key)
        or not isinstance(run_id, str)
        or not isinstance(letters, str)
        or not _plain_name(run_id)
        or not (is_url(letters) or os.path.isabs(letters))
        or folded(letters) != letters
        or not _is_identity(identity)
    ):
        return None
    return run_id, letters, key, identity


def _identity(path: str) -> list[int] | None:
    """A local folder's (or file's) identity, which a rename keeps: [st_dev, st_ino]."""
    try:
        status = os.lstat(path)
    except OSError:
        return None
    return [status.st_dev, status.st_ino]


def _is_identity(value: object) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value)
    )


def _is_not(output: str, identity: list[int] | None) -> bool:
    return _identity(output) != identity


def _letters_gone(output: str, identity: list[int] | None, letters: str) -> bool:
    """Whether an unpublished run's pointer may go: its letters are gone already."""
    return _is_not(output, identity) and not os.path.lexists(letters)


def _gone(path: str) -> bool:
    return not os.path.lexists(path)


def _settle_staged(folder: str, run_id: str, staging: str, publish: bool) -> list[str]:
    """A run's staged letters published as rejected-RUNID.jsonl and its measured file (joined
    while the output was staged: read/measured.join_measured) as measured-RUNID.jsonl, those
    it has, if publish; then its staging folder removed. Renames only: settling a published
    run's letters needs no space. Returns the files published."""
    staged = (
        (DEAD_LETTER_FILE, f"rejected-{run_id}.jsonl"),
        (MEASURED_STAGED, measured_file(run_id)),
    )
    renames = [
        (storage.join(staging, name), storage.join(folder, final))
        for name, final in staged
        if publish and storage.exists(storage.join(staging, name))
    ]
    if not publish and not is_url(staging):
        # Naming no folder first: whatever a failed removal leaves, a rerun drops
        # (recover_letters), never takes for a published folder's.
        with suppress(FileNotFoundError, NotADirectoryError):
            os.remove(os.path.join(staging, DeadLetterRun.PUBLISHES))
    if renames:
        with publication(_letters_standing(folder, run_id)) as published:
            for source, destination in renames:
                storage.rename(source, destination)
                published.append(destination)
        storage.sync_folder(folder)
    storage.remove_folder(staging)
    return [destination for _, destination in renames]


def _letters_standing(folder: str, run_id: str) -> Standing:
    """What stands of a run's letters' publication: their files, once renamed in."""
    names = (f"rejected-{run_id}.jsonl", measured_file(run_id))
    return lambda: [
        path for path in (storage.join(folder, name) for name in names) if storage.exists(path)
    ]


def recover_letters(folder: str, output: str) -> list[str]:
    """Under the output's lock (its killed runs' pointers settled: restore_interrupted), before
    the run stages anything: in folder, publish the letters of a run whose staged folder is
    this output (one moved here since its run; by the identity they name), and drop those of
    this output's runs that never wrote a pointer. Letters of this output's name that name
    another folder stay: that folder was published and moved away, and a run of it settles
    them. Returns the run ids whose letters or measured file were published."""
    if is_url(folder) or not os.path.isdir(folder):
        return []
    here, own = _identity(output), f".{output_key(output)}{STAGING_MARK}"
    published = []
    for name in sorted(os.listdir(folder)):
        if not name.startswith(".") or STAGING_MARK not in name:
            continue
        staged, run_id = os.path.join(folder, name), name.rsplit(STAGING_MARK, 1)[1]
        stands_for = _staged_for(staged)
        if here is not None and stands_for == here and _plain_name(run_id):
            if _settle_staged(folder, run_id, staged, publish=True):
                published.append(run_id)
        elif name.startswith(own) and stands_for is None:
            _settle_staged(folder, run_id, staged, publish=False)
    return published


def _staged_for(staged: str) -> list[int] | None:
    """The identity of the folder staged letters stand for (None: they name none)."""
    try:
        identity = json.loads(
            read_bytes(storage.join(staged, DeadLetterRun.PUBLISHES), MAX_POINTER_BYTES)
        )
    except (OSError, ValueError):
        return None
    return identity if _is_identity(identity) else None


def output_key(output: str) -> str:
    """A short name for an output location, the same however it is reached: a local one's by
    what its folder is (st_dev, st_ino: a second mount of it is the same folder, as the plan
    compares places) and its name's bytes (names are bytes, whatever their encoding)."""
    if is_url(output):
        return sha256_of(os.fsencode(output.rstrip("/")))[:12]
    parent, name = os.path.split(written_place(output))
    status = os.stat(parent)
    return sha256_of(b"%d:%d/" % (status.st_dev, status.st_ino) + os.fsencode(name))[:12]


def _plain_name(name: str) -> bool:
    return bool(name) and "/" not in name and not name.startswith(".") and "\0" not in name


def _exchange(first: str, second: str) -> bool:
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    result = renameat2(
        _AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE
    )
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), second)


def _publish_remote(staging: str, output: str) -> None:
    """Object stores: the old manifest goes first (the folder stops claiming completeness),
    then the files, then the manifest."""
    old = storage.join(output, MANIFEST)
    if storage.exists(old):
        storage.delete([old])
    names = storage.files_in(staging)  # folders by their names as spelled, never as globs
    for name in sorted(names, key=lambda n: n == MANIFEST):
        storage.rename(storage.join(staging, name), storage.join(output, name))
    listed = set(names)
    stale = [storage.join(output, n) for n in storage.files_in(output) if n not in listed]
    if stale:
        storage.delete(stale)


def publish_in_place(moves: Sequence[tuple[str, str]], own: frozenset[str] = frozenset()) -> None:
    """Put each staged file or folder in its output's place, in order (a report last: a reader
    takes it for the mark that its output is whole), then sync their folders: if a step fails,
    those done are put back, so a run publishes all of them or none. The previous outputs are
    removed once all stand, a previous folder only if, swapped out, it holds nothing kvtrace
    did not write (own: as in foreign_files); else all is put back and the run refused. One
    publication (within an enclosing one, part of it): a stop is raised once all
    stand or all are put back; a kill between two moves leaves the first new and the rest
    previous (POSIX renames one name at a time)."""
    with publication(only_swaps) as published:  # a failure puts back its swaps
        for staged, output in moves:
            _check_previous(output, _recorded_swap(staged, output), own)
        for parent in dict.fromkeys(os.path.dirname(os.path.abspath(o)) for _, o in moves):
            storage.sync_folder(parent)
        published.extend(output for _, output in moves)


def _recorded_swap(staged: str, output: str) -> str | None:
    """_swap_in, recorded in the publication under way as it is made; none once a hard end
    abandoned the publications. Returns where the previous output went."""
    with _SWAPPING:
        if _ABANDONED.is_set():
            raise JobStopped("stopped at the deadline; the publication was put back")
        previous = _swap_in(staged, output)
        _OPEN_PUBLICATIONS[-1].swaps.append((staged, output, previous))
        return previous


def _undo(swaps: list[tuple[str, str, str | None]]) -> None:
    """Put back the swaps of a publication that failed, the latest first."""
    with _SWAPPING:
        while swaps:
            _swap_back(*swaps.pop())


def _remove_previous(swaps: Sequence[tuple[str, str, str | None]]) -> None:
    """The previous outputs of a publication that stands whole."""
    for _, _, previous in swaps:
        if previous is None:
            continue
        if os.path.isdir(previous) and not os.path.islink(previous):
            shutil.rmtree(previous)
        else:
            os.remove(previous)


def _check_previous(output: str, previous: str | None, own: frozenset[str]) -> None:
    """Refuse a previous output folder holding a file kvtrace did not write: one added after
    the run's check, before the swap, is never removed with the folder."""
    if previous is None or not os.path.isdir(previous) or os.path.islink(previous):
        return
    foreign = foreign_files(previous, own)
    if foreign:
        raise OutputRefused(
            f"{output} gained files kvtrace did not write while the run "
            f"published it ({', '.join(foreign[:5])}); nothing was replaced"
        )


def _swap_in(staged: str, output: str) -> str | None:
    """Put staged in output's place; returns where the previous output went (None: none was)."""
    if not os.path.lexists(output):
        try:
            os.rename(staged, output)
            return None
        except OSError as err:
            if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    if _exchange(staged, output):
        return staged
    previous = f"{staged}.previous"
    os.rename(output, previous)  # a gap restore_interrupted closes if the run dies here
    os.rename(staged, output)
    return previous


def _swap_back(staged: str, output: str, previous: str | None) -> None:
    """Undo _swap_in: the new output back to staged, the previous one (if any) in place."""
    if previous == staged:
        _exchange(staged, output)
        return
    os.rename(output, staged)
    if previous is not None:
        os.rename(previous, output)
