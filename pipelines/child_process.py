"""A job run whole in a child process, so that native code never runs in the process that
reports: the Beam engine's in-process runner tokenizes (and reads Parquet) in the process it
runs in, where a native abort (the Rust tokenizer's failed allocation) would end the CLI silently.
Here that process is a child, and its death is this process's one-line error (JobStopped, as a
local engine worker's is: local_workers.worker_death), its native code's last words included.

The child is forked from this one (its options, logging and stop handlers with it; Beam's
in-process runner starts no gRPC thread to copy) where nothing but quiet threads run
(processes.busy_threads), else started clean (local_workers.START_METHOD), the job then picklable.
Its error, whatever it is, is raised here (its traceback a note, shown with --verbose); a stop
reaches it as it reaches this process (Ctrl-C: the terminal's whole process group), or from this
process (SIGTERM), and it unwinds as a run in this process would (a publication under way ends
first, interrupts.stops_deferred).

What the job returns comes back here once the child's message arrived whole. The Beam engine's
child stages its output and returns what it staged; this process publishes it (the one write
protocol, anonymize_beam.run_beam): the process that reports a stop or a failure is the one that
publishes, so what it says is its own record (publish.published_here), and a child that dies or is
stopped has published nothing. Publishing here is possible because nothing after the publication
runs in the child: the job's last step only stages the night's record, from which the child, once
its job has finished, commits the id map's version and stages the manifest
(anonymize_night.finish_staged); the dead letters are settled by this process already, and the
output's lock is this process's. The one thing the child commits itself, that version, it tells
this process before the commit's record is created (publish.intend: its path and digest) and once
the commit's publication ends (publish.forward_publications); a child gone in between is told here
by what the path holds (Intended.stands), so a stop or a death names a commit that stands whatever
point the child died at. Each folder the child makes (a new id map's parents) it tells this
process on the same pipe before making it (storage.forward_folders), so this process's run removes
it on every exit that publishes nothing, the child's death included, as it removes its own
(storage.run_folders). Its temporary files go into a folder this process owns, removed whatever
ends the child, and by the next run if this process is killed (it holds the folder's lock while it
lives: storage.held).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

from kvtrace.pipelines.local_workers import (
    START_METHOD,
    adopt_environment,
    stop_signals_held,
    worker_death,
)
from kvtrace.pipelines.processes import STOP_SIGNALS, busy_threads, end_descendants, end_with_parent
from kvtrace.transforms import storage
from kvtrace.transforms.encode.native_stderr import capture_native_stderr
from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.write import publish

# How long a stopped child may unwind (its staging removed, a publication under way finished)
# before it is ended: the CLI's own deadline (STOP_DEADLINE_S) is as long.
UNWIND_S = 1.5
_DIED = object()  # the child's outcome where it ended without a word
SCRATCH_PREFIX = "kvtrace-job-"
T = TypeVar("T")


def run_in_child(job: Callable[[], T], unwind_s: float = UNWIND_S) -> T:
    """job() run in a child process, its value returned here once it arrived whole; its error
    raised here, its death JobStopped. A stopped child unwinds for at most unwind_s."""
    forked = busy_threads() == 0
    if forked:
        capture_native_stderr()  # the child's native words come through this process's relay
    context = multiprocessing.get_context("fork" if forked else START_METHOD)
    results, sent = context.Pipe(duplex=False)
    heard, told = context.Pipe(duplex=False)  # what the child publishes, and folders it makes
    # The child's temporary files (Beam's pipeline folder among them) go into a folder this
    # process owns, in its registry: a child ended before it could unwind leaves none. This
    # process holds it (storage.held) while it lives, so that one a killed run left, and only
    # such a one, is cleared by the next (_clear_scratch).
    _clear_scratch(tempfile.gettempdir())
    with storage.held(functools.partial(tempfile.mkdtemp, prefix=SCRATCH_PREFIX)) as scratch:
        storage.remove_on_exit(scratch)
        child = context.Process(
            target=_run_job,
            args=(
                job,
                sent,
                told,
                None if forked else _LoggingSetup.of_this_process(),
                None if forked else dict(os.environ),
                scratch,
            ),
            name="kvtrace-job",
        )
        intended: list[publish.Intended] = []  # told by the child, not yet settled by it
        relay = threading.Thread(
            target=_relay, args=(heard, intended), name="kvtrace-job-publications"
        )
        try:
            with stop_signals_held():  # a stop lands here once the fork is whole, not in its hooks
                child.start()
            sent.close()  # the child's ends: the pipes read as closed once the child is gone
            told.close()
            relay.start()
            outcome = _wait_for(child, results)
        except BaseException:  # a stop: the child stops too (if the signal was this process's)
            _stop(child, unwind_s)
            raise
        finally:
            sent.close()
            told.close()
            if relay.is_alive():  # the child is gone: its last word is in, or never comes
                relay.join(UNWIND_S)
            _note_standing(intended)
            heard.close()
            results.close()
            storage.remove_folder(scratch)  # the child is gone by now: ended, or stopped
            storage.forget_on_exit(scratch)
    if isinstance(outcome, BaseException):
        raise outcome
    if outcome is _DIED:
        raise JobStopped(worker_death([child]))
    (value,) = outcome
    return value


def _clear_scratch(folder: str) -> None:
    """Remove the job scratch folders in folder that no run holds (a killed run's: its finally
    block never ran) and that are this user's; a living run's stay, whatever its PID namespace
    (a container's sharing this /tmp)."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if entry.name.startswith(SCRATCH_PREFIX):
                storage.remove_unheld(entry.path)


def _relay(heard: Connection, intended: list[publish.Intended]) -> None:
    """In a thread of this process: each publication the child made, into this process's record
    as it arrives (publish.note_published), so a stop here says it whenever it comes; each step
    it intends kept in intended until a publication's end settles it; each folder it makes, into
    this process's run (storage.note_child_folder), removed with the run's own."""
    while True:
        try:
            told = heard.recv()
        except (EOFError, OSError):  # the child is gone
            return
        if isinstance(told, storage.Making):
            storage.note_child_folder(told)
        elif isinstance(told, publish.Intended):
            intended.append(told)
        else:
            publish.note_published(told)
            intended.clear()


def _note_standing(intended: list[publish.Intended]) -> None:
    """What the child intended and never settled (it died, or was ended, inside a publication),
    into this process's record where storage holds it exactly: the child's own step, told by
    its bytes whether the child died before it or after."""
    standing = [step.name for step in list(intended) if step.stands()]
    if standing:
        publish.note_published(standing)


def _wait_for(child: multiprocessing.process.BaseProcess, results: Connection) -> Any:
    """What the child sent (its job's value in a 1-tuple; an error), or _DIED where it ended
    without a word: a message that broke off is no word (recv reads one whole, or fails)."""
    wait([results, child.sentinel])
    try:
        outcome = results.recv()
    except EOFError:  # gone before it could say anything: a signal, an abort, os._exit
        child.join()
        return _DIED
    child.join()
    return outcome


def _stop(child: multiprocessing.process.BaseProcess, unwind_s: float) -> None:
    """SIGTERM to the child, which unwinds for at most unwind_s; then it and its own are ended."""
    if child.is_alive():
        child.terminate()
        child.join(unwind_s)
    end_descendants()


def _run_job(
    job: Callable[[], Any],
    sent: Connection,
    told: Connection,
    setup: _LoggingSetup | None,
    environment: dict[str, str] | None,
    scratch: str,
) -> None:
    """In the child: job run, then its value (in a 1-tuple) or its error sent back; each of its
    publications told as it stands (the Beam engine's id-map commit). Its temporary files, and
    its own children's, go into scratch (the parent's). A child started clean runs in the
    parent's environment as it is now (environment), not the forkserver's."""
    end_with_parent()  # none goes on publishing for a process that is gone
    if environment is not None:
        adopt_environment(environment)
    tempfile.tempdir = os.environ["TMPDIR"] = scratch
    publish.forward_publications(functools.partial(_tell, told))
    storage.forward_folders(functools.partial(_tell, told))
    if setup is not None:
        setup.apply()
    elif threading.current_thread() is threading.main_thread():
        # Forked with this process's stop handlers, but not its wakeup socket's reader: the
        # child's signals must not wake the parent's watcher as if they were its own.
        signal.set_wakeup_fd(-1)
    try:
        # Held since the fork (stop_signals_held): a stop sent meanwhile is raised here, an
        # outcome as any other.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        outcome: BaseException | tuple[Any] = (job(),)
    except BaseException as err:  # every outcome is the parent's to report
        outcome = _portable(err)
    sent.send(outcome)
    sys.stdout.flush()
    sys.stderr.flush()
    # At once, as the CLI ends a stopped run: the interpreter's own exit would wait on threads
    # and finalizers (gRPC's, for seconds), and the parent has its outcome.
    os._exit(0)


_TELLING = threading.Lock()  # one message at a time, whichever of the child's threads tells


def _tell(told: Connection, message: publish.Told | storage.Making) -> None:
    with _TELLING, contextlib.suppress(OSError):  # the parent gone: none is left to say it
        told.send(message)


def _portable(err: BaseException) -> BaseException:
    """The error as it can travel: itself, with its traceback as a note, or where it does not
    pickle (a library's error holding a handle) a RuntimeError saying the same."""
    note = "".join(traceback.format_exception(err)).rstrip()
    try:
        pickle.loads(pickle.dumps(err))
    except Exception:
        err = RuntimeError(f"{type(err).__name__}: {err}")
    err.add_note(note)
    return err


class _LoggingSetup:
    """This process's logging as a child started clean repeats it: levels, and the formats of
    the plain stderr handlers on the root logger (the CLI's one)."""

    def __init__(self, levels: dict[str, int], formats: list[tuple[str | None, str | None]]):
        self._levels, self._formats = levels, formats

    @classmethod
    def of_this_process(cls) -> _LoggingSetup:
        levels = {name: logging.getLogger(name).level for name in ("", "kvtrace")}
        formats = [
            (getattr(handler.formatter, "_fmt", None), getattr(handler.formatter, "datefmt", None))
            for handler in logging.getLogger().handlers
            if type(handler) is logging.StreamHandler  # a harness's capturing ones aside
        ]
        return cls(levels, formats)

    def apply(self) -> None:
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)
        for fmt, datefmt in self._formats:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter(fmt, datefmt))
            logging.getLogger().addHandler(handler)
