"""Files the jobs write and read back (trace shards, manifests, id maps): local paths through the
os module, URLs (gs://, s3://, ...) through Beam's filesystems.

Local files are durable when closed (flushed and fsynced: a commit that follows them never lists
a file a crash could still lose) and private files are owner-only from their first byte (0600 in
0700 folders). Object stores have neither notion: their writes are durable when the upload
completes, and access is the bucket's IAM.

Importing Beam costs ~3.5 s here, more than loading a tokenizer: a local run never pays it.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import io
import logging
import os
import posixpath
import re
import shutil
import stat
import struct
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

_LOG = logging.getLogger("kvtrace")
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://")


def is_url(path: str) -> bool:
    """A path on a Beam filesystem (gs://, s3://, ...), not on this machine's."""
    return bool(_URL.match(path))


def folded(path: str) -> str:
    """A location with `.`, repeated and trailing slashes folded (a local one stays relative
    when given so): out/. and out/ are both out. A local one with `..` is placed (place): the
    kernel resolves `..` after the links before it, so no lexical fold may cross one; `.`
    alone is placed too, so that it has a name and a parent to stage beside."""
    if is_url(path):
        scheme, rest = path.split("://", 1)
        return f"{scheme}://{posixpath.normpath('/' + rest).lstrip('/')}" if rest else path
    if not path:
        return path
    if ".." in path.split("/") or os.path.normpath(path) == ".":
        return place(path)
    return os.path.normpath(path)


def place(path: str, follow: bool = False, resolved: dict[str, str] | None = None) -> str:
    """Where the kernel puts a location: absolute, its parent's links resolved and then its
    `..` (never a lexical fold across a link); `~` is a name like any other (a shell expands
    it before kvtrace sees it). Its own link is followed only if follow (a read; a written
    location never goes through a link). resolved: parents already resolved, by spelling.
    Every comparison of the plan and every path opened for a write go through here, so what is
    checked is what is written."""
    if is_url(path):
        return folded(path)
    absolute = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    parent, name = os.path.split(absolute)
    if name in ("", ".", ".."):  # the folder itself: no name of its own to keep unresolved
        return os.path.realpath(absolute)
    resolved = {} if resolved is None else resolved
    if parent not in resolved:
        resolved[parent] = os.path.realpath(parent)
    placed = os.path.join(resolved[parent], name)
    return os.path.realpath(placed) if follow and os.path.islink(placed) else placed


def _beam() -> Any:
    """Beam's filesystems behind storage's one error boundary (_Bounded)."""
    from apache_beam.io.filesystems import FileSystems

    return _Bounded(FileSystems)


@contextmanager
def _as_os_error() -> Iterator[None]:
    """Any error of Beam's filesystems raised as an OSError: each store raises its own (S3's
    S3ClientError for a refused upload, GCS's API errors), which no caller could list, and
    every caller handles a refusal of a store as it handles a local file system's."""
    try:
        yield
    except OSError:
        raise
    except Exception as err:
        raise OSError(f"{type(err).__name__}: {err}".splitlines()[0]) from err


class _Bounded:
    """Beam's FileSystems, each call under _as_os_error; a file one opens is a _BoundedFile."""

    def __init__(self, filesystems: Any) -> None:
        self._filesystems = filesystems

    def __getattr__(self, name: str) -> Callable[..., Any]:
        call = getattr(self._filesystems, name)

        def bounded(*args: Any, **kwargs: Any) -> Any:
            with _as_os_error():
                result = call(*args, **kwargs)
            return _BoundedFile(result) if isinstance(result, io.IOBase) else result

        return bounded


class _BoundedFile(io.BufferedIOBase):
    """A file Beam's filesystems opened, its reads, writes and close under _as_os_error (an
    object store uploads on write and close, downloads on read)."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file
        self._closing = False  # its close, even a failed one, ends it: no flush after

    def readable(self) -> bool:
        return self._file.readable()

    def writable(self) -> bool:
        return self._file.writable()

    def seekable(self) -> bool:
        return self._file.seekable()

    def read(self, size: int | None = -1) -> bytes:
        with _as_os_error():
            return self._file.read(size)

    def read1(self, size: int = -1) -> bytes:
        with _as_os_error():
            return self._file.read1(size)

    def readinto(self, buffer: Any) -> int:
        with _as_os_error():
            return self._file.readinto(buffer)

    def readline(self, size: int | None = -1) -> bytes:
        with _as_os_error():
            return self._file.readline(size)

    def write(self, data: Any) -> int:
        with _as_os_error():
            return self._file.write(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        with _as_os_error():
            return self._file.seek(offset, whence)

    def tell(self) -> int:
        with _as_os_error():
            return self._file.tell()

    def flush(self) -> None:
        if not self._closing:
            with _as_os_error():
                self._file.flush()

    def close(self) -> None:
        if self.closed:
            return
        self._closing = True
        try:
            with _as_os_error():
                self._file.close()
        finally:
            super().close()


def join(directory: str, *names: str) -> str:
    if is_url(directory):
        return _beam().join(directory, *names)
    return os.path.join(directory, *names)


class UnfitFile(ValueError):
    """A file that is not a regular file within its size bound; the message is one line."""


def open_regular(
    path: str | os.PathLike, max_bytes: int | None = None, follow_links: bool = False
) -> tuple[IO[bytes], int]:
    """A local regular file opened for reading, and its size, at most max_bytes (None: any).
    UnfitFile if it is anything else; OSError if it cannot be opened.

    Opened without waiting (a FIFO would block the open itself until a writer came) and looked
    at on the open descriptor, which is what is read: nothing swapped in after a check is read.
    A device is looked at before it is opened too (opening one can act: a tape rewinds). A link
    is refused unless follow_links. A size is trusted only if it is the file's length: a /proc
    or /sys file says 0 and holds bytes, so a file of size 0 is read one byte to see."""
    _check_regular(os.stat(path) if follow_links else os.lstat(path), path, max_bytes)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    descriptor = os.open(path, flags)
    try:
        status = os.fstat(descriptor)
        _check_regular(status, path, max_bytes)
        if status.st_size == 0 and os.pread(descriptor, 1, 0):
            raise UnfitFile(
                f"{path} says it is empty but is not (a /proc or /sys file): its "
                "size cannot be trusted"
            )
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb"), status.st_size
    except BaseException:
        os.close(descriptor)
        raise


def _check_regular(status: os.stat_result, path: str | os.PathLike, max_bytes: int | None) -> None:
    if stat.S_ISLNK(status.st_mode):
        raise UnfitFile(f"{path} is a link, not a regular file")
    if not stat.S_ISREG(status.st_mode):
        raise UnfitFile(f"{path} is not a regular file (a FIFO, device, socket or folder)")
    if max_bytes is not None and status.st_size > max_bytes:
        raise UnfitFile(f"{path}: {status.st_size} bytes, over the {max_bytes} bytes allowed")


def open_read(path: str) -> IO[bytes]:
    """The file's bytes as stored (no decompression)."""
    if is_url(path):
        from apache_beam.io.filesystem import CompressionTypes

        return _beam().open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    return open(path, "rb")


PRIVATE_FILE, PRIVATE_FOLDER = 0o600, 0o700
PUBLIC_FILE, PUBLIC_FOLDER = 0o644, 0o755

SELINUX_ATTRIBUTE = "security.selinux"
FS_IOC_GETFLAGS, FS_IOC_SETFLAGS = 0x80086601, 0x40086602  # linux/fs.h: lsattr, chattr
# The inode flags a file system or its admin sets, no choice of kvtrace's nor of the user's per
# file, so never cleared by inherit_nothing and never flagged by the gate: ext4 maps a file's
# blocks by extents, indexes a folder by name hashes once it outgrows a block, keeps a small
# file's bytes inside its inode; an encrypted tree (fscrypt), a verity file, a case-folding
# folder and a project quota's inheritance are a whole tree's policy, set where it is made.
FS_EXTENT_FL, FS_INDEX_FL, FS_INLINE_DATA_FL = 0x00080000, 0x00001000, 0x10000000
FS_ENCRYPT_FL, FS_VERITY_FL = 0x00000800, 0x00100000
FS_CASEFOLD_FL, FS_PROJINHERIT_FL = 0x40000000, 0x20000000
FILE_SYSTEMS_OWN_FLAGS = (
    FS_EXTENT_FL
    | FS_INDEX_FL
    | FS_INLINE_DATA_FL
    | FS_ENCRYPT_FL
    | FS_VERITY_FL
    | FS_CASEFOLD_FL
    | FS_PROJINHERIT_FL
)
# What the ioctl fails with on a file system that keeps no inode flags
NO_INODE_FLAGS = frozenset({errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS})


def foreign_metadata(
    path: str, name: str, kept: frozenset[str] = frozenset(), owners: bool = True
) -> list[str]:
    """What a local entry carries that kvtrace does not set, one line each, as the gate names
    it (stats/audit.py holds every published entry to this, and a run its output's staging
    folder before any work): inode flags but the file system's own (chattr: set by the owner
    without privilege, archived by bsdtar), extended attributes but the SELinux label (and kept
    ones: a staging folder's private mark; every namespace carries bytes, an ACL's entries
    uids), and if owners an owner or group other than the user's own (foreign_owners)."""
    try:
        descriptor = _open_entry(path)
    except OSError as err:
        if err.errno == errno.ELOOP:
            return [f"{name}: a link, not a file or folder of its own"]
        return [f"{name}: unreadable ({err.strerror or err})"]
    try:
        return _foreign_on(descriptor, name, kept, owners)
    finally:
        os.close(descriptor)


def _open_entry(path: str) -> int:
    """An entry opened to look at, never through a link, without waiting (a FIFO)."""
    return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)


