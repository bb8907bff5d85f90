"""The local engine's worker processes (`--processes`, at least one): file ranges encoded in
processes forked from this one once it has loaded the tokenizer (or started clean where a fork
is unsafe), each claiming ranges from a shared table, stopped with this process and ended with it
however it ends (processes.end_with_parent). A worker's
death, a native abort included, is this process's one-line error (worker_death): native code
never tokenizes input here. Not Beam's SDK worker pool (worker_pool.py): these never run a
pipeline.

What a worker does with a range is the driver's (anonymize_local.RangeEncoding); here is only how
ranges are spread, claimed, and gathered back in input order.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Iterator, MutableSequence, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Protocol

from kvtrace.pipelines.anonymize_night import Encoded
from kvtrace.pipelines.processes import (
    GROUP_STOP_SIGNALS,
    STOP_SIGNALS,
    busy_threads,
    end_with_parent,
)
from kvtrace.pipelines.progress import RangeCounts, read_meter, shared_counts, shown
from kvtrace.transforms.encode.encode_requests import RequestEncoder
from kvtrace.transforms.encode.native_stderr import last_words
from kvtrace.transforms.encode.tokenize import RENDER_WATCHDOG
from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.garbage import settle_after_start_up
from kvtrace.transforms.read.sources import READ_SPLIT_BYTES, FileRange
from kvtrace.transforms.write import interrupts

_LOG = logging.getLogger("kvtrace")
# Where forking is unsafe (can_fork), worker processes start from a clean server process.
START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
# The forkserver imports the workers' stack once, so each clean worker forks from it with that
# stack loaded (~0.1 s) instead of importing it again (~1 s of a core per worker and run).
FORKSERVER_PRELOAD = ["kvtrace.pipelines.anonymize_local", "jinja2.sandbox"]
if START_METHOD == "forkserver":
    multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)
TOKENIZERS_PARALLELISM = "TOKENIZERS_PARALLELISM"  # read by the Rust tokenizer
# A worker still running this long after SIGTERM is killed (it ends at once, by default action).
END_WORKERS_S = 0.5


class RangeWork(Protocol):
    """What each worker does with its ranges; picklable, for workers started clean."""

    def new_encoder(self) -> RequestEncoder: ...

    def warm_up(self, encoder: RequestEncoder, first: FileRange) -> None: ...

    def encode(
        self, pieces: list[FileRange], encoder: RequestEncoder, progress: RangeCounts
    ) -> Encoded: ...


_WORKER: dict = {}  # per worker process: the work and its encoder, built once


def worker_count(processes: int, input_bytes: int) -> int:
    """--processes: 0 means one per core this process may run on, at most one per read split of
    input (a small input has one: nothing to split)."""
    if processes:
        return processes
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, -(-input_bytes // READ_SPLIT_BYTES)))


def encode_in_workers(
    work: RangeWork, pieces: list[FileRange], processes: int, piece_bytes: Sequence[int]
) -> list[Encoded]:
    """Every range encoded by one of `processes` workers, each starting on a run of neighbouring
    ranges (run_bounds); the results in range order, whoever encoded them. piece_bytes: each
    range's bytes as stored, which the progress shown counts once it is read."""
    pool, counts = _start_pool(work, pieces, processes, piece_bytes)
    try:
        with stop_signals_held(), _single_threaded_tokenizers_in_children():
            futures = [pool.submit(_encode_claimed, worker) for worker in range(processes)]
        # Shown once the workers are forked: a fork must copy no lock this thread holds.
        with shown(sum(piece_bytes), read_meter(counts)):
            parts = [part for _, part in sorted(p for f in futures for p in f.result())]
    except BrokenProcessPool:  # a worker died (its Python would have raised): say how, and why
        workers = list((pool._processes or {}).values())
        end_workers(pool)
        raise JobStopped(worker_death(workers)) from None
    except BaseException:  # a stop (Ctrl-C, SIGTERM) or a failure: no worker outlives the run
        end_workers(pool)
        raise
    finally:
        _WORKER.clear()  # the encoder and its cache, which forked workers took from here
    pool.shutdown()
    return parts


