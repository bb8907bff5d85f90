"""The one error a bad record raises; it becomes a dead-letter record, never a failed job."""

from __future__ import annotations


class Rejected(Exception):
    """A record kvtrace cannot turn into a trace row.

    reason is a short stable code (invalid_json, wrong_type, ...) that dead-letter readers can
    group by; the message says what was wrong in words.
    """

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message