def _foreign_on(descriptor: int, name: str, kept: frozenset[str], owners: bool) -> list[str]:
    """foreign_metadata of the entry open at descriptor."""
    problems = []
    try:
        flags = _inode_flags(descriptor)
    except OSError as err:
        problems.append(f"{name}: inode flags unreadable ({err.strerror or err})")
    else:
        if flags is not None and flags & ~FILE_SYSTEMS_OWN_FLAGS:
            problems.append(
                f"{name}: inode flags kvtrace does not set "
                f"({flags & ~FILE_SYSTEMS_OWN_FLAGS:#x}, as lsattr lists them): clear them "
                f"(chattr) or copy into a folder that has none"
            )
    if attributes := foreign_attributes(descriptor, kept):
        problems.append(
            f"{name}: extended attributes kvtrace does not set "
            f"({', '.join(sorted(attributes))[:80]})"
        )
    if owners and foreign_owners(os.fstat(descriptor)):
        problems.append(f"{name}: {FOREIGN_OWNERS}")
    return problems


FOREIGN_OWNERS = (
    "owners kvtrace does not set (the user's own, of the user's group; a setgid folder gives "
    "its own): copy without -p or --same-owner, as the auditing user"
)


def foreign_owners(status: os.stat_result) -> bool:
    """Whether an entry's owner or group is not the user's own."""
    return status.st_uid != os.geteuid() or status.st_gid != os.getegid()


