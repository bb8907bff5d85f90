"""A stop (Ctrl-C, SIGTERM) deferred across a critical section, so that a publication is whole
or rolled back, never split by a KeyboardInterrupt raised between two of its steps (CPython
raises a handler's exception wherever the main thread is when a call returns).

The CLI's signal handler calls stop(): outside any section it raises KeyboardInterrupt at once;
inside one it only notes the stop, and the outermost section raises it as it ends. Python runs
signal handlers in the main thread only, so only the main thread's sections defer; a section in
another thread is not interrupted by a stop at all (the CLI's hard end waits for it briefly)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_open_sections = 0  # the main thread's sections open now, nested ones included
_stop_pending = False


def _forget_sections() -> None:
    """A forked child opened none of its parent's sections: its stops are its own."""
    global _open_sections, _stop_pending
    _open_sections, _stop_pending = 0, False


os.register_at_fork(after_in_child=_forget_sections)


def stop() -> None:
    """A stop: raised now, or noted for the open section to raise as it ends."""
    global _stop_pending
    if _open_sections and threading.current_thread() is threading.main_thread():
        _stop_pending = True
        return
    raise KeyboardInterrupt


@contextmanager
def stops_deferred() -> Iterator[None]:
    """A critical section: a stop within it is raised once it ends (its own failure, if any,
    becomes the stop's context: the run is stopped either way)."""
    global _open_sections, _stop_pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _open_sections += 1
    try:
        yield
    finally:
        _open_sections -= 1
        if not _open_sections and _stop_pending:
            _stop_pending = False
            raise KeyboardInterrupt
