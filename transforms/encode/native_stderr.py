"""What native code writes to this process's stderr becomes log lines, shown with --verbose.

The Rust tokenizer reports a panic on file descriptor 2 itself, before Python sees the
exception (fallible_tokenizer.py turns that into a dead letter with the panic's message): a
record that panics it printed "thread '<unnamed>' panicked at ..." and, with RUST_BACKTRACE
set, a backtrace of 40 frames, where kvtrace promises one line. No Python code runs between the
panic and its report, so it cannot be caught, only routed: once a process tokenizes, descriptor
2 is a pipe whose lines a thread logs (logger `native`, at INFO: seen with --verbose, as Beam's
and transformers' are), and Python's own stderr (sys.stderr, the logging handlers on it) writes
to the original stderr directly, so that nothing Python says waits on that thread, or is lost
when a stopped run ends at once (os._exit).

Logged at INFO, native words would hide what explains a death: a process whose allocation
fails in Rust prints "memory allocation of N bytes failed" there and aborts. So the last lines
are kept (last_words) for whoever sees a process die: the local engine's parent, whose forked
workers write to its pipe, names them in its error and logs them at WARNING.

Processes forked later inherit both; a process started clean (spawn, forkserver) from this one
routes its own descriptor 2 again, its Python stderr then going through this process's pipe.
Where sys.stderr is not the interpreter's own (a test harness capturing output) nothing is
changed.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
from collections import deque
from typing import TextIO

STDERR_FD = 2
LOGGER = "native"
# Longest line logged as one record (a longer one is logged in pieces): the pipe is read in
# pieces this size, so a line without an end costs no more than this.
MAX_LINE_BYTES = 64 << 10
# Marks a thread that waits holding no lock (pipelines/processes.busy_threads reads it): a fork
# meanwhile copies no lock of its held, so the local engine may still fork its workers.
QUIET_ATTRIBUTE = "holds_no_lock"
# Native lines kept to explain a death (an abort prints one or two), each cut to a line's worth.
KEPT_LINES = 8
KEPT_LINE_CHARS = 300
# How long last_words waits for the lines already written to be read: the relay reads at once.
DRAIN_WAIT_S = 5.0
# Written to the pipe by last_words and read back by the relay, never logged: every line written
# before it has been read when it is (a pipe keeps order; writes this short are never split).
_MARK = b"\x00kvtrace-native-stderr-read-to-here "

_LOG = logging.getLogger(LOGGER)
_lock = threading.Lock()
_kept: deque[str] = deque(maxlen=KEPT_LINES)
_marks = itertools.count(1)
_read_to = threading.Condition()
_mark_read = 0  # the last mark the relay has read
_routed = False  # descriptor 2 is this process's pipe, its relay a thread of this process


def capture_native_stderr() -> None:
    """Descriptor 2 routed through a logging thread, once per process (see the module's doc)."""
    with _lock:
        if sys.stderr is not sys.__stderr__ or sys.__stderr__ is None:
            return  # routed already (here, or by the process this one forked from), or captured
        try:
            read, write = os.pipe()
            original = os.dup(STDERR_FD)
        except OSError:  # no descriptors left: native output stays where it was
            return
        sys.stderr.flush()
        stream = open(
            original, "w", buffering=1, encoding=sys.stderr.encoding, errors="backslashreplace"
        )
        _move_handlers(sys.stderr, stream)
        sys.stderr = stream
        os.dup2(write, STDERR_FD)
        os.close(write)
        global _routed
        _routed = True
        relay = threading.Thread(target=_relay, args=(read,), name="native-stderr", daemon=True)
        setattr(relay, QUIET_ATTRIBUTE, True)
        relay.start()


def _move_handlers(old: TextIO, new: TextIO) -> None:
    """Logging handlers writing to the old stderr write to the new one (those whose stream is
    a property, as logging's last resort's is, read sys.stderr at each write: they follow)."""
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for handler in getattr(logger, "handlers", []):
            if (
                isinstance(handler, logging.StreamHandler)
                and handler.stream is old
                and not isinstance(getattr(type(handler), "stream", None), property)
            ):
                handler.setStream(new)


def last_words() -> list[str]:
    """The last lines native code wrote to descriptor 2 (this process's, and its forked
    children's, which write to the same pipe), each cut to KEPT_LINE_CHARS: those written before
    this call included, waited for at most DRAIN_WAIT_S."""
    if _routed:
        mark = next(_marks)
        try:
            os.write(STDERR_FD, b"\n" + _MARK + str(mark).encode() + b"\n")
        except OSError:  # the relay is gone: what it kept is all there is
            return list(_kept)
        with _read_to:
            _read_to.wait_for(lambda: _mark_read >= mark, DRAIN_WAIT_S)
    return list(_kept)


def _relay(read: int) -> None:
    """Each line written to descriptor 2 logged and kept, until every writer has closed it."""
    pending = b""
    while True:
        piece = os.read(read, MAX_LINE_BYTES)
        if not piece:
            break
        lines = (pending + piece).split(b"\n")
        pending = lines.pop()
        if len(pending) >= MAX_LINE_BYTES:
            lines.append(pending)
            pending = b""
        for line in lines:
            _relayed(line)
    if pending:
        _relayed(pending)
    os.close(read)


def _relayed(line: bytes) -> None:
    global _mark_read
    if line.startswith(_MARK):
        with _read_to:
            _mark_read = max(_mark_read, int(line[len(_MARK) :] or 0))
            _read_to.notify_all()
        return
    text = line.decode("utf-8", "replace").rstrip()
    if text:  # a mark starts a line of its own: the empty line that may leave is not news
        _LOG.info("%s", text)
        _kept.append(text[:KEPT_LINE_CHARS])