def foreign_attributes(entry: int | str, kept: frozenset[str] = frozenset()) -> set[str]:
    """The extended attributes of an entry (open, or a path, never followed) but the SELinux
    label and kept ones."""
    try:
        names = (
            os.listxattr(entry)
            if isinstance(entry, int)
            else os.listxattr(entry, follow_symlinks=False)
        )
        return set(names) - {SELINUX_ATTRIBUTE, *kept}
    except OSError:  # a file system without them holds none
        return set()


def _inode_flags(descriptor: int) -> int | None:
    """An open entry's inode flags (lsattr), None where its file system keeps none. The ioctl
    reads and writes an int (linux/fs.h), so an unsigned 32-bit one is packed."""
    try:
        packed = fcntl.ioctl(descriptor, FS_IOC_GETFLAGS, struct.pack("I", 0))
    except OSError as err:
        if err.errno in NO_INODE_FLAGS:
            return None
        raise
    return struct.unpack("I", packed)[0]


def _set_inode_flags(descriptor: int, flags: int) -> None:
    fcntl.ioctl(descriptor, FS_IOC_SETFLAGS, struct.pack("I", flags))


class _DurableFile(io.FileIO):
    """A local file fsynced when closed."""

    def close(self) -> None:
        if not self.closed:
            os.fsync(self.fileno())
        super().close()


