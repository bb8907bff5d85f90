"""The sandbox's two round-3 bounds, unit by unit: integer arithmetic sized from its operands'
bits before it runs (one rule for every binary operator), and the items a sequence-building
call may make counted before it makes them."""

from __future__ import annotations

import operator
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms.encode import bounded_sandbox
from kvtrace.transforms.encode.bounded_sandbox import BoundedSandbox, ValueTooLarge

OPERATORS = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
    "**": operator.pow,
}
INTEGERS = st.integers(min_value=-(2**300), max_value=2**300)


def test_every_binary_operator_is_intercepted():
    """None runs unsized, and none is folded when the template compiles (outside the budget)."""
    assert BoundedSandbox.intercepted_binops == frozenset(BoundedSandbox().binop_table)


@given(name=st.sampled_from(sorted(OPERATORS)), left=INTEGERS, right=INTEGERS)
def test_an_integer_result_never_has_more_bits_than_its_bound(name, left, right):
    if name == "**":
        right = abs(right) % 64  # a real power, kept small enough to compute here
    if name in ("/", "//", "%") and right == 0:
        right = 1
    result = OPERATORS[name](left, right)
    if isinstance(result, int):
        assert result.bit_length() <= bounded_sandbox._integer_result_bits(name, left, right)


@pytest.mark.parametrize(
    "source",
    [
        "{% set x = 2 ** 3000 %}{{ x * x }}",
        "{% set x = 2 ** 4000 %}{{ (x * 1) // 3 }}",  # each operand within, their sum past it
        "{% set x = 2 ** 4000 %}{{ x + x }}",
        "{% set x = 2 ** 4000 %}{{ x - 1 + (x - 1) }}",
        "{{ 3 ** 4096 }}",
    ],
)
def test_integer_arithmetic_past_the_bound_is_refused_before_it_runs(source):
    with pytest.raises(ValueTooLarge, match="bits"):
        BoundedSandbox().from_string(source).render()


def test_the_round3_division_is_refused_at_once():
    """2 ** 32768 squared 8 times, then a division that runs for minutes in one C call."""
    source = (
        "{% set ns = namespace(x=0) %}{% set ns.x = 2 ** 32768 %}"
        "{% for i in range(8) %}{% set ns.x = ns.x * ns.x %}{% endfor %}"
        "{% set d = ns.x * 3 + 1 %}{% set q = (ns.x * ns.x + 7) // d %}"
    )
    start = time.monotonic()
    with pytest.raises(ValueTooLarge):
        BoundedSandbox().from_string(source).render()
    assert time.monotonic() - start < 1


def test_the_separators_are_the_ones_python_splits_at():
    characters = [chr(code) for code in range(sys.maxunicode + 1)]
    assert sorted(bounded_sandbox._WHITESPACE) == [c for c in characters if c.isspace()]
    assert sorted(bounded_sandbox._LINE_BREAKS) == [
        c for c in characters if len(f"a{c}a".splitlines()) == 2
    ]
    assert sorted(bounded_sandbox._BYTES_WHITESPACE) == sorted(
        bytes([b]) for b in range(256) if bytes([b]).isspace()
    )


SPLIT_TEXT = st.text(st.sampled_from("ab ,\n\r\t\u3000\u2028"), max_size=40)


@given(
    text=SPLIT_TEXT,
    separator=st.sampled_from([None, ",", "a", "ab"]),
    most=st.sampled_from([None, 0, 2, -1]),
    lines=st.booleans(),
    as_bytes=st.booleans(),
)
def test_a_split_past_the_item_bound_is_always_refused(text, separator, most, lines, as_bytes):
    """The count before the call never falls short of the pieces the call makes."""
    value = text.encode() if as_bytes else text
    if lines:
        args, pieces = (), value.splitlines()
    else:
        sep = separator.encode() if as_bytes and separator else separator
        args = (sep, -1 if most is None else most)
        pieces = value.split(*args)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bounded_sandbox, "MAX_ITEMS", 3)
        try:
            bounded_sandbox._check_split(value, *args, lines=lines)
        except ValueTooLarge:
            return
    assert len(pieces) <= 3


@pytest.mark.parametrize(
    "source",
    [
        "{{ ('ab' * 600000)|list|length }}",
        "{{ ('ab' * 600000)|slice(2)|list|length }}",
        "{{ ('ab' * 600000)|sort|length }}",
        "{{ ('a b ' * 600000).split()|length }}",
        "{{ ('a b ' * 600000).rsplit(' ')|length }}",
        "{{ ('a b ' * 600000).encode().split()|length }}",
        "{{ ('a\\n' * 1200000).splitlines()|length }}",
        "{{ dict.fromkeys('ab' * 600000)|length }}",
        "{{ ('a ' * 600000)|wordcount }}",
        "{{ ('ab' * 600000)|join(',')|length }}",
        "{{ ([0] * 600000 + [0] * 600000)|length }}",
        "{{ ([0, 1] * 600000)|length }}",
    ],
)
def test_a_call_making_past_the_item_bound_is_refused_before_it_runs(source):
    with pytest.raises(ValueTooLarge, match="items"):
        BoundedSandbox().from_string(source).render()


@pytest.mark.parametrize(
    ("source", "text"),
    [
        ("{{ ('ab' * 500000)|list|length }}", "1000000"),
        ("{{ ('a b ' * 500000).split()|length }}", "1000000"),
        ("{{ ('a b ' * 400000).split(maxsplit=3)|length }}", "4"),
        ("{{ ('x' * 5000000).split('</think>')|length }}", "1"),
        ("{{ ('a\\n' * 500000).splitlines()|length }}", "500000"),
    ],
)
def test_a_call_within_the_item_bound_makes_what_python_makes(source, text):
    assert BoundedSandbox().from_string(source).render() == text


def test_a_generator_over_a_value_is_a_step_per_item_not_refused(monkeypatch):
    """batch, map and the like list nothing in one call: the watchdog stops them between items."""
    monkeypatch.setattr(bounded_sandbox, "MAX_ITEMS", 8)
    sandbox = BoundedSandbox()
    assert sandbox.from_string("{{ ('ab' * 10)|batch(2)|map('length')|max }}").render() == "2"
    with pytest.raises(ValueTooLarge, match="items"):
        sandbox.from_string("{{ ('ab' * 10)|list }}").render()
