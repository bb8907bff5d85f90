"""What a chat template may call by name: the pure globals, filters and tests of transformers'
renderer, and a clock that reads the request's own time.

A render must give the same text for the same request on any worker, day or zone. Jinja and
transformers also hand templates names whose result is not the request's: Jinja's `random`
filter and `lipsum` global draw from Python's unseeded random module, and transformers'
`strftime_now` reads the worker's local wall clock (Llama 3.x templates print it in every
system prompt). So the sandbox (bounded_sandbox.BoundedSandbox) keeps only the names listed
here, whatever Jinja or transformers add: a name off the lists is undefined, and a template
that uses it fails to render, the same dead letter on every run. `strftime_now` is kept, bound
to the time of the request being rendered, in UTC: what the engine's clock read when the
request came in.

Its format is spelled here, never by C's strftime, which reads the process's state: glibc's
`%s` converts the time with mktime, in the worker's zone (TZ), and names and `%c`, `%x`, `%X`
follow its locale. So strftime_now takes a closed list of specifiers (SPECIFIERS and
COMPOUNDS: C99's, with GNU's `%s` and `-` flag for no padding, and Python's `%f`), each
spelled from the UTC time as the C locale spells it; any other fails the render, the same
letter on every worker.
"""

from __future__ import annotations

import contextvars
import datetime
import re
from typing import Any, Callable

# Jinja's own globals but lipsum, and transformers' (raise_exception, strftime_now, its dict
# and namespace in place of Jinja's).
GLOBALS = frozenset(
    {"range", "dict", "namespace", "cycler", "joiner", "raise_exception", "strftime_now"}
)
# Jinja's filters but random (transformers replaces tojson with its own).
FILTERS = frozenset(
    {
        "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort",
        "e", "escape", "filesizeformat", "first", "float", "forceescape", "format", "groupby",
        "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max",
        "min", "pprint", "reject", "rejectattr", "replace", "reverse", "round", "safe",
        "select", "selectattr", "slice", "sort", "string", "striptags", "sum", "title",
        "tojson", "trim", "truncate", "unique", "upper", "urlencode", "urlize", "wordcount",
        "wordwrap", "xmlattr",
    }
)  # fmt: skip
# Jinja's tests, every one a function of its operands.
TESTS = frozenset(
    {
        "!=", "<", "<=", "==", ">", ">=", "boolean", "callable", "defined", "divisibleby",
        "eq", "equalto", "escaped", "even", "false", "filter", "float", "ge", "greaterthan",
        "gt", "in", "integer", "iterable", "le", "lessthan", "lower", "lt", "mapping", "ne",
        "none", "number", "odd", "sameas", "sequence", "string", "test", "true", "undefined",
        "upper",
    }
)  # fmt: skip
CLOCK = "strftime_now"

# The longest format strftime_now formats: far past any date a template spells (Llama 3's is 8
# characters), and short enough that its one C call, which no render budget can stop (each
# directive up to ~24 characters, in a buffer doubled until it fits), stays within kilobytes.
MAX_CLOCK_FORMAT = 256

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
# The time of the request this thread renders, in ms since the epoch; set around each render.
_request_ms: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "kvtrace_request_ms", default=None
)


def render_at(timestamp_ms: int, render: Callable[[], str]) -> str:
    """render(), with strftime_now reading timestamp_ms (UTC)."""
    token = _request_ms.set(timestamp_ms)
    try:
        return render()
    finally:
        _request_ms.reset(token)


def strftime_now(format: str) -> str:
    """The request's time as format spells it, in UTC: transformers' strftime_now, read from
    the request rather than the worker's clock and zone."""
    if isinstance(format, str) and len(format) > MAX_CLOCK_FORMAT:
        raise ValueError(
            f"strftime_now: a format of {len(format)} characters, over {MAX_CLOCK_FORMAT}"
        )
    timestamp_ms = _request_ms.get()
    if timestamp_ms is None:
        raise ValueError("strftime_now: no request time to read (a render outside render_at)")
    moment = _EPOCH + datetime.timedelta(milliseconds=timestamp_ms)
    return _SPECIFIER.sub(lambda found: _spelled(moment, found), format)


_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)  # fmt: skip


