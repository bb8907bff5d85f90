"""Run `kvtrace` with a fault injected at the K-th durable filesystem step, for the crash-point
harness (test_crash_points.py): `python crashpoints.py K MODE kvtrace-args...`.

The steps counted are the ones a commit protocol is made of, when kvtrace's code makes them: a
file written (storage.create, counted when closed), fsync, rename, link, unlink (and remove),
rmtree and the atomic folder swap. MODE kill
ends the process at once before the step (as SIGKILL would: no cleanup, no finally), and a file
killed before it is synced keeps only half its bytes (as a power cut may leave it: written but
never synced); MODE enospc makes the step fail as on a full disk. K = 0 runs cleanly and prints the number of steps.

The steps are counted in one process: the Beam engine's job runs in this one (a kill here is
the whole run's). Its boundary between processes (pipelines/child_process.run_in_child: the
child stages, this process publishes) has points of its own, MODE one of BOUNDARY (K unused):
the child dies having staged everything, before or after it sends its outcome, or this process
dies or is stopped (SIGTERM) once the outcome arrived, before it publishes.
"""

from __future__ import annotations

import errno
import functools
import io
import os
import shutil
import signal
import stat
import sys
from multiprocessing.connection import Connection
from pathlib import Path

from kvtrace.pipelines import child_process
from kvtrace.transforms import storage
from kvtrace.transforms.write import publish

STEPS = [0]


def _fault(target: int, mode: str, lose_unsynced=lambda: None) -> None:
    STEPS[0] += 1
    if STEPS[0] != target:
        return
    if mode == "kill":
        lose_unsynced()
        os._exit(137)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


PROJECT = tuple(
    str(Path(__file__).resolve().parents[1] / name) + os.sep
    for name in ("transforms", "pipelines", "kvtrace")
)


def _counted(function, target: int, mode: str, lose_unsynced=lambda *args: None):
    def step(*args, **kwargs):
        # kvtrace's own steps only: libraries (caches written at import, Beam's sinks) do file
        # operations of their own, some of which swallow the failures injected here.
        if sys._getframe(1).f_code.co_filename.startswith(PROJECT):
            _fault(target, mode, lambda: lose_unsynced(*args))
        return function(*args, **kwargs)

    return step


def _lose_half_of(descriptor: int) -> None:
    """A file killed before its fsync keeps half its bytes (a folder loses nothing here)."""
    if stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.ftruncate(descriptor, os.fstat(descriptor).st_size // 2)


def install(target: int, mode: str) -> None:
    os.fsync = _counted(os.fsync, target, mode, _lose_half_of)
    for name in ("rename", "replace", "link", "unlink", "remove"):
        setattr(os, name, _counted(getattr(os, name), target, mode))
    shutil.rmtree = _counted(shutil.rmtree, target, mode)
    publish._exchange = _counted(publish._exchange, target, mode)
    original_create = storage.create

    class CountedWriter(io.BufferedWriter):
        def close(self) -> None:
            if not self.closed:
                try:  # the file's bytes reaching the disk, or not
                    _fault(target, mode, self._lose_half)
                except OSError:
                    super().close()
                    raise
            super().close()

        def _lose_half(self) -> None:
            self.flush()
            _lose_half_of(self.raw.fileno())

    def create(path: str, private: bool = False):
        return CountedWriter(original_create(path, private).detach())

    storage.create = create
    # The Beam engine's run, in this process: a kill here is the whole run's (its child would die
    # with it: child_process), and every step is counted in one place.
    child_process.run_in_child = lambda job, *unwind: job()


def _die() -> None:
    os._exit(137)


def _then(job, act):
    value = job()
    act()
    return value


def _child_dies_before_its_word() -> None:
    run = child_process.run_in_child
    child_process.run_in_child = lambda job, *unwind: run(
        functools.partial(_then, job, _die), *unwind
    )


def _child_dies_after_its_word() -> None:
    parent, send = os.getpid(), Connection.send

    def send_then_die(self, obj) -> None:
        send(self, obj)
        if os.getpid() != parent:  # the child's one message: its outcome
            _die()

    Connection.send = send_then_die


def _at_the_word(act) -> None:
    run = child_process.run_in_child
    child_process.run_in_child = lambda job, *unwind: _then(
        functools.partial(run, job, *unwind), act
    )


BOUNDARY = {
    "child-dies-before-its-word": _child_dies_before_its_word,
    "child-dies-after-its-word": _child_dies_after_its_word,
    "parent-dies-at-the-word": functools.partial(_at_the_word, _die),
    "parent-stopped-at-the-word": functools.partial(
        _at_the_word, lambda: os.kill(os.getpid(), signal.SIGTERM)
    ),
}


if __name__ == "__main__":
    target, mode = int(sys.argv[1]), sys.argv[2]
    if mode in BOUNDARY:
        BOUNDARY[mode]()
    else:
        install(target, mode)
    from kvtrace.cli import main

    code = main(sys.argv[3:])
    print(f"steps: {STEPS[0]}", file=sys.stderr)
    sys.exit(code)
