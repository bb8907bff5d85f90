"""Checks on JSON: before a line is parsed, how many containers it holds (what parsing it
would cost); once decoded, before any field of it is used, nesting depth and valid Unicode in
every string and key. Iterative, so a hostile value cannot blow the stack. And JSON texts
inside records (tool-call arguments) read exactly as the standard parser reads them, within
what their record's bound leaves (ContainerBudget)."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from kvtrace.transforms.errors import Rejected

# Real requests nest about 5 deep (messages > message > content > part), tool schemas ~15;
# far deeper is an attack or a bug, and deep recursion is what makes parsers fall over.
MAX_NESTING_DEPTH = 64


# A run of 19 digits, found by mapping every digit to "0" (C speed; a regex scan took 8x
# orjson's own time on 40 KB lines).
_DIGITS_AS_ZEROS = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_DIGIT_RUN = b"0" * 19
# A JSON string, to its closing quote or the line's end: possessive, so a quote never closed
# costs one pass over the rest, not one per quote after it.
_JSON_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"?', re.DOTALL)


def containers_over(line: bytes, most: int) -> int | None:
    """How many JSON objects and lists a line holds, when that is more than most (else None),
    found before it is parsed: a container parses to a Python dict or list of ~64 bytes for its
    2-3 bytes of text. The one rule every JSON line reader bounds its parse by. Brackets are
    counted at C speed; only past most, again outside the line's strings (where they are
    text), so a name holding brackets reads as the parsed line would."""
    if _brackets(line) <= most:
        return None
    count = _brackets(_JSON_STRING.sub(b"", line))
    return count if count > most else None


def _brackets(data: bytes) -> int:
    return data.count(b"[") + data.count(b"{")


def orjson_reading(data: bytes) -> tuple[bool, Any]:
    """(True, value) where orjson reads data as the standard parser would, (False, None) where
    the standard parser must: orjson takes strict JSON only (UTF-8, no lone surrogates, no NaN)
    and reads it alike, 1.5-3x faster, except integers past 64 bits (floats to it), so data
    with 19 digits in a row is left to the standard parser."""
    if _LONG_DIGIT_RUN in data.translate(_DIGITS_AS_ZEROS):
        return False, None
    try:
        return True, orjson.loads(data)
    except orjson.JSONDecodeError:
        return False, None


class ContainerBudget:
    """The JSON objects and lists a record's JSON texts inside strings (tool-call arguments) may
    still parse into, all of them together: a record's bound (the count its line is held to),
    so one large text or many small ones cost no more than the record's own containers may."""

    def __init__(self, most: int) -> None:
        self.left = most


def loads_checked(text: str, budget: ContainerBudget) -> Any:
    """json.loads's value of a JSON text inside a record, its containers counted by the rule
    every line reader bounds its parse by (containers_over) against what the record has left,
    before it is parsed, and nesting beyond what the parser's stack survives rejected as too
    deep. Read by orjson where that reads alike (orjson_reading): tool-call arguments are most
    of an agent log's small JSON texts."""
    data = text.encode("utf-8", "surrogatepass")  # a lone surrogate: invalid, orjson declines
    over = containers_over(data, budget.left)
    if over is not None:
        raise Rejected(
            "too_large",
            f"a JSON text inside a string holds {over} objects and lists, over the "
            f"{budget.left} its record may still parse",
        )
    try:
        read, value = orjson_reading(data)
        if not read:
            value = json.loads(text)
    except RecursionError:
        raise Rejected("too_deep", "JSON nested too deep to parse") from None
    budget.left -= _check_depth(value)
    return value


def check_tree(value: Any, check_strings: bool = True) -> None:
    """Nesting depth and (when asked) valid Unicode in every string and key, iteratively so a
    hostile record cannot blow the stack. The walk holds one iterator per open container, at
    most MAX_NESTING_DEPTH + 1, never an entry per value: a record's values cost their parse
    only (an entry per child was 64 bytes per `0,` of a list, 30 x the record)."""
    if not check_strings:
        _check_depth(value)
        return
    open_containers = [iter((value,))]
    while open_containers:
        for node in open_containers[-1]:
            if isinstance(node, str):
                if not node.isascii():
                    _check_unicode(node)
                continue
            if isinstance(node, dict):
                for key in node:
                    if isinstance(key, str) and not key.isascii():
                        _check_unicode(key)
                node = node.values()
            elif not isinstance(node, list):
                continue
            if len(open_containers) > MAX_NESTING_DEPTH:
                raise Rejected("too_deep", f"nested deeper than {MAX_NESTING_DEPTH} levels")
            open_containers.append(iter(node))
            break  # into the container; its parent's iterator resumes after it
        else:
            open_containers.pop()


def _check_depth(value: Any) -> int:
    """Nesting depth alone, a level at a time over containers only: 4-5x faster than the walk
    above on logged chats (most nodes are strings, and streamed responses are thousands of
    small objects). Parsers give exact dicts and lists, so types are compared exactly. Returns
    how many containers the value holds."""
    containers = (dict, list)
    level = [value] if type(value) in containers else []
    depth, count = 1, 0
    while level:
        if depth > MAX_NESTING_DEPTH:
            raise Rejected("too_deep", f"nested deeper than {MAX_NESTING_DEPTH} levels")
        count += len(level)
        level = [
            child
            for node in level
            for child in (node.values() if type(node) is dict else node)
            if type(child) in containers
        ]
        depth += 1
    return count


def _check_unicode(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise Rejected(
            "invalid_unicode",
            f"a string holds a lone surrogate at character {err.start} (not encodable as UTF-8)",
        ) from None
