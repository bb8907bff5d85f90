"""A stop deferred across a critical section (interrupts): raised at once outside one, at the
end of the outermost one inside, never deferred by another thread's section."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from kvtrace.transforms.write import interrupts


@pytest.fixture
def stops_as_the_cli_handles_them() -> Iterator[None]:
    """SIGINT handled as the CLI's handler does: interrupts.stop (the test runs in the main
    thread, where Python runs signal handlers)."""
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupts.stop())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_stop_outside_a_section_is_raised_at_once(stops_as_the_cli_handles_them):
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)


def test_a_stop_inside_a_section_is_raised_as_the_section_ends(stops_as_the_cli_handles_them):
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.stops_deferred():
            signal.raise_signal(signal.SIGINT)
            done.append("the rest of the section")
    assert done == ["the rest of the section"]
    with interrupts.stops_deferred():  # the stop was raised once: the next section runs whole
        done.append("a later section")
    assert done[-1] == "a later section"


def test_nested_sections_raise_the_stop_at_the_outermost_end(stops_as_the_cli_handles_them):
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.stops_deferred():
            with interrupts.stops_deferred():
                signal.raise_signal(signal.SIGINT)
            done.append("after the inner section")
    assert done == ["after the inner section"]


def test_a_section_that_fails_raises_the_stop_with_its_failure_as_context(
    stops_as_the_cli_handles_them,
):
    with pytest.raises(KeyboardInterrupt) as raised:
        with interrupts.stops_deferred():
            signal.raise_signal(signal.SIGINT)
            raise OSError("a rename failed")
    assert isinstance(raised.value.__context__, OSError)


def test_another_threads_section_never_defers_the_main_threads_stop(stops_as_the_cli_handles_them):
    inside, leave = threading.Event(), threading.Event()

    def publication() -> None:
        with interrupts.stops_deferred():
            inside.set()
            leave.wait(30)

    worker = threading.Thread(target=publication)
    worker.start()
    try:
        assert inside.wait(30)
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        leave.set()
        worker.join(30)
    assert not worker.is_alive()
