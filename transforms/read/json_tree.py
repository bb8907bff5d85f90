"""Checks on a decoded JSON value before any field of it is used: nesting depth, and valid
Unicode in every string and key. Iterative, so a hostile value cannot blow the stack."""

from __future__ import annotations

import json
from typing import Any

from transforms.errors import Rejected

# Real requests nest about 5 deep (messages > message > content > part), tool schemas ~15;
# far deeper is an attack or a bug, and deep recursion is what makes parsers fall over.
MAX_NESTING_DEPTH = 64


def loads_checked(text: str) -> Any:
    """json.loads, with nesting beyond what the parser's stack survives rejected as too deep."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise Rejected("too_deep", "JSON nested too deep to parse") from None
    check_tree(value, check_strings=False)
    return value


def check_tree(value: Any, check_strings: bool = True) -> None:
    """Nesting depth and (when asked) valid Unicode in every string and key, iteratively so a
    hostile record cannot blow the stack."""
    if not check_strings:
        _check_depth(value)
        return
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            if check_strings and not node.isascii():
                _check_unicode(node)
            continue
        if isinstance(node, dict):
            if check_strings:
                stack.extend((key, depth) for key in node)
            node = node.values()
        elif not isinstance(node, list):
            continue
        if depth > MAX_NESTING_DEPTH:
            raise Rejected("too_deep", f"nested deeper than {MAX_NESTING_DEPTH} levels")
        stack.extend((child, depth + 1) for child in node)


def _check_depth(value: Any) -> None:
    """Nesting depth alone, a level at a time over containers only: 4-5x faster than the walk
    above on logged chats (most nodes are strings, and streamed responses are thousands of
    small objects). Parsers give exact dicts and lists, so types are compared exactly."""
    containers = (dict, list)
    level = [value] if type(value) in containers else []
    depth = 1
    while level:
        if depth > MAX_NESTING_DEPTH:
            raise Rejected("too_deep", f"nested deeper than {MAX_NESTING_DEPTH} levels")
        level = [child for node in level
                 for child in (node.values() if type(node) is dict else node)
                 if type(child) in containers]
        depth += 1


def _check_unicode(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise Rejected("invalid_unicode", f"a string holds a lone surrogate at character "
                       f"{err.start} (not encodable as UTF-8)") from None
