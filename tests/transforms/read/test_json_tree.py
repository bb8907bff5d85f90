"""json_tree.containers_over: the one count of a JSON line's containers, made before it is
parsed, that every JSON line reader bounds its parse by; json_tree.check_tree: the walk every
decoded record goes through, whose own memory is its depth, not its values;
json_tree.loads_checked: JSON texts inside a record, parsed within what its bound leaves."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.json_tree import (
    MAX_NESTING_DEPTH,
    ContainerBudget,
    check_tree,
    containers_over,
    loads_checked,
)

# Strings rich in what a scan could take for structure: brackets, quotes and escapes.
TEXT = st.text(alphabet='[]{}"\\ab\n\u00e9\U0001f600', max_size=8)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=30,
)


def _containers(value: object) -> int:
    if isinstance(value, list):
        return 1 + sum(_containers(item) for item in value)
    if isinstance(value, dict):
        return 1 + sum(_containers(item) for item in value.values())
    return 0


@given(VALUES, st.booleans(), st.integers(0, 40))
def test_the_count_is_the_containers_a_parse_makes(value, ascii_only, most):
    """Brackets inside strings (escaped quotes, backslashes and all) are text: the count is
    what json.loads would build, over most or None."""
    line = json.dumps(value, ensure_ascii=ascii_only).encode()
    count = _containers(json.loads(line))
    assert containers_over(line, most) == (count if count > most else None)


def test_a_string_never_closed_hides_no_container_the_parser_would_build():
    """A quote never closed runs to the line's end: the parser stops there too, having built
    only what came before it."""
    assert containers_over(b'[[], "[[[[', 1) == 2
    assert containers_over(b'[[], "\\"[[[', 1) == 2
    assert containers_over(b'[[], "a\\', 1) == 2


def test_lines_of_many_quotes_or_brackets_are_counted_in_one_pass():
    """16 MiB of `[],` (5.6 M lists parsed: ~350 MB) is counted, not parsed; quotes that are
    never closed cost one pass, not one per quote (a scan of each to the end: 10^13 steps)."""
    size = 16 << 20
    assert containers_over(b"[" + b"[]," * (size // 3) + b"[]]", 3) == size // 3 + 2
    assert containers_over(b'\\"' * (size // 2) + b"[", 0) is None


def _verdict(value: object) -> str:
    """The reference walk, recursive: too_deep past MAX_NESTING_DEPTH open containers, then
    invalid_unicode for a lone surrogate in any string or key, else ok."""

    def deepest(node: object) -> int:
        children = node.values() if isinstance(node, dict) else node
        if not isinstance(node, (dict, list)):
            return 0
        return 1 + max((deepest(child) for child in children), default=0)

    def strings(node: object):
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            yield from node
            for child in node.values():
                yield from strings(child)
        elif isinstance(node, list):
            for child in node:
                yield from strings(child)

    if deepest(value) > MAX_NESTING_DEPTH:
        return "too_deep"
    if any(not text.isascii() and "\ud800" in text for text in strings(value)):
        return "invalid_unicode"
    return "ok"


def _nested(value: object, depth: int, kind: str) -> object:
    for _ in range(depth):
        value = [value, 1] if kind == "list" else {"k": value, "\u00e9": 1}
    return value


UNICODE_TEXT = st.text(alphabet="ab\u00e9\ud800", max_size=4)
UNICODE_VALUES = st.recursive(
    st.none() | st.integers() | UNICODE_TEXT,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(UNICODE_TEXT, children, max_size=4)
    ),
    max_leaves=20,
)


@given(UNICODE_VALUES, st.integers(0, 3), st.sampled_from(["list", "dict"]))
def test_the_walk_rejects_what_a_recursive_walk_rejects(value, extra, kind):
    """Depth first over the record's containers (strings and keys with lone surrogates
    anywhere, nesting around MAX_NESTING_DEPTH): the same verdict as recursion."""
    value = _nested(value, MAX_NESTING_DEPTH - 2 + extra, kind)
    try:
        check_tree(value)
        verdict = "ok"
    except Rejected as err:
        verdict = err.reason
    expected = _verdict(value)
    # too deep is found first only where the walk reaches the depth before a bad string
    assert verdict == expected or {verdict, expected} == {"too_deep", "invalid_unicode"}
    assert (verdict == "ok") == (expected == "ok")


def test_the_walk_holds_its_depth_not_an_entry_per_value():
    """A record of 1M small values (a 2 MB `[0,0,...]` line): the walk's own memory is a few
    iterators, not 64 bytes a value (64 MB: the record's parse again, 30 x its bytes)."""
    record = {"input_ids": [0] * 1_000_000, "nested": _nested(["\u00e9"], 60, "list")}
    tracemalloc.start()
    try:
        check_tree(record)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 1 MiB, not the walk's ~10 KiB: tracemalloc also counts other threads of a test worker
    # (108 KB seen in the fast set); the old walk held 64 MB.
    assert peak < 1 << 20, f"{peak} bytes held by the walk"


@given(VALUES, st.booleans(), st.integers(0, 40))
def test_a_text_in_a_string_spends_the_containers_its_parse_makes(value, ascii_only, most):
    """Over what the record has left: refused before it is parsed; else the budget goes down by
    exactly the containers built (brackets inside its strings are text, as in a line)."""
    text = json.dumps(value, ensure_ascii=ascii_only)
    count, budget = _containers(value), ContainerBudget(most)
    if count > most:
        with pytest.raises(Rejected) as refused:
            loads_checked(text, budget)
        assert refused.value.reason == "too_large" and budget.left == most
    else:
        assert repr(loads_checked(text, budget)) == repr(json.loads(text))
        assert budget.left == most - count


def test_many_small_texts_share_one_budget():
    """Each text far under the bound, together over it: the record's texts are bounded as one."""
    budget = ContainerBudget(1000)
    for _ in range(9):
        loads_checked("[" + "[]," * 99 + "[]]", budget)  # 101 containers each
    assert budget.left == 91
    with pytest.raises(Rejected, match="over the 91 its record may still parse"):
        loads_checked("[" + "[]," * 99 + "[]]", budget)


def test_a_text_deeper_than_the_parser_survives_is_too_deep_not_a_recursion_error():
    with pytest.raises(Rejected) as refused:
        loads_checked("[" * 5000 + "]" * 5000, ContainerBudget(10**6))
    assert refused.value.reason == "too_deep"