def create(path: str, private: bool = False) -> IO[bytes]:
    """A new file at path, replacing any, durable once closed; local parent folders are made as
    needed (owner-only for a private file)."""
    if is_url(path):
        from apache_beam.io.filesystem import CompressionTypes

        return _beam().create(path, compression_type=CompressionTypes.UNCOMPRESSED)
    make_folder(os.path.dirname(path) or ".", private)
    mode = PRIVATE_FILE if private else PUBLIC_FILE
    raw = _DurableFile(path, "w", opener=lambda name, flags: os.open(name, flags, mode))
    if private:  # an existing file keeps its mode through O_TRUNC
        os.chmod(path, mode)
    return io.BufferedWriter(raw)


def create_unnamed(folder: str) -> IO[bytes]:
    """A private file without a name on a local folder's file system, open to write and read
    back: the kernel frees it once its last descriptor closes, however the process ends (a
    SIGKILL included), so no copy of it is ever left behind. Owner-only from its first byte
    (O_TMPFILE; where the file system has none, made under a random owner-only name, removed at
    once). Other processes of this user read it at descriptor_path(file) while it is open."""
    return tempfile.TemporaryFile(dir=folder)  # mode 0600, PRIVATE_FILE's


def descriptor_path(file: IO[bytes]) -> str:
    """Where any process of this user opens a file this one holds open (one without a name
    included), while it is open: its descriptor, in /proc."""
    return f"/proc/{os.getpid()}/fd/{file.fileno()}"


def make_folder(path: str, private: bool = False) -> bool:
    """A local folder (and its parents); those a private one needs are made owner-only and the
    private one marked kvtrace's. A folder kvtrace did not make is never changed nor marked
    (its private files are owner-only themselves), but one other users may write is refused:
    they could rename, delete or plant files among the private ones. One kvtrace made (marked)
    is made owner-only again if it was opened up. Returns whether this call made it (a URL's
    is never made)."""
    if is_url(path):
        return False
    if not private:
        return _make_missing(path)
    if _make_owner_only(path):
        _mark_private(path)
        return True
    if is_private_folder(path):
        _keep_owner_only(path)
    elif unfit_private := unfit_for_private_files(path):
        raise PermissionError(unfit_private)
    return False


def make_parent(path: str, private: bool = False) -> None:
    """The local folder path goes in, and its parents; for a private path made owner-only as
    make_folder makes a private folder's (whichever step makes them first), not marked: the
    private folder is path itself."""
    parent = os.path.dirname(os.path.abspath(path))
    if private:
        _make_owner_only(parent)
    else:
        _make_missing(parent)


def _make_owner_only(path: str) -> bool:
    """The missing folders of path made, each owner-only, not just the last (as os.makedirs
    would leave them under the umask); an existing parent is the user's: left as it is.
    Returns whether path was missing."""
    return _make_missing(path, PRIVATE_FOLDER)


def _make_missing(path: str, mode: int | None = None) -> bool:
    """The one maker of local folders: path's missing folders made, outermost first (mode:
    each made exactly so, whatever the umask), each one made noted for the run's exit
    (run_folders). An existing folder, or one another process makes meanwhile, is not this
    run's: left as it is. Returns whether path was missing."""
    missing = []
    while path and not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for folder in reversed(missing):
        _tell_parent(folder, made=True)  # before: a child killed right after is covered
        try:
            os.mkdir(folder, 0o777 if mode is None else mode)
        except FileExistsError:
            _tell_parent(folder, made=False)
            if not os.path.isdir(folder):
                raise
            continue
        _note_made(folder)  # first: a stop as it is given its metadata still removes it
        if mode is not None:
            inherit_nothing(folder, mode)
    return bool(missing)


