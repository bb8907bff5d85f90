"""A local stream's stop signals: the first drains it, the second goes to whoever handled stops
before (the CLI's stop), with its wakeup fd, as if the drain had never taken them."""

from __future__ import annotations

import signal
import socket

import pytest


@pytest.mark.beam
def test_the_first_stop_drains_the_second_is_passed_on():
    from kvtrace.pipelines.stream_drain import DRAINING, drained_on_stop

    passed_on: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: passed_on.append(signum))
    heard, written = socket.socketpair()
    written.setblocking(False)
    heard.setblocking(False)
    before_fd = signal.set_wakeup_fd(written.fileno(), warn_on_full_buffer=False)
    try:
        with drained_on_stop(lambda: 3) as drain:
            signal.raise_signal(signal.SIGTERM)
            assert DRAINING.is_set() and drain.signum == signal.SIGTERM
            assert drain.published_at_stop == 3
            assert passed_on == []
            with pytest.raises(BlockingIOError):  # the CLI's watcher hears nothing yet
                heard.recv(1)
            signal.raise_signal(signal.SIGTERM)
            assert passed_on == [signal.SIGTERM]
            assert heard.recv(1) == bytes([signal.SIGTERM])
        assert not DRAINING.is_set()
        assert signal.set_wakeup_fd(written.fileno()) == written.fileno()  # given back
    finally:
        signal.set_wakeup_fd(before_fd)
        signal.signal(signal.SIGTERM, before)
        heard.close()
        written.close()


@pytest.mark.beam
def test_a_stream_not_stopped_gives_the_signals_back_untouched():
    from kvtrace.pipelines.stream_drain import DRAINING, drained_on_stop

    handler = signal.getsignal(signal.SIGINT)
    with drained_on_stop(lambda: 0) as drain:
        assert signal.getsignal(signal.SIGINT) != handler
    assert signal.getsignal(signal.SIGINT) == handler
    assert drain.signum is None and not DRAINING.is_set()


@pytest.mark.beam
def test_pulls_return_at_once_and_a_drain_ends_the_pause_after_an_empty_one():
    from google.pubsub_v1.types import PullResponse, ReceivedMessage

    from kvtrace.pipelines.stream_drain import DRAINING, ShortPulls

    class Client:
        def __init__(self, responses: list[PullResponse]) -> None:
            self.requests: list[dict] = []
            self.responses = responses

        def pull(self, **request: object) -> PullResponse:
            self.requests.append(request)
            return self.responses.pop(0)

    some = PullResponse(received_messages=[ReceivedMessage(ack_id="a")])
    client = Client([some, PullResponse()])
    pulls = ShortPulls(client)
    assert pulls.pull(subscription="s", max_messages=10, timeout=30) is some
    DRAINING.set()  # the pause ends with a drain: none here, then
    try:
        assert list(pulls.pull(subscription="s", max_messages=10).received_messages) == []
    finally:
        DRAINING.clear()
    assert [r["return_immediately"] for r in client.requests] == [True, True]
    assert pulls.responses == []  # the rest is the client's
