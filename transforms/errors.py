"""The errors kvtrace raises on purpose: Rejected, for one bad record (it becomes a dead letter);
ConfigError, for options a run cannot start with; IdMapError, for an id map a run cannot use
(found before the run starts); JobStopped, for a run that must not publish (too much rejected,
a map conflict). No Beam here: the CLI imports this."""

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


# What a record that reaches code no check anticipated raises. Every field is type-checked before
# use; this is the net under those checks, so that one record can never stop a night's job. The
# record becomes a dead letter with reason "malformed_record" (found by the fuzz tests, then
# given a check of its own).
UNANTICIPATED = (
    TypeError,
    ValueError,
    KeyError,
    IndexError,
    AttributeError,
    RecursionError,
    OverflowError,
    UnicodeError,
)


def unanticipated(err: BaseException) -> Rejected:
    return Rejected("malformed_record", f"{type(err).__name__}: {str(err)[:200]}")


JOB_STOPPED = "kvtrace stopped the job"


class JobStopped(RuntimeError):
    """Raised inside the pipeline to stop a run before it publishes anything wrong. Runners wrap
    worker errors in their own; the marker lets the CLI find the message and print just that."""

    def __init__(self, message: str):
        super().__init__(f"{JOB_STOPPED}: {message}")

    @staticmethod
    def message_in(error: BaseException) -> str | None:
        text = str(error)
        if JOB_STOPPED not in text:
            return None
        # Beam wraps a worker's error in its own text, the marker's included: the last one's
        # message, without the step Beam names after it.
        message = text[text.rindex(JOB_STOPPED) + len(JOB_STOPPED) + 2 :].splitlines()[0]
        return message.split(" [while running '")[0]


class ConfigError(ValueError):
    """Options or a config file that cannot be used; the message says which and why."""


class IdMapError(ValueError):
    """An id map that cannot be used with this run; the message says why and what to do."""