def inherit_nothing(folder: str, mode: int) -> None:
    """A folder just made given what the gate holds every entry to (foreign_metadata), so what
    is made inside inherits nothing of a team's shared parent: the user's own group (a setgid
    parent's is the team's; chown to a group of one's own needs no privilege), mode exactly
    (the setgid bit off), no extended attribute the gate would name (a default ACL's entries
    travel into every file), no inode flag but the file system's own (chattr +d and the like
    are inherited). What cannot be taken off stays, for the caller's check to name.

    Done on the folder opened once, never through a link, and only if it is a folder of the
    user's: a name swapped for a link after mkdir changes nothing it points to."""
    try:
        descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PermissionError(
                f"{folder} is not the folder kvtrace made (a link or file in its place): "
                f"give an output of your own"
            ) from None
        raise
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.geteuid():
            raise PermissionError(
                f"{folder} is not the folder kvtrace made (another user's): give an output "
                f"of your own"
            )
        _clear_inherited(descriptor, status)
        os.fchmod(descriptor, mode)
    finally:
        os.close(descriptor)


def _clear_inherited(descriptor: int, status: os.stat_result) -> None:
    """Take off an open folder of the user's what foreign_metadata would name, as far as it
    comes off without privilege."""
    if status.st_gid != os.getegid():
        try:
            os.fchown(descriptor, -1, os.getegid())
        except OSError:  # a file system that keeps no groups of its own (NFS squashing)
            pass
    for attribute in foreign_attributes(descriptor, frozenset()):
        try:
            os.removexattr(descriptor, attribute)
        except OSError:  # one the file system lists on every entry, or a privileged one
            pass
    try:
        flags = _inode_flags(descriptor)
        if flags is not None and flags & ~FILE_SYSTEMS_OWN_FLAGS:
            _set_inode_flags(descriptor, flags & FILE_SYSTEMS_OWN_FLAGS)
    except OSError:  # one only privilege clears (immutable, append-only): named later
        pass


def unfit_for_private_files(folder: str) -> str | None:
    """Why an existing local folder kvtrace did not make cannot hold its private files (None:
    it can): other users may add, rename or remove names in it, and kvtrace does not change it."""
    if not os.stat(folder).st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    return (
        f"{folder} may be written by other users, who could rename or plant files among "
        f"its private ones; kvtrace changes no folder it did not make: give a folder of "
        f"your own (chmod go-w)"
    )


def _keep_owner_only(folder: str) -> None:
    mode = os.stat(folder).st_mode & 0o777
    if mode & ~PRIVATE_FOLDER:
        try:
            os.chmod(folder, PRIVATE_FOLDER)
        except PermissionError:
            raise PermissionError(
                f"cannot make {folder} owner-only (it holds private files); "
                f"give a folder of your own"
            ) from None
        _LOG.info("made %s owner-only (it was %s): it holds private files", folder, oct(mode))


# A folder of kvtrace's private files (dead letters, an id map, its marks, block hashes, a run's
# staging) is marked so: the write plan refuses every other location inside one. An extended
# attribute, which a rename keeps; a published output's staging folder has it taken off first.
PRIVATE_MARK = "user.kvtrace.private"


def _mark_private(folder: str) -> None:
    try:
        os.setxattr(folder, PRIVATE_MARK, b"1", follow_symlinks=False)
    except OSError:  # a filesystem without extended attributes: the folder stays unmarked
        pass


def unmark_private(folder: str) -> None:
    """Take the private mark off a local folder about to be published for all to read."""
    try:
        os.removexattr(folder, PRIVATE_MARK, follow_symlinks=False)
    except OSError:  # unmarked, or a filesystem without extended attributes
        pass


def is_private_folder(folder: str) -> bool:
    """Whether a local folder is one of kvtrace's private ones (make_folder marked it)."""
    try:
        return os.getxattr(folder, PRIVATE_MARK, follow_symlinks=False) == b"1"
    except OSError:
        return False


def remove_folder(path: str) -> None:
    """Remove a folder and what it holds, if it exists."""
    if is_url(path):
        leftovers = [join(path, name) for name in files_in(path)]
        if leftovers:
            delete(leftovers)
    else:
        shutil.rmtree(path, ignore_errors=True)


