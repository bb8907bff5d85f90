"""Dead-letter records: a rejected record, where it came from, and why."""

from __future__ import annotations

import json
from dataclasses import dataclass

DEAD_LETTER_TAG = "rejected"
DAMAGED_FILE = "damaged_file"  # the reason of a file that breaks off, rather than of a record


@dataclass(frozen=True)
class DeadLetter:
    source: str
    line: bytes
    reason: str
    message: str
    # Input bytes that could not become records (a damaged file's cut record or unreadable
    # rest): --max-rejected-fraction weighs them as well as the count of records.
    lost_bytes: int = 0

    def to_json(self) -> str:
        # Undecodable bytes stay visible as \xNN escapes, so the line can be found and fixed.
        return json.dumps(
            {
                "source": self.source,
                "error": self.reason,
                "message": self.message,
                "line": self.line.decode("utf-8", errors="backslashreplace"),
                **({"lost_bytes": self.lost_bytes} if self.lost_bytes else {}),
            },
            ensure_ascii=False,
        )