def _week(moment: datetime.datetime, first_day: int) -> str:
    """The week of the year, weeks starting on first_day (0 Monday, 6 Sunday), days before the
    first such day in week 0."""
    yday = moment.timetuple().tm_yday - 1
    return f"{(yday + 7 - (moment.weekday() - first_day) % 7) // 7:02d}"


def _hour12(moment: datetime.datetime) -> str:
    return f"{(moment.hour - 1) % 12 + 1:02d}"


# Each specifier as the C locale spells it, of a UTC time.
SPECIFIERS: dict[str, Callable[[datetime.datetime], str]] = {
    "a": lambda t: _DAYS[t.weekday()][:3],
    "A": lambda t: _DAYS[t.weekday()],
    "b": lambda t: _MONTHS[t.month - 1][:3],
    "h": lambda t: _MONTHS[t.month - 1][:3],
    "B": lambda t: _MONTHS[t.month - 1],
    "C": lambda t: f"{t.year // 100:02d}",
    "d": lambda t: f"{t.day:02d}",
    "e": lambda t: f"{t.day:2d}",
    "f": lambda t: f"{t.microsecond:06d}",
    "G": lambda t: f"{t.isocalendar()[0]:d}",
    "H": lambda t: f"{t.hour:02d}",
    "I": _hour12,
    "j": lambda t: f"{t.timetuple().tm_yday:03d}",
    "m": lambda t: f"{t.month:02d}",
    "M": lambda t: f"{t.minute:02d}",
    "p": lambda t: "AM" if t.hour < 12 else "PM",
    "s": lambda t: str((t - _EPOCH) // datetime.timedelta(seconds=1)),
    "S": lambda t: f"{t.second:02d}",
    "u": lambda t: str(t.isoweekday()),
    "U": lambda t: _week(t, 6),
    "V": lambda t: f"{t.isocalendar()[1]:02d}",
    "w": lambda t: str(t.isoweekday() % 7),
    "W": lambda t: _week(t, 0),
    "y": lambda t: f"{t.year % 100:02d}",
    "Y": lambda t: str(t.year),
    "z": lambda t: "+0000",
    "Z": lambda t: "UTC",
    "%": lambda t: "%",
    "n": lambda t: "\n",
    "t": lambda t: "\t",
}
# Specifiers that are others together, as the C locale writes them.
COMPOUNDS = {
    "c": "%a %b %e %H:%M:%S %Y",
    "D": "%m/%d/%y",
    "F": "%Y-%m-%d",
    "r": "%I:%M:%S %p",
    "R": "%H:%M",
    "T": "%H:%M:%S",
    "x": "%m/%d/%y",
    "X": "%H:%M:%S",
}
_SPECIFIER = re.compile(r"%(-?)(.?)", re.DOTALL)


def _spelled(moment: datetime.datetime, found: re.Match[str]) -> str:
    unpadded, letter = found.groups()
    if letter in COMPOUNDS and not unpadded:
        return _SPECIFIER.sub(lambda part: _spelled(moment, part), COMPOUNDS[letter])
    if letter not in SPECIFIERS:
        raise ValueError(
            f"strftime_now: {found.group()!r} is not a specifier kvtrace spells (one of "
            f"{''.join(sorted(SPECIFIERS.keys() | COMPOUNDS.keys()))}, with a '-' flag)"
        )
    text = SPECIFIERS[letter](moment)
    return str(int(text)) if unpadded and text.strip().isdigit() else text


class AllowedNames(dict):
    """A name -> value table of the environment (its globals or tests) that holds only allowed
    names, whatever is put in it later: others are left out, so undefined in a template."""

    def __init__(self, allowed: frozenset[str], values: dict[str, Any]):
        super().__init__()
        self._allowed = allowed
        for name, value in values.items():
            self[name] = value

    def __setitem__(self, name: str, value: Any) -> None:
        if name == CLOCK:
            value = strftime_now  # transformers sets its wall clock after the environment
        if name in self._allowed:
            super().__setitem__(name, value)

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        for name, value in dict(*args, **kwargs).items():
            self[name] = value

    def setdefault(self, name: str, value: Any = None) -> Any:  # type: ignore[override]
        if name not in self:
            self[name] = value
        return self.get(name)