def empty_folders_in(folder: str) -> list[str]:
    """The names of the empty folders a local folder holds (links not followed), sorted; none
    on an object store, which has no empty folders."""
    if is_url(folder):
        return []
    try:
        with os.scandir(folder) as entries:
            folders = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(name for name in folders if _empty(os.path.join(folder, name)))


def _empty(folder: str) -> bool:
    try:
        with os.scandir(folder) as entries:
            return next(entries, None) is None
    except OSError:  # unreadable, or gone meanwhile: not known empty
        return False


def remove_empty_folder(path: str) -> bool:
    """Remove a local folder if it is (still) empty; whether it went."""
    if is_url(path):
        return False
    try:
        os.rmdir(path)
    except OSError:
        return False
    return True


def sync_folder(path: str) -> None:
    """Make a local folder's entries (files created, renamed or removed in it) durable."""
    if is_url(path):
        return
    handle = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def exists(path: str) -> bool:
    return _beam().exists(path) if is_url(path) else os.path.exists(path)


def delete(paths: list[str]) -> None:
    remote = [p for p in paths if is_url(p)]
    if remote:
        _beam().delete(remote)
    for path in paths:
        if not is_url(path):
            os.remove(path)


def rename(source: str, destination: str) -> None:
    """Move source over destination (atomic on local filesystems)."""
    if is_url(source):
        _beam().rename([source], [destination])
    else:
        os.replace(source, destination)


def match(pattern: str) -> list[str]:
    """Files matching a glob pattern, sorted. A folder's files are listed with files_in, which
    never reads the folder's name as a pattern."""
    if is_url(pattern):
        return sorted(m.path for r in _beam().match([pattern]) for m in r.metadata_list)
    return sorted(p for p in glob.glob(pattern) if os.path.isfile(p))


def files_in(folder: str, nested: bool = False) -> list[str]:
    """The names of the files a folder holds, sorted (none when it does not exist); nested: its
    subfolders' too, as a/b. The folder's name is taken as it is spelled, never as a pattern
    (`out[1]` is itself, not out1), and hidden names are names like any other. Files are
    what a glob of the folder would give: regular files (links to them included)."""
    if is_url(folder):
        prefix = join(folder, "")
        listed = (m.path for r in _beam().match([objects_under(prefix)]) for m in r.metadata_list)
        names = (path[len(prefix) :] for path in listed if path.startswith(prefix))
        return sorted(name for name in names if nested or "/" not in name)
    if not nested:
        try:
            with os.scandir(folder) as entries:
                return sorted(e.name for e in entries if e.is_file())
        except (FileNotFoundError, NotADirectoryError):
            return []
    return sorted(
        os.path.relpath(os.path.join(parent, name), folder).replace(os.sep, "/")
        for parent, _, names in os.walk(folder)
        for name in names
        if os.path.isfile(os.path.join(parent, name))
    )


def objects_under(prefix: str) -> str:
    """A Beam pattern matching every object whose name starts with prefix: the prefix up to its
    first glob character, then `**`. Beam's patterns have no escape character (a `[[]` class
    warns in Python's re), so a glob character in a name is cut off, not escaped: the store
    lists from there (more than the folder only when its name holds one), and files_in keeps
    the folder's own objects."""
    cut = min((prefix.find(c) for c in "[*?" if c in prefix), default=len(prefix))
    return prefix[:cut] + "**"


# ---- Held while its maker lives ----------------------------------------------------------------

# A run's scratch that another run may clear once it is left (a commit's temp file, a Beam job's
# folder): its maker holds an flock(2) on it for as long as it is in use, and a clearer removes
# only what it can lock without waiting. The kernel drops the lock however the holder ends (a
# SIGKILL included), and the lock is the file's, seen alike from every PID namespace, where a
# pid or a host name is not. A clearer that removes what a maker made before the maker locked it
# leaves the maker a name no longer there: it makes another (HOLD_ATTEMPTS).
HOLD_ATTEMPTS = 8


