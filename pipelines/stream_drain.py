"""A stream on the local DirectRunner stopped (Ctrl-C, SIGTERM, SIGHUP) drains: its Pub/Sub
read stops pulling and ends, so the watermark reaches the end of time and the controller's END
timer publishes every open window and every letter waiting (PublishWindows.publish_all, the
path a stream's end takes), and the totals are written. Beam's DirectRunner acknowledges each
message as it pulls it: a stream cancelled instead would lose its open windows' requests,
neither published nor lettered nor counted; a message not yet pulled stays on the subscription.

While the stream runs the stop signals are the drain's: the CLI's stop (which ends the process
1.5 s after the signal) is passed the second signal, or the first once DRAIN_S passed without
the drain ending. A hard kill (SIGKILL) loses what was pulled: docs/STREAMING.md, Stopping."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from apache_beam.runners.direct.direct_runner import _DirectReadFromPubSub
from apache_beam.runners.direct.transform_evaluator import (
    TransformEvaluatorRegistry,
    TransformResult,
    _PubSubReadEvaluator,
)
from apache_beam.utils.timestamp import MAX_TIMESTAMP

from kvtrace.pipelines.processes import STOP_SIGNALS

# A drain outlasting this (a pull the emulator holds, a window slow to write) is stopped as a
# second signal would stop it.
DRAIN_S = 60.0
PAUSE_S = 0.5  # between pulls that found nothing
# Set by a stop: the local Pub/Sub read ends at its next bundle (one stream per process).
DRAINING = threading.Event()
# What stopped the stream from within (a window its writer could not publish, fail()).
_FAILURES: list[BaseException] = []


def fail(error: BaseException, supersede: bool = False) -> None:
    """The stream cannot go on publishing (its writer, in this process on the local runner):
    it drains as on a stop, its windows left and letters published as letters, then ends
    with error (Drain.failure): the first, or the latest superseding (one that says more, as
    how many records could not be lettered either). Elsewhere the writer letters every later
    window."""
    if supersede:
        _FAILURES.clear()
    if not _FAILURES:
        _FAILURES.append(error)
    DRAINING.set()


class DrainingPubSubRead(_PubSubReadEvaluator):
    """Beam's DirectRunner Pub/Sub read, which ends (no more pulls, its watermark the end of
    time) once DRAINING is set; the messages it pulled before go on downstream first. Its pulls
    never wait long for messages (ShortPulls), so that a stop is heard soon."""

    def finish_bundle(self) -> TransformResult:
        if not DRAINING.is_set():
            return super().finish_bundle()
        return TransformResult(self, [], [], None, {None: MAX_TIMESTAMP})

    @classmethod
    def _get_subscriber_client(cls, transform: Any) -> Any:
        return ShortPulls(super()._get_subscriber_client(transform))


class ShortPulls:
    """A subscriber client whose pulls return at once, pausing PAUSE_S (or until a drain) when
    nothing came: Beam's wait 30 s, which the emulator (and Pub/Sub, polling long) holds to its
    end when no message comes, and a drain waited for it. A pull is never cut short by its
    deadline, which would leave what the server handed it to come back 10 s later (late)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def pull(self, **request: Any) -> Any:
        response = self._client.pull(**{**request, "return_immediately": True})
        if not response.received_messages:
            DRAINING.wait(PAUSE_S)
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


# Beam's registry takes evaluators by transform class, this hook its only way in; the read
# behaves as Beam's until a drain.
TransformEvaluatorRegistry._test_evaluators_overrides[_DirectReadFromPubSub] = DrainingPubSubRead


class Drain:
    """The stop signals of a local stream: the first one's number, if any, and what was
    published (published()) when it came."""

    def __init__(self, published: Callable[[], int]) -> None:
        self.signum: int | None = None
        self.published_at_stop = 0
        self._published = published
        self._previous: dict[int, Any] = {}
        self._taken = False
        self._wakeup_fd = -1
        self._timer: threading.Timer | None = None

    @property
    def failure(self) -> BaseException | None:
        """What stopped the stream from within (fail), if anything: raised once it drained."""
        return _FAILURES[0] if _FAILURES else None

    def _stop(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
            self.published_at_stop = self._published()
            DRAINING.set()
            self._timer = threading.Timer(DRAIN_S, os.kill, (os.getpid(), signum))
            self._timer.daemon = True
            self._timer.start()
            return
        self._give_back()
        if self._wakeup_fd >= 0:  # the CLI's watcher learns of the stop as from the signal
            with contextlib.suppress(OSError):
                os.write(self._wakeup_fd, bytes([signum]))
        handler = self._previous.get(signum)
        if callable(handler):
            handler(signum, frame)
        else:
            raise KeyboardInterrupt

    def _give_back(self) -> None:
        """The signals back to whoever handled them before (the CLI's stop)."""
        if self._timer is not None:
            self._timer.cancel()
        if threading.current_thread() is not threading.main_thread() or not self._taken:
            return
        self._taken = False
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(self._wakeup_fd)


@contextlib.contextmanager
def drained_on_stop(published: Callable[[], int]) -> Iterator[Drain]:
    """The stop signals drain the local stream run within (in the main thread: Python handles
    signals there); given back as it ends, drained or not. published(): what the stream has
    published so far, read at the stop."""
    drain = Drain(published)
    DRAINING.clear()
    _FAILURES.clear()
    if threading.current_thread() is not threading.main_thread():
        yield drain
        return
    # The CLI's watcher hears a signal from this fd and ends the process 1.5 s later: not a
    # drain's time. It is given the signals the drain passes on.
    drain._wakeup_fd = signal.set_wakeup_fd(-1)
    drain._previous = {signum: signal.signal(signum, drain._stop) for signum in STOP_SIGNALS}
    drain._taken = True
    try:
        yield drain
    finally:
        drain._give_back()
        DRAINING.clear()