def _start_pool(
    work: RangeWork, pieces: list[FileRange], processes: int, piece_bytes: Sequence[int]
) -> tuple[ProcessPoolExecutor, Any]:
    """Workers forked from this process (can_fork) once it has loaded the encoder and warmed it
    up, or started clean, each building its own and warming it up (_encode_claimed): either way
    no worker claims a range cold. With the run's counts, which the workers add to."""
    forked = can_fork()
    context = multiprocessing.get_context("fork" if forked else START_METHOD)
    bounds = context.Array("q", run_bounds(len(pieces), processes))
    counts = shared_counts(context)
    _LOG.info(
        "encoding %d file ranges in %d worker process%s %s",
        len(pieces),
        processes,
        "es" if processes > 1 else "",
        "forked from this one"
        if forked
        else "started clean (this process runs other threads or loaded gRPC)",
    )
    if forked:
        encoder = work.new_encoder()
        work.warm_up(encoder, pieces[0])
        settle_after_start_up()
        _WORKER.update(
            work=work,
            encoder=encoder,
            progress=RangeCounts(counts),
            pieces=pieces,
            piece_bytes=piece_bytes,
            bounds=bounds,
        )
        return ProcessPoolExecutor(processes, context, initializer=start_forked_worker), counts
    # A clean worker imports its own watchdog: it renders under this process's budget, as a
    # forked one does by inheritance.
    budget = (RENDER_WATCHDOG.seconds, RENDER_WATCHDOG.memory_bytes)
    pool = ProcessPoolExecutor(
        processes,
        context,
        initializer=_start_worker,
        initargs=(work, counts, pieces, piece_bytes, bounds, budget, workers_environment()),
    )
    return pool, counts


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """The stop signals held back while a process forks its workers (or its job's child): a
    stop landing mid-fork would run the CLI's handler in an after-fork hook, where its
    KeyboardInterrupt is printed and dropped. A child begins with them held and with this
    process's handlers, and lets them through only once it has set its own
    (leave_stopping_to_parent); this process gets them when this ends."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        # Held in this thread only: one sent to the process may reach another thread, and the
        # handler then runs here at the next check, a hook's os.kill or logging's lock included;
        # deferred, it notes the stop, raised once the fork is whole.
        with interrupts.stops_deferred():
            yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def start_forked_worker() -> None:
    """A worker forked with its parent's state: ended with its parent, stops left to it."""
    end_with_parent()
    leave_stopping_to_parent()


def leave_stopping_to_parent() -> None:
    """In a worker: Ctrl-C and a hang-up (sent to the terminal's whole process group) are the
    parent's to act on, and SIGTERM, from the parent ending its workers, ends the worker at once,
    without a traceback."""
    for signum in GROUP_STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def end_workers(pool: ProcessPoolExecutor) -> None:
    """Workers ended at once, their work abandoned: shutting the pool down would wait for it."""
    workers = list((pool._processes or {}).values())  # the executor has no public handle on them
    # The pool's own thread reaps a dead worker too: until it is done, the worker's exit code may
    # read as unknown here (worker_death would not name the signal).
    reaper = pool._executor_manager_thread
    pool.shutdown(wait=False, cancel_futures=True)
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.join(END_WORKERS_S)
        if worker.is_alive():
            worker.kill()
    if reaper is not None:
        reaper.join(END_WORKERS_S)


def worker_death(workers: list[Any]) -> str:
    """One line: which signal ended a worker (the pool ends the others with SIGTERM) and the
    last words its native code wrote (a Rust abort says why there, nowhere else), which are
    logged at WARNING too."""
    codes = [worker.exitcode for worker in workers if worker.exitcode]
    # A signal (an abort, a segfault, the OOM killer) is the cause; a sibling's exit code, or the
    # SIGTERM the pool ends the others with, follows from it.
    ranked = [c for c in codes if c < 0 and c != -signal.SIGTERM]
    ranked += [c for c in codes if c > 0] + codes
    cause = ranked[0] if ranked else None
    how = (
        ""
        if cause is None
        else f" by {signal.Signals(-cause).name}"
        if cause < 0
        else f" with exit code {cause}"
    )
    words = last_words()
    for line in words:
        _LOG.warning("native: %s", line)
    said = f"; its native code's last words: {' | '.join(words[-2:])}" if words else ""
    return f"a worker process died{how}{said}"


def can_fork() -> bool:
    """Whether workers may fork from this process, inheriting its loaded tokenizer and imported
    renderer (~1.5 s of a core per worker otherwise): only where nothing but this thread runs
    and gRPC was never loaded (a Beam run in this process leaves threads whose locks a fork
    would copy held). The tokenizer's own thread pool is fork-aware."""
    return (
        "fork" in multiprocessing.get_all_start_methods()
        and busy_threads() == 0
        and "grpc" not in sys.modules
    )


