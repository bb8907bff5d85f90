"""The streaming controller's work per message, whatever it holds open: N messages into
PublishWindows.process (its state and timers faked, nothing fires), each opening a window of
its own two minutes after the last (one-minute windows: none passes another's deadline, so
all stay open), as round 24's reproducer feeds it. Prints the deadline timer sets and the END
timer sets apart, the due times computed (Progress.due_ms) and the CPU seconds:

    PYTHONPATH=. python benchmarks/bench_stream_controller.py --messages 200 1000 5000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

START_MS = 1_767_225_600_000  # 2026-01-01
NOW_MS = 1_800_000_000_000  # the source's clock


class Bag:
    """A bag state, in memory."""

    def __init__(self) -> None:
        self.items: list = []

    def add(self, item: Any) -> None:
        self.items.append(item)

    def read(self) -> list:
        return list(self.items)

    def clear(self) -> None:
        self.items = []


class Value:
    """A read-modify-write state, in memory: None until written, as Beam's."""

    def __init__(self) -> None:
        self.value: Any = None

    def read(self) -> Any:
        return self.value

    def write(self, value: Any) -> None:
        self.value = value


def run(messages: int, work: Path) -> dict[str, float]:
    from kvtrace.pipelines import anonymize_streaming
    from kvtrace.pipelines.anonymize_config import AnonymizeConfig
    from kvtrace.pipelines.anonymize_streaming import Progress, PublishWindows, StreamingConfig
    from kvtrace.transforms.encode.hashed_batch import HashedBatch, HashedRequest
    from kvtrace.transforms.encode.salt import SaltSource

    counts = {"deadline timer sets": 0, "END timer sets": 0, "due times": 0}

    class Timers:
        def __init__(self, counted: str | None = None) -> None:
            self.counted = counted

        def set(self, timestamp: Any, dynamic_timer_tag: str = "") -> None:
            if self.counted:
                counts[self.counted] += 1

        def clear(self, dynamic_timer_tag: str = "") -> None:
            pass

    due_ms = Progress.due_ms

    def counted(self: Progress, *args: Any) -> int:
        counts["due times"] += 1
        return due_ms(self, *args)

    Progress.due_ms = counted  # type: ignore[method-assign]
    anonymize_streaming.source_now_ms = lambda: NOW_MS
    job = AnonymizeConfig(
        inputs=(),
        output=str(work / "out"),
        staging=str(work / "staging"),
        tokenizer="x",  # nothing is tokenized: the requests come hashed
        salt=SaltSource("env", "KVTRACE_SALT"),
        dead_letter=str(work / "rejected"),
    )
    publisher = PublishWindows(StreamingConfig(job, "pubsub:projects/p/subscriptions/s", 60_000))
    state = {"pending": Bag(), "progress_state": Value()}
    timers = {
        "deadline": Timers("deadline timer sets"),
        "letters_due": Timers(),
        "end": Timers("END timer sets"),
    }
    started = time.process_time()
    for i in range(messages):
        request = HashedRequest(START_MS + i * 120_000, i, 1, 1, b"", None)
        publisher.process((0, HashedBatch.pack([request])), **state, **timers)
    Progress.due_ms = due_ms  # type: ignore[method-assign]
    return {**counts, "CPU-s": round(time.process_time() - started, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, nargs="+", default=[200, 1000])
    args = parser.parse_args()
    for messages in args.messages:
        with tempfile.TemporaryDirectory() as work:
            print(messages, run(messages, Path(work)))


if __name__ == "__main__":
    main()
