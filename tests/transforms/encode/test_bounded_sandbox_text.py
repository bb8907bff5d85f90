"""The sandbox's round-10 checks: every step that turns a value into text (a filter's value or
argument, a test, raise_exception's message) goes through the one sized conversion, so no
object is printed with its address nor past the bound; no set (ordered by the process's hash
seed) reaches a template; a filter that lists lines counts them first."""

from __future__ import annotations

import pytest
from jinja2.exceptions import TemplateError, TemplateRuntimeError, UndefinedError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kvtrace.transforms.encode import bounded_sandbox
from kvtrace.transforms.encode.bounded_sandbox import BoundedSandbox, Unordered, ValueTooLarge

BOUND = 64  # MAX_VALUE_LENGTH in the tests that lower it


def _render(source: str, **context: object) -> str:
    return BoundedSandbox().from_string(source).render(**context)


@pytest.fixture
def small_bound(monkeypatch):
    monkeypatch.setattr(bounded_sandbox, "MAX_VALUE_LENGTH", BOUND)


class Opaque:
    """A value whose text its size does not tell (jinja's cycler, joiner, a bound method)."""

    def __repr__(self) -> str:
        raise AssertionError("printed to be measured")


@pytest.mark.parametrize(
    "source",
    [
        "{{ {'a': x}|xmlattr }}",
        "{{ x is lower }}",
        "{{ x is upper }}",
        "{{ [1, 2]|join(x) }}",
        "{{ [1, 2]|join(d=x) }}",
        "{{ 'a'|replace('a', x) }}",
        "{{ 'a'|replace(x, 'b') }}",
        "{{ 'http://example.com'|urlize(target=x) }}",
        "{{ '%s'|format(x) }}",
        "{{ [1].index(x) }}",  # its error prints the value it did not find
    ],
)
def test_a_value_printed_by_a_filter_or_test_is_sized_not_printed(source):
    with pytest.raises(ValueTooLarge, match="Opaque"):
        _render(source, x=Opaque())


def _raising_sandbox() -> tuple[BoundedSandbox, list[object]]:
    """A sandbox given transformers' raise_exception (set after it is built), and what the
    function was handed."""
    handed: list[object] = []

    def raise_exception(message: object) -> None:
        handed.append(message)
        raise TemplateError(message)  # type: ignore[arg-type]

    sandbox = BoundedSandbox()
    sandbox.globals["raise_exception"] = raise_exception
    return sandbox, handed


def test_raise_exception_is_handed_its_message_as_checked_text():
    sandbox, handed = _raising_sandbox()
    with pytest.raises(ValueTooLarge, match="Opaque"):
        sandbox.from_string("{{ raise_exception(x) }}").render(x=Opaque())
    assert handed == []
    with pytest.raises(TemplateError, match=r"\[1, 'a'\]"):
        sandbox.from_string("{{ raise_exception([1, 'a']) }}").render()
    assert handed == ["[1, 'a']"]


def test_xmlattr_sizes_its_escaped_text_before_printing_it(small_bound):
    with pytest.raises(ValueTooLarge):
        _render("{{ {'a': [s, s]}|xmlattr }}", s="x" * 20)  # 55 printed, 275 escaped at most


@pytest.mark.parametrize(
    "source",
    [
        "{{ ['%(a)60s']|format(a=1) }}",  # a value that is not a string is a % template too
        "{{ ['aaaa']|replace('a', 'b' * 20) }}",
        "{{ 'aaaa'|replace('a', ['b' * 20]) }}",
    ],
)
def test_text_a_filter_prints_is_the_text_it_sizes(small_bound, source):
    with pytest.raises(ValueTooLarge):
        _render(source)


def test_printed_values_within_the_bound_render_as_jinja_renders_them():
    assert _render("{{ ['a']|replace('a', 'b') }}|{{ [1, 2]|join(3) }}") == "['b']|132"
    assert _render("{{ [1]|format }}|{{ 'x' is lower }}|{{ 'X' is lower }}") == "[1]|True|False"
    assert _render("{{ {'a': '<b>', 'c': 1}|xmlattr }}") == ' a="&lt;b&gt;" c="1"'


@pytest.mark.parametrize("source", ["{{ d.keys() - [] }}", "{{ (d.items() - [])|list }}"])
def test_a_set_whose_order_is_the_hash_seeds_never_reaches_a_template(source):
    with pytest.raises(Unordered, match="set"):
        _render(source, d={"a": 1, "b": 2})


def test_a_missing_key_of_an_unprintable_kind_is_named_by_its_type():
    """jinja's undefined names a key by its repr: an object's address, in the dead letter."""
    with pytest.raises(UndefinedError, match="no element of its kind"):
        _render("{{ ({}[x]).y }}", x=Opaque())
    with pytest.raises(UndefinedError, match="no element 3"):
        _render("{{ ({}[3]).y }}")


@pytest.mark.parametrize("source", ["{{ [1]|map(x)|list }}", "{{ [1]|select(x)|list }}"])
def test_a_filter_or_test_named_by_an_object_is_refused_by_its_type(source):
    with pytest.raises(TemplateRuntimeError, match="named by a Opaque"):
        _render(source, x=Opaque())


def test_indent_counts_the_lines_splitlines_makes_before_listing_them(monkeypatch):
    monkeypatch.setattr(bounded_sandbox, "MAX_ITEMS", 8)
    with pytest.raises(ValueTooLarge, match="items"):
        _render("{{ ('a\\r' * 8)|indent }}")  # 9 lines; no "\n" in it
    assert _render("{{ ('a\\r' * 3)|indent(2, blank=true) }}") == "a\n  a\n  a"


def test_indent_sizes_every_line_splitlines_makes(small_bound):
    with pytest.raises(ValueTooLarge):
        _render("{{ ('\\r' * 10)|indent(10, blank=true) }}")  # 11 lines of 10: 110


@pytest.mark.parametrize(
    "source",
    [
        "{% set x = namespace(a=1) %}{% set x.a = x %}{{ x }}|{{ x|string }}|{{ x ~ '' }}",
        "{% set x = namespace(a=1, b=2) %}{% set x.a = x %}{% set x.b = [x, x] %}{{ x }}",
        "{% set x = namespace(a=1) %}{% set y = namespace(b=x) %}{% set x.a = y %}{{ [x, y] }}",
    ],
)
def test_a_value_holding_itself_is_sized_as_jinja_prints_it_at_once(source):
    """Round 11: a namespace may hold itself (`{% set x.a = x %}`, which the immutable sandbox
    allows), and repr prints the cycle as `{...}`; the walk that sizes it was not told it was
    inside itself and pushed a level per step until the render budget. Now the same text as
    jinja, in a step per item."""
    plain = ImmutableSandboxedEnvironment().from_string(source).render()
    assert _render(source) == plain and "{...}" in plain


def test_a_list_holding_itself_is_sized_at_least_as_long_as_its_text():
    held = [1, "x"]
    held.append(held)
    outer = {"a": held, "b": [held, {"c": held}]}
    outer["d"] = outer
    for value in (held, outer):
        assert len(str(value)) <= bounded_sandbox._text_length(value) < 2 * len(str(value))
