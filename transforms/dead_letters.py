"""Dead-letter records: a rejected record, where it came from, and why."""

from __future__ import annotations

import json
from dataclasses import dataclass

import apache_beam as beam
from apache_beam.metrics import Metrics

DEAD_LETTER_TAG = "rejected"
DAMAGED_FILE = "damaged_file"  # the reason of a file that breaks off, rather than of a record


@dataclass(frozen=True)
class DeadLetter:
    source: str
    line: bytes
    reason: str
    message: str

    def to_json(self) -> str:
        # Undecodable bytes stay visible as \xNN escapes, so the line can be found and fixed.
        return json.dumps(
            {
                "source": self.source,
                "error": self.reason,
                "message": self.message,
                "line": self.line.decode("utf-8", errors="backslashreplace"),
            },
            ensure_ascii=False,
        )


def dead_letter(source: str, line: bytes, reason: str, message: str) -> beam.pvalue.TaggedOutput:
    """A dead letter for a DoFn to yield; counted per reason in Beam Metrics (rejected_REASON),
    so a running job's console shows what is being rejected."""
    Metrics.counter("kvtrace", f"rejected_{reason}").inc()
    return beam.pvalue.TaggedOutput(DEAD_LETTER_TAG, DeadLetter(source, line, reason, message))
