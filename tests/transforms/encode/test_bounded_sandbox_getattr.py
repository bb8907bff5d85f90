"""The bounded sandbox answers a template's attribute reads of plain values at once, and its
answer is jinja's own: the same value, the same undefined (and so the same error), the same
str.format wrapper, whatever the object and the name."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from jinja2.runtime import LoopContext, Undefined
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from kvtrace.transforms.encode import template_renderer
from kvtrace.transforms.encode.bounded_sandbox import BoundedSandbox

BOUNDED = BoundedSandbox()
# jinja's own sandbox, with the bounded one's undefined (which names a missing key jinja would
# print with an address by its type instead: the names read here print the same either way)
PLAIN = ImmutableSandboxedEnvironment(undefined=BOUNDED.undefined)
# Names a template may read: keys, safe and mutating methods, private and internal names.
NAMES = st.sampled_from(
    [
        "role",
        "content",
        "name",
        "arguments",
        "x",
        "",
        "keys",
        "items",
        "get",
        "pop",
        "clear",
        "update",
        "append",
        "sort",
        "copy",
        "index",
        "count",
        "split",
        "startswith",
        "strip",
        "format",
        "format_map",
        "mro",
        "_private",
        "__class__",
        "__init__",
        "__dict__",
        "_Namespace__attrs",
        "index0",
        "first",
        "last",
        "length",
        "cycle",
        "func_code",
        "gi_code",
    ]
)


def _transformers_namespace() -> type:
    """transformers' namespace class (a Namespace subclass), as its renderer builds it."""
    compile_template = template_renderer.render_jinja_template().__globals__[
        "_compile_jinja_template"
    ]
    return compile_template("{{ 1 }}").environment.globals["namespace"]


TEMPLATE_NAMESPACE = _transformers_namespace()


OBJECTS = st.one_of(
    st.dictionaries(NAMES, st.integers() | st.text(max_size=3), max_size=4),
    st.text(max_size=4),
    st.lists(st.integers(), max_size=3),
    st.integers(),
    st.dictionaries(NAMES, st.integers(), max_size=3).map(lambda keys: Namespace(keys)),
    st.dictionaries(
        NAMES.filter(lambda name: not name.startswith("_")), st.integers(), max_size=3
    ).map(TEMPLATE_NAMESPACE),
    st.lists(st.integers(), max_size=3).map(lambda items: LoopContext(items, Undefined)),
    st.just(str.upper),
    st.just(len),
    st.just(int),
)


def _same(plain: Any, bounded: Any) -> bool:
    if isinstance(plain, Undefined):
        return (
            type(bounded) is type(plain)
            and bounded._undefined_hint == plain._undefined_hint
            and bounded._undefined_obj is plain._undefined_obj
            and bounded._undefined_name == plain._undefined_name
            and bounded._undefined_exception is plain._undefined_exception
        )
    if callable(plain) and hasattr(plain, "__wrapped__"):  # a sandboxed str.format
        return bounded.__wrapped__ == plain.__wrapped__ and bounded("a") == plain("a")
    return type(bounded) is type(plain) and (bounded == plain or plain != plain)


@given(obj=OBJECTS, name=NAMES)
def test_getattr_answers_as_jinja_does(obj, name):
    if isinstance(obj, LoopContext):  # a loop is read while it runs
        next(iter(obj), None)
    plain = PLAIN.getattr(obj, name)
    assert _same(plain, BOUNDED.getattr(obj, name))


def test_templates_read_keys_methods_and_loops_as_before():
    source = (
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{{ loop.index0 }}{{ m.role }}{{ m.missing is defined }}{{ m.items()|list|length }}"
        "{{ m.content.split(' ')|length }}{{ m.content.startswith('he') }}"
        "{{ '{}!'.format(m.content) }}{{ m.get('role') }}{% endfor %}{{ ns.n }}"
    )
    messages = [{"role": "user", "content": "hello world"}, {"role": "tool", "content": "x"}]
    plain = PLAIN.from_string(source).render(messages=messages)
    assert BOUNDED.from_string(source).render(messages=messages) == plain