@contextmanager
def held(make: Callable[[], str]) -> Iterator[str]:
    """A local file or folder that make() creates (under a new name each call), locked for as
    long as the context lasts (one descriptor), so that remove_unheld leaves it alone."""
    for _ in range(HOLD_ATTEMPTS):
        path = make()
        handle = _locked(path)
        if handle is not None:
            break
    else:
        raise OSError(errno.EAGAIN, "other runs kept removing what this one made", path)
    try:
        yield path
    finally:
        os.close(handle)  # releases the lock


def remove_unheld(path: str) -> bool:
    """Remove a local file or folder of the running user's that nobody holds (held), without
    waiting for a holder; whether it went. Links and other kinds of file are left alone."""
    try:
        handle = _locked(path)
    except OSError:  # another's (EACCES), or a lock this file system refuses: nothing told
        return False
    if handle is None:
        return False
    try:
        opened = os.fstat(handle)
        if opened.st_uid != os.geteuid():
            return False
        if stat.S_ISDIR(opened.st_mode):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(handle)


def _locked(path: str) -> int | None:
    """A descriptor of path holding its exclusive lock, taken without waiting; None where path
    is held, gone, no longer the file locked, or neither a plain file nor a folder. A file is
    opened to write: NFS grants an exclusive lock only to a writer (a folder, local, any)."""
    flags = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        kind = os.lstat(path).st_mode
        if stat.S_ISDIR(kind):
            handle = os.open(path, flags | os.O_RDONLY | os.O_DIRECTORY)
        elif stat.S_ISREG(kind):
            handle = os.open(path, flags | os.O_WRONLY)
        else:
            return None
    except FileNotFoundError:
        return None
    ours = False
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        named, opened = os.lstat(path), os.fstat(handle)
        ours = (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)
    except (BlockingIOError, FileNotFoundError):  # held, or removed meanwhile
        pass
    finally:
        if not ours:
            os.close(handle)
    return handle if ours else None


# ---- What a run made and must remove on any exit -----------------------------------------------

# Every local path this process made for its run and removes when the run ends (a staging name,
# an output's lock file), in one registry: the normal unwind
# removes each in its finally block and forgets it; a hard end (the CLI's stop deadline, which
# ends the process with os._exit past every finally block) removes what is left
# (remove_leftovers). Each entry may carry a test that it is still this run's to remove (a lock
# file is removed only while it is the file locked; a staged output only once no pointer to its
# letters stands), which a failure's removal of the folders it made heeds too (run_folders), or
# be a folder that others may write into too (a dead-letter folder the run made), removed only
# while empty. Entries are this process's alone: a forked child inherits the registry but never
# removes its parent's paths.
MAX_LEFTOVERS = 1024  # a stream stages one folder per window: gone ones are forgotten past this
# path -> its test (None: always ours), and whether it goes only while empty
_LEFTOVERS: dict[str, tuple[Callable[[], bool] | None, bool]] = {}
_LEFTOVERS_OWNER = [os.getpid()]


def remove_on_exit(
    path: str, still_ours: Callable[[], bool] | None = None, only_if_empty: bool = False
) -> str:
    """Note a local path this run made (absolute), for remove_leftovers; returns path.
    still_ours: whether it is the run's to remove now (while not, no cleanup of the run
    removes it: _still_ours); a later note of the same path replaces the test."""
    if is_url(path):
        return path
    if _LEFTOVERS_OWNER[0] != os.getpid():  # a forked child's own registry starts empty
        _LEFTOVERS.clear()
        _LEFTOVERS_OWNER[0] = os.getpid()
    if len(_LEFTOVERS) >= MAX_LEFTOVERS:
        for gone in [p for p in _LEFTOVERS if not os.path.lexists(p)]:
            del _LEFTOVERS[gone]
    _LEFTOVERS[os.path.abspath(path)] = still_ours, only_if_empty
    return path


def forget_on_exit(path: str) -> None:
    """The run removed (or published) path itself: a hard end leaves it alone."""
    _LEFTOVERS.pop(os.path.abspath(path), None)


