"""json_tree.containers_over: the one count of a JSON line's containers, made before it is
parsed, that every JSON line reader bounds its parse by."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms.read.json_tree import containers_over

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
