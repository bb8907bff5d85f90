"""A chat template renders under a budget of time and memory, whatever the template does.

transformers' sandbox keeps a template from Python's internals and caps `range`, but nothing
bounds what a template computes: nested loops run for hours, `{% set s = s ~ s %}` in a loop
doubles until the OOM killer comes. A template compiles to Python code, so a watchdog thread can
stop it between any two of its steps: past the deadline, or once the process has grown by more
than the memory budget since the render began, it raises RenderOverrun in the rendering thread
(CPython's PyThreadState_SetAsyncExc, delivered at that thread's next bytecode). No list of
hostile constructs: every loop, macro call and concatenation is such a step.

RenderOverrun is a BaseException, so no `except Exception` in a template's runtime swallows it.
It is raised once per render, only while the thread's render is registered, inside
`Watchdog.run`: raised again, a second one could land in run's own handling of the first,
before the render is unregistered. The render is unregistered however it ends (any
BaseException, also one landing while it is unregistered, such as the CLI's KeyboardInterrupt
on SIGTERM), and unregistering clears one still pending under the lock the watchdog raises it
under, so it never lands in code after the render.

The budget is generous (normal renders take ~0.1 ms and a few MB): only a runaway template meets
it. Its time is the rendering thread's own CPU time, not the wall clock: a render waiting for a
core on a loaded machine is not charged for the wait, so whether a record renders does not
depend on the load (the same input gives the same dead letters on every run). Its memory is the
whole process's growth, which no real template comes within orders of magnitude of.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from kvtrace.transforms.encode.native_stderr import QUIET_ATTRIBUTE

RENDER_SECONDS = 5.0
RENDER_MEMORY_BYTES = 1 << 30  # the whole process's growth (RSS) while one render runs
TICK_SECONDS = 0.01  # how often a running render is looked at
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


T = TypeVar("T")


class RenderOverrun(BaseException):
    """Raised in a rendering thread that went over its budget."""


@dataclass
class _Render:
    clock: int  # the rendering thread's CPU-time clock
    cpu_deadline: float
    resident_at_start: int  # the watchdog's last sample, at most a tick old
    overran: bool = False


class Watchdog:
    """Bounds renders in any number of threads; its own thread starts with the first render."""

    def __init__(self, seconds: float = RENDER_SECONDS, memory_bytes: int = RENDER_MEMORY_BYTES):
        self.seconds = seconds
        self.memory_bytes = memory_bytes
        self._resident = _resident_bytes()  # sampled each tick: a render's baseline
        self._forget_thread()
        # a forked child (the local engine's workers) has no watchdog thread, and may have
        # inherited the lock held: it starts its own with its first render
        os.register_at_fork(after_in_child=self._forget_thread)

    def _forget_thread(self) -> None:
        self._renders: dict[int, _Render] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def run(self, render: Callable[[], T]) -> T:
        """render(), or RenderOverrun once it goes over the budget. A plain function, not a
        context manager: contextlib's own frames would be steps a RenderOverrun can land in
        before this one's cleanup runs. Whatever ends the render (its result, its error, the
        overrun, a stop's KeyboardInterrupt), it is left before anything else runs; a stop wins
        over the overrun it interrupted, so that the run still stops, and the overrun over the
        render's own error.

        The watchdog delivers at most one overrun per render, and only while it is registered,
        so the one may land anywhere from the registration to _leave, and nowhere else: in the
        render, in the inner handler, or between it and _leave (the outer handler). Once it
        has landed none follows, so the outer handler's own steps cannot be interrupted by one.
        """
        thread = threading.get_ident()
        if self._thread is None:
            self._start()
        clock = time.pthread_getcpuclockid(thread)
        entry = _Render(clock, time.clock_gettime(clock) + self.seconds, self._resident)
        ended: list[BaseException] = []  # what ended the render, then what landed after it
        handling = sys.exc_info()[1]  # the caller's, if it renders while handling one
        result: list[T] = []
        try:
            try:
                self._renders[thread] = entry
                result.append(render())
            except BaseException as err:
                ended.append(err)
            stop = self._leave(thread, any(isinstance(err, RenderOverrun) for err in ended))
        except BaseException as err:  # landed after the render ended, before it was left
            # landing in the inner handler, it may have come before that handler kept what it
            # was handling (a stop, to win): its context, if not the caller's own
            context = err.__context__
            ended.extend([err] if context in (None, handling, *ended) else [context, err])
            stop = self._leave(thread, any(isinstance(err, RenderOverrun) for err in ended))
        # nothing lands from here on: the render is left, any overrun pending cleared
        stops = [err for err in ended if not isinstance(err, (Exception, RenderOverrun))]
        if stop is not None or stops:
            raise stop or stops[0]  # the render was stopped (Ctrl-C, SIGTERM, exit)
        if entry.overran:
            raise RenderOverrun(
                f"over the render budget ({self.seconds:g} s, {self.memory_bytes >> 20} MiB)"
            )
        if ended:
            raise ended[0]
        return result[0]

    def _leave(self, thread: int, landed: bool) -> BaseException | None:
        """thread's render unregistered, whatever lands meanwhile: the first exception other
        than the overrun that landed here (a stop, to raise once the render is left). A
        RenderOverrun not yet delivered is cleared under the lock the watchdog delivers under,
        so none lands after this returns; only then (landed: it was), since CPython 3.11 leaves
        its interpreter's pending-work flag set by a clear, every later step of every thread
        then taking the slow path (+35% on a plain loop)."""
        stop = None
        while True:
            try:
                with self._lock:
                    render = self._renders.pop(thread, None)
                    if render is not None and render.overran and not landed:
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), None)
                return stop
            except RenderOverrun:
                landed = True  # the render's one overrun, already marked on it
            except BaseException as err:  # a signal handler's, raised in this thread
                stop = stop or err

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="render-watchdog", daemon=True
                )
                # Safe to fork beside (busy_threads): the one lock it takes is replaced in a
                # forked child (_forget_thread), and nothing else it holds is the child's.
                setattr(self._thread, QUIET_ATTRIBUTE, True)
                self._thread.start()

    def _watch(self) -> None:
        while True:
            time.sleep(TICK_SECONDS)
            self._resident = _resident_bytes()
            with self._lock:  # a render registered now is looked at next tick
                # only renders still registered, left under this lock: an overrun delivered
                # here lands in the render it is meant for, or is cleared as it is left (so its
                # thread, and its clock, are alive while read here)
                for thread, render in list(self._renders.items()):
                    if not render.overran and (
                        time.clock_gettime(render.clock) > render.cpu_deadline
                        or self._resident - render.resident_at_start > self.memory_bytes
                    ):
                        render.overran = True  # the one overrun of this render: never again
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(
                            ctypes.c_ulong(thread), ctypes.py_object(RenderOverrun)
                        )


def _resident_bytes() -> int:
    """This process's resident memory; 0 where Linux's /proc is absent (macOS), where only the
    deadline and the sandbox's sizes (bounded_sandbox.py) bound a render."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES
    except OSError:
        return 0