def remove_leftovers() -> None:
    """At a hard end: remove what this process's run made and has not removed (links are
    removed, never followed), what a folder holds before the folder, and last the folders it
    made (run_folders) that are left empty. The caller makes sure no publication is under
    way."""
    if _LEFTOVERS_OWNER[0] == os.getpid():
        _remove_registered()
    _remove_made(_MADE.get(os.getpid(), []))


def _remove_registered() -> None:
    # Passes until one removes nothing: a path kept while another stands (a staged output while
    # its letters' pointer does) goes once a pass removed that one, whatever their names' order.
    waiting = sorted(_LEFTOVERS.items(), reverse=True)
    while waiting:
        kept = [(path, entry) for path, entry in waiting if not _remove_entry(path, *entry)]
        if len(kept) == len(waiting):
            return
        waiting = kept


def _remove_entry(path: str, still_ours: Callable[[], bool] | None, only_if_empty: bool) -> bool:
    """Remove a registered path if it is still the run's to remove; whether that was tried (a
    removal that fails is not tried again: the next run of the output clears what stays)."""
    if still_ours is not None and not still_ours():
        return False
    if only_if_empty:
        remove_empty_folder(path)
    elif os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.remove(path)
        except OSError:
            pass
    return True


def _still_ours(path: str) -> bool:
    """Whether the run's registry (remove_on_exit) lets its cleanup remove path now."""
    still_ours = _LEFTOVERS.get(path, (None, False))[0]
    return still_ours is None or still_ours()


# The folders a run made (_make_missing), in the order made (the deepest of each path last),
# by the process whose run it is; a child's, told by it (forward_folders), are its parent's.
_MADE: dict[int, list[str]] = {}


@contextmanager
def run_folders() -> Iterator[None]:
    """A run's missing folders (its outputs' parents, its dead-letter folder's, a new id map's):
    kept if the run ends without an error (it published), removed, deepest first and only
    while empty, on every exit that raises (a failure, a refusal, a stop) and at a hard end
    (remove_leftovers), so a run that publishes nothing leaves the operator's folders as they
    were; one its registry says is not its to remove now (remove_on_exit) stays. A folder the
    run did not make is never touched. Nested runs are the outer one's."""
    if os.getpid() in _MADE:
        yield
        return
    made = _MADE[os.getpid()] = []
    try:
        yield
    except BaseException:
        _remove_made(made)
        raise
    finally:
        del _MADE[os.getpid()]


def _note_made(folder: str) -> None:
    made = _MADE.get(os.getpid())
    if made is None:  # no run's: nothing to remove it on
        return
    if len(made) >= MAX_LEFTOVERS:  # a stream makes one staging folder per window
        made[:] = [f for f in made if os.path.isdir(f)]
    made.append(os.path.abspath(folder))


@dataclass(frozen=True)
class Making:
    """A folder a child process makes for its parent's run (the Beam engine's child: a new id
    map's parents), told to the parent before it is made (forward_folders), so the parent's run
    removes it on every exit whatever ends the child (a folder told but never made is simply
    absent); made False: another process made it first, so it is not the run's."""

    path: str
    made: bool


_FORWARD_FOLDERS: list[Callable[[Making], None]] = []  # in a child whose parent runs: its channel


def forward_folders(send: Callable[[Making], None]) -> None:
    """In a child process whose parent's run it works for (child_process.run_in_child): each
    folder it makes is sent to the parent (note_child_folder) before it is made."""
    _FORWARD_FOLDERS[:] = [send]


def _tell_parent(folder: str, made: bool) -> None:
    for send in _FORWARD_FOLDERS:
        send(Making(os.path.abspath(folder), made))


def note_child_folder(told: Making) -> None:
    """A folder a child of this process makes (or found made by another after all), in this
    process's run (run_folders) as one of its own."""
    if told.made:
        _note_made(told.path)
        return
    made = _MADE.get(os.getpid())
    if made is not None and told.path in made:
        del made[len(made) - 1 - made[::-1].index(told.path)]  # the one it told last


def _remove_made(made: list[str]) -> None:
    for folder in reversed(made):
        if _still_ours(folder):  # a staged output its letters' pointer names stays with it
            remove_empty_folder(folder)