@contextlib.contextmanager
def _single_threaded_tokenizers_in_children() -> Iterator[None]:
    """Workers tokenize on one thread each (a worker per core), said through the variable the
    tokenizer reads when a process starts or forks (a forked one would otherwise warn that it
    turns its threads off, this process having used them)."""
    before = os.environ.get(TOKENIZERS_PARALLELISM)
    os.environ[TOKENIZERS_PARALLELISM] = "false"
    try:
        yield
    finally:
        if before is None:
            del os.environ[TOKENIZERS_PARALLELISM]
        else:
            os.environ[TOKENIZERS_PARALLELISM] = before


def workers_environment() -> dict[str, str]:
    """This process's environment as its workers run in it (one tokenizer thread each)."""
    return {**os.environ, TOKENIZERS_PARALLELISM: "false"}


def adopt_environment(environment: dict[str, str]) -> None:
    """A clean worker runs in its parent's environment as it is now: a forkserver's children
    inherit the server's, taken when it started, before a salt (KVTRACE_SALT) or setting may
    have been set."""
    os.environ.clear()
    os.environ.update(environment)


def _start_worker(
    work: RangeWork,
    counts: Any,
    pieces: list[FileRange],
    piece_bytes: Sequence[int],
    bounds: Any,
    budget: tuple[float, int],
    environment: dict[str, str],
) -> None:
    """A worker started clean, its encoder loaded and warmed up at its first claim
    (_encode_claimed)."""
    end_with_parent()
    adopt_environment(environment)
    leave_stopping_to_parent()
    RENDER_WATCHDOG.seconds, RENDER_WATCHDOG.memory_bytes = budget
    _WORKER.update(
        work=work,
        progress=RangeCounts(counts),
        pieces=pieces,
        piece_bytes=piece_bytes,
        bounds=bounds,
        cold=True,
    )
    settle_after_start_up()


def run_bounds(count: int, processes: int) -> list[int]:
    """One run of neighbouring ranges per worker, as [front, back) pairs flattened. A session's
    requests sit near each other in a log, so each worker's segment cache learns a session's
    history once; ranges dealt out in turn made every worker learn every session's history
    again at each range (agent logs: 87.6% of tokens from the cache with 2 workers, 89.9% in
    runs, 91.1% in one process)."""
    return [count * (w + side) // processes for w in range(processes) for side in (0, 1)]


def claim(bounds: MutableSequence[int], worker: int) -> int | None:
    """The next range for a worker: the front of its own run, then, once that is done, the back
    of the run with most left, so a worker slowed by its ranges or its core is helped rather
    than waited for, and what is taken from a run stays a neighbour of what its thief took
    before. None when every range is taken."""
    front, back = bounds[2 * worker], bounds[2 * worker + 1]
    if front < back:
        bounds[2 * worker] = front + 1
        return front
    victim = max(range(len(bounds) // 2), key=lambda v: bounds[2 * v + 1] - bounds[2 * v])
    if bounds[2 * victim + 1] <= bounds[2 * victim]:
        return None
    bounds[2 * victim + 1] -= 1
    return bounds[2 * victim + 1]


def _encode_claimed(worker: int) -> list[tuple[int, Encoded]]:
    """Ranges encoded by one worker, each with its place in the input (results are put back in
    input order, whoever encoded them)."""
    pieces, bounds, done = _WORKER["pieces"], _WORKER["bounds"], []
    # A clean worker is warmed up as a forked one was: its first render imports the renderer and
    # compiles the template (~0.2 s of a core, seconds of the wall clock on a loaded machine),
    # which must not count against a record's render budget, or that record's fate would hang on
    # the machine's load. Loaded and warmed here, not in the initializer: what loading refuses
    # (a tokenizer or backend failing its probes) or a stop the warm-up raises (a hostile
    # template) is then the run's error, as in a forked run's parent, not a broken pool.
    if _WORKER.pop("cold", False):
        _WORKER["encoder"] = _WORKER["work"].new_encoder()
        _WORKER["work"].warm_up(_WORKER["encoder"], pieces[0])
    while True:
        with bounds.get_lock():
            index = claim(bounds, worker)
        if index is None:
            return done
        progress = _WORKER["progress"]
        progress.start_range(_WORKER["piece_bytes"][index])
        done.append((index, _WORKER["work"].encode([pieces[index]], _WORKER["encoder"], progress)))
        progress.end_range()
