"""Chat templates render under a budget: a runaway template is a template_error dead letter
within the deadline and under a memory cap, and one that runs away on every request stops the job
in one line. Hostile templates from each family: nested loops, doubling strings, huge ranges,
recursion through macros, huge outputs, and single steps that build a huge value at once."""

from __future__ import annotations

import dis
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from helpers import under_rlimit
from kvtrace.transforms.encode import bounded_sandbox, tokenize
from kvtrace.transforms.encode.bounded_sandbox import BoundedSandbox, ValueTooLarge
from kvtrace.transforms.encode.fast_tokenizer import FastTokenizer
from kvtrace.transforms.encode.render_budget import TICK_SECONDS, RenderOverrun, Watchdog
from kvtrace.transforms.errors import JobStopped, Rejected

ROOT = Path(__file__).resolve().parents[3]
# How long past its deadline a stopped render may take: one template step, on a busy machine.
GRACE_S = 3.0
TIGHT_S = 0.1  # the budget's deadline in the fast tests
# Templates that run away through many steps: the watchdog stops them.
RUNAWAY = {
    "nested_loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
    "{% endfor %}",
    "huge_output": "{% for i in range(100000) %}{% for j in range(100000) %}"
    "{{ messages[0].content }}{% endfor %}{% endfor %}",
    "list_growth": "{% set ns = namespace(items=[]) %}{% for i in range(100000) %}"
    "{% for j in range(100000) %}{% set ns.items = ns.items + [j] %}"
    "{% endfor %}{% endfor %}",
}
# Templates whose growth a single step's bound refuses, or that the sandbox refuses anyway.
REFUSED = {
    "doubling_tilde": "{% set ns = namespace(s='x') %}{% for i in range(100) %}"
    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "doubling_plus": "{% set ns = namespace(s='x') %}{% for i in range(100) %}"
    "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
    "repeat": "{{ 'x' * 10**10 }}",
    "list_repeat": "{{ ([1] * 10**10)|length }}",
    "power": "{{ 9 ** 999999999 }}",
    "power_folded": "{% set n = 99999 %}{{ (9 ** n) ** n }}",
    "center_filter": "{{ 'x'|center(10**10) }}",
    "center_method": "{{ 'x'.center(10**10) }}",
    "printf_width": "{{ '%999999999999s'|format('x') }}",
    "format_width": "{{ '{:>999999999999}'.format('x') }}",
    "replace": "{% set s = 'x' * 100000 %}{{ s.replace('', s) }}",
    "join": "{{ (['x' * 100000] * 100000)|join }}",
    "join_generator": "{{ (['x' * 100000] * 100000)|select|join }}",
    "huge_range": "{% for i in range(10**9) %}x{% endfor %}",
    "macro_recursion": "{% macro f(n) %}{{ f(n ~ 'x') }}{% endmacro %}{{ f('') }}",
    # each width or count within MAX_ARGUMENT, the value they build together (300 M) past the
    # bound, shipped or cut
    "format_widths_summed": "{% set f = '{0:>1000000}' * 300 %}{{ f.format('')|length }}",
    "format_argument_repeated": "{{ ('{0}' * 30000).format('x' * 10000)|length }}",
    "format_width_from_argument": "{{ '{0:>{1}}'.format('', '99999999')|length }}",
    "printf_keys_summed": "{% set f = '%(a)1000000s' * 300 %}{{ (f % {'a': ''})|length }}",
    "printf_filter_summed": "{{ ('%(a)1000000s' * 300)|format(a='')|length }}",
    "expandtabs": "{{ ('\\t' * 300).expandtabs(1000000)|length }}",
    "indent": "{{ ('\\n' * 300)|indent(1000000)|length }}",
    "indent_by_string": "{{ ('\\n' * 300)|indent(' ' * 1000000)|length }}",
    # one C call building 300 M from operands each within the bound, sized by what it prints
    "translate": "{{ ('x' * 300).translate({120: 'y' * 1000000})|length }}",
    "wordwrap": "{{ ('a ' * 300)|wordwrap(1, wrapstring='x' * 1000000)|length }}",
    "string_of_repeats": "{{ ([('x' * 1000000)] * 300)|string|length }}",
    "print_of_repeats": "{{ [('x' * 1000000)] * 300 }}",
    "tojson_of_repeats": "{{ ([('x' * 1000000)] * 300)|tojson|length }}",
    "tojson_indent": "{{ ([0] * 300)|tojson(indent=1000000)|length }}",
    "join_attribute": "{{ ([{'a': 'x' * 1000000}] * 300)|join(attribute='a')|length }}",
    "escape": "{{ ('\"' * 60000000)|e|length }}",
    # quadratic work in one C call on values within the bound
    "sum_of_lists": "{{ ([[1]] * 1000000)|sum(start=[])|length }}",
    "containment": "{% set a = [0] * 1000000 %}{{ (a[1:] + [1]) in [a] * 1000000 }}",
    "doubling_list": "{% set ns = namespace(l=[[0] * 100000]) %}{% for i in range(40) %}"
    "{% set ns.l = ns.l + ns.l %}{% endfor %}{{ (ns.l[0][1:] + [1]) in ns.l }}",
    # integers squared past the bound, then one long division of minutes (round 3)
    "squared_integers": "{% set ns = namespace(x=0) %}{% set ns.x = 2 ** 4000 %}"
    "{% for i in range(8) %}{% set ns.x = ns.x * ns.x %}{% endfor %}"
    "{% set d = ns.x * 3 + 1 %}{{ (ns.x * ns.x + 7) // d }}",
    "summed_integers": "{% set ns = namespace(x=2 ** 4000) %}{% for i in range(8) %}"
    "{% set ns.x = ns.x + ns.x %}{% endfor %}",
    # a new object per item in one call: gigabytes from a value within the bound (round 3)
    "list_of_characters": "{{ ('\u30a2' * 100000000)|list|length }}",
    "split": "{{ ('ab ' * 80000000).split()|length }}",
    "splitlines": "{{ ('a\n' * 80000000).splitlines()|length }}",
    "split_by_separator": "{{ ('a,' * 80000000).split(',')|length }}",
    "fromkeys": "{{ {}.fromkeys('ab' * 80000000)|length }}",
    "wordcount": "{{ ('ab ' * 80000000)|wordcount }}",
    "list_repeated_by_items": "{{ ([0] * 100000000)|length }}",
}
# What the cases above build, scaled to a 1 MiB bound: each refused in its own step.
ONE_CALL = {
    "translate": "{{ ('x' * 300).translate({120: 'y' * 10000})|length }}",
    "wordwrap": "{{ ('a ' * 300)|wordwrap(1, wrapstring='x' * 10000)|length }}",
    "string_of_repeats": "{{ ([('x' * 10000)] * 300)|string|length }}",
    "print_of_repeats": "{{ [('x' * 10000)] * 300 }}",
    "tilde_of_repeats": "{{ ([('x' * 10000)] * 300) ~ '' }}",
    "printf_of_repeats": "{{ '%s' % ([('x' * 10000)] * 300,) }}",
    "tojson_of_repeats": "{{ ([('x' * 10000)] * 300)|tojson|length }}",
    "tojson_indent": "{{ ([0] * 300)|tojson(indent=10000)|length }}",
    "join_attribute": "{{ ([{'a': 'x' * 10000}] * 300)|join(attribute='a')|length }}",
    "join_of_lists": "{{ ([['x' * 10000]] * 300)|join|length }}",
    "escape": "{{ ('\"' * 300000)|e|length }}",
    "namespace_of_repeats": "{{ namespace(a=[('x' * 10000)] * 300) }}",
    "sum_of_lists": "{{ ([[1]] * 1000)|sum(start=[])|length }}",
    "repeat_of_lists": "{% set a = [0] * 1000 %}{{ ([a] * 1000)|length }}",
    "doubling_list": "{% set ns = namespace(l=[[0] * 1000]) %}{% for i in range(40) %}"
    "{% set ns.l = ns.l + ns.l %}{% endfor %}",
}
MESSAGES = [{"role": "user", "content": "hello world"}]


def _busy(seconds: float) -> None:
    """Python steps for a while (where a stray RenderOverrun would land)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_the_watchdog_stops_a_render_at_its_deadline_and_only_there():
    watchdog = Watchdog(seconds=0.2)
    assert watchdog.run(lambda: "rendered") == "rendered"
    start = time.thread_time()
    with pytest.raises(RenderOverrun, match="render budget"):
        watchdog.run(lambda: _busy(60))
    assert time.thread_time() - start < 0.2 + GRACE_S
    _busy(20 * TICK_SECONDS)  # no RenderOverrun lands after the render


class _StopWhileLeaving:
    """The watchdog's lock, with a stop (the CLI's KeyboardInterrupt on SIGTERM) landing in the
    rendering thread the first time it takes the lock to leave: as a signal handler may."""

    def __init__(self, thread: int):
        self._lock, self._thread, self.stopped = threading.Lock(), thread, False

    def __enter__(self) -> None:
        if threading.get_ident() == self._thread and not self.stopped:
            self.stopped = True
            raise KeyboardInterrupt
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


@pytest.mark.parametrize("overrun", [False, True])
def test_a_stop_while_a_render_is_left_is_raised_and_no_overrun_lands_after(overrun):
    """The stop is what the caller sees (not lost in the overrun, not replaced by it), the
    render is unregistered anyway, and no RenderOverrun lands in the code after it (round 3:
    one did, in the CLI's stop.end(), as a traceback)."""
    watchdog = Watchdog(seconds=0.05)
    watchdog.run(lambda: None)  # its thread started, with the plain lock
    lock = _StopWhileLeaving(threading.get_ident())
    watchdog._lock = lock
    with pytest.raises(KeyboardInterrupt):
        watchdog.run(lambda: _busy(60) if overrun else None)
    assert lock.stopped and not watchdog._renders
    _busy(20 * TICK_SECONDS)  # where a stray RenderOverrun would land


_PUSH_EXC_INFO = dis.opmap["PUSH_EXC_INFO"]


class _OverrunAtStep:
    """A trace function that delivers the render's overrun as the watchdog would, landing at
    the step-th bytecode step of Watchdog.run or its _leave (landing in the render is the
    ordinary case, tested above): only while the render is registered and not overrun yet (the
    watchdog's one delivery, under its lock)."""

    def __init__(self, watchdog: Watchdog, step: int, codes: set[object]):
        self._watchdog, self._step, self._codes = watchdog, step, codes
        self.steps, self.landed = 0, False

    def __call__(self, frame: Any, event: str, _arg: object) -> Any:
        if frame.f_code not in self._codes:
            return None
        frame.f_trace_opcodes = True
        # not where an exception being raised enters its handler: CPython looks for one only
        # between instructions it runs (after a call, at a loop's jump back, a function entry)
        if event == "opcode" and frame.f_code.co_code[frame.f_lasti] != _PUSH_EXC_INFO:
            render = self._watchdog._renders.get(threading.get_ident())
            if render is not None and not render.overran:
                self.steps += 1
                if self.steps == self._step:
                    render.overran, self.landed = True, True
                    raise RenderOverrun
        return self


@pytest.mark.parametrize("ending", ["result", "error", "stop"])
def test_an_overrun_landing_at_any_step_of_a_render_is_one_overrun_and_the_render_left(ending):
    """Round 11: raised again each tick, a second overrun landed in run's own handling of the
    first, before the render was left (a letter with no message, the render left registered,
    later ticks landing anywhere). Delivered once, and landing at each step from the render's
    registration to its leaving in turn, around the render (deterministic: a trace function, not the clock): the
    caller sees the stop if there was one, else the overrun with its message, and the render
    is left."""
    watchdog = Watchdog(seconds=60)  # its own ticks never fire here
    stopped: list[bool] = []

    def render() -> str:
        if ending == "error":
            raise ValueError("the template's own error")
        if ending == "stop":
            stopped.append(True)
            raise KeyboardInterrupt
        return "rendered"

    codes = {Watchdog.run.__code__, Watchdog._leave.__code__}  # where the watchdog's own are
    step = 0
    while True:
        step += 1
        stopped.clear()
        trace = _OverrunAtStep(watchdog, step, codes)
        sys.settrace(trace)
        try:
            outcome: object = watchdog.run(render)
        except BaseException as err:
            outcome = err
        finally:
            sys.settrace(None)
        assert not watchdog._renders, step
        if stopped:  # a stop wins over the overrun
            assert isinstance(outcome, KeyboardInterrupt), (step, outcome)
        elif trace.landed:
            assert isinstance(outcome, RenderOverrun), (step, outcome)
            assert "render budget" in str(outcome), step
        if not trace.landed:
            break
    assert outcome == "rendered" if ending == "result" else type(outcome) is not RenderOverrun
    assert step > 5  # the steps were walked, up to one past the last


def test_an_overrun_that_landed_leaves_the_interpreter_as_it_was():
    """Clearing a pending overrun (PyThreadState_SetAsyncExc with NULL) leaves CPython 3.11's
    pending-work flag set for good: every later step of every thread takes the slow path
    (+35% on a plain loop), and a traced call never returns. It is cleared only when it never
    landed: in a child, a traced call after an overrun returns."""
    code = (
        "import sys\n"
        "from kvtrace.transforms.encode.render_budget import RenderOverrun, Watchdog\n"
        "def spin():\n"
        "    while True:\n"
        "        pass\n"
        "try:\n"
        "    Watchdog(seconds=0.05).run(spin)\n"
        "except RenderOverrun:\n"
        "    pass\n"
        "sys.settrace(lambda *args: None)\n"
        "(lambda: None)()\n"
        "sys.settrace(None)\n"
        "print('returned')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.stdout == "returned\n", done.stderr[-2000:]


def test_a_render_ended_by_a_stop_is_left_and_the_stop_raised():
    watchdog = Watchdog(seconds=0.05)

    def stopped() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        watchdog.run(stopped)
    assert not watchdog._renders
    _busy(20 * TICK_SECONDS)
    assert watchdog.run(lambda: "rendered") == "rendered"


def test_the_watchdog_stops_a_render_that_grows_the_process_past_its_budget():
    watchdog = Watchdog(seconds=60, memory_bytes=64 << 20)
    grown: list[bytes] = []
    with pytest.raises(RenderOverrun):
        watchdog.run(lambda: [grown.append(b"x" * (1 << 20)) for _ in range(100_000)])
    assert len(grown) < 1000  # stopped near 64 MiB, far before 100 GB
    grown.clear()


def test_renders_in_several_threads_are_bounded_each():
    watchdog = Watchdog(seconds=0.2)
    outcomes: dict[str, str] = {}

    def render(name: str, seconds: float) -> None:
        try:
            watchdog.run(lambda: _busy(seconds))
            outcomes[name] = "done"
        except RenderOverrun:
            outcomes[name] = "overrun"

    threads = [
        threading.Thread(target=render, args=("short", 0.01)),
        threading.Thread(target=render, args=("long", 60)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=0.2 + GRACE_S)
    assert outcomes == {"short": "done", "long": "overrun"}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_the_bounded_sandbox_refuses_what_would_grow_past_its_bounds(name, monkeypatch):
    monkeypatch.setattr(bounded_sandbox, "MAX_VALUE_LENGTH", 1 << 20)  # the same steps, sooner
    template = BoundedSandbox().from_string(REFUSED[name])
    with pytest.raises((ValueTooLarge, OverflowError, RecursionError)):
        Watchdog(seconds=10).run(lambda: template.render(messages=MESSAGES))


@pytest.mark.parametrize("name", sorted(ONE_CALL))
def test_a_value_past_the_bound_is_refused_in_the_step_that_builds_it(name, monkeypatch):
    """Sized first or measured after the call, never handed on; and in a few steps (no
    watchdog here: a quadratic call would run for minutes)."""
    monkeypatch.setattr(bounded_sandbox, "MAX_VALUE_LENGTH", 1 << 20)
    template = BoundedSandbox().from_string(ONE_CALL[name])
    start = time.thread_time()
    with pytest.raises(ValueTooLarge):
        template.render(messages=MESSAGES)
    assert time.thread_time() - start < GRACE_S


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(
        st.characters(min_codepoint=32, max_codepoint=126, blacklist_characters="\\'\""), max_size=8
    ),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(st.characters(min_codepoint=97, max_codepoint=122), max_size=4),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@given(value=JSON_VALUES, indent=st.sampled_from([None, 0, 1, 4]))
def test_text_length_is_at_least_what_printing_builds(value, indent):
    """The walk that sizes a value before it is printed never counts short (strings needing no
    escape: escaping is the fixed factor measured afterwards), shared items counted each time."""
    shared = [value, value, [value]]
    for item in (value, shared):
        assert bounded_sandbox._text_length(item) >= len(str(item))
        # + 2: a string's quotes in JSON, which tojson's check adds
        assert bounded_sandbox._text_length(item, indent or 0) + 2 >= len(
            json.dumps(item, indent=indent)
        )


CALL = {"name": "f", "arguments": {"path": "/x", "n": 3, "ok": True, "v": None, "r": 1.5}}


@pytest.mark.parametrize(
    ("value", "indent", "limit", "length"),
    [
        (CALL, 0, None, 87),
        (CALL, 2, None, 153),
        ([CALL, CALL, [CALL, (CALL, "x")]], 0, None, 371),
        ([CALL, CALL, [CALL, (CALL, "x")]], 4, None, 1357),
        (Namespace(x=[CALL] * 3), 0, None, 278),
        ([CALL] * 50, 0, 100, 180),  # stopped past the limit: the length a refusal reports
    ],
)
def test_text_length_counts_as_it_always_has(value, indent, limit, length):
    """The walk's counts, pinned: a refusal's decision and its message depend on them."""
    assert bounded_sandbox._text_length(value, indent, limit) == length


@pytest.mark.parametrize(
    "source",
    [
        "{{ [1, 'x', [none, true]] }}|{{ {'a': [1.5]}|string }}|{{ [1] ~ 'x' }}|{{ [[1, 2]] * 2 }}"
        "|{{ [1] + [[2]] }}|{{ '%s' % ([1],) }}|{{ '{}'.format([1]) }}",
        "{{ 'abc'.translate({98: 'BB'}) }}|{{ 'a b c'|wordwrap(1, wrapstring='--') }}"
        "|{{ {'a': [1]}|tojson(indent=2) }}|{{ '<a>'|e }}|{{ [1, 2]|sum }}|{{ [1.5]|sum(start=1) }}",
        "{{ [{'a': 'x'}, {'a': 'y'}]|join(',', attribute='a') }}|{{ [[1], 2]|join('-') }}"
        "|{{ [{'a': 1}]|join(attribute='a') }}|{{ ([0] * 3) in [[0, 0, 0]] }}",
        "{{ 'a' ~ 1 ~ none }}|{{ 'ab' * 3 }}|{{ [1] + [2] }}|{{ 2 ** 10 }}|{{ '%05.1f' % 3.14159 }}",
        "{{ '{:>8}|{}'.format('x', 2) }}|{{ ['a', 'b']|join(', ') }}|{{ 'abc'.replace('b', 'xx') }}",
        "{{ 'x'|center(9) }}|{{ 'a\nb'|indent(4) }}|{{ '%s-%d'|format('a', 3) }}|{{ 7 % 3 }}",
        "{% for m in messages %}{{ loop.index ~ ':' ~ m.content|trim ~ '\n' }}{% endfor %}",
        "{{ 7 - 9 }}|{{ 7 // 2 }}|{{ -7 % 3 }}|{{ 7 / 2 }}|{{ 2 ** 2000 - 1 }}|{{ 1.5 * 4 }}"
        "|{{ 'a b\tc'.split() }}|{{ 'a,b'.split(',', 1) }}|{{ 'a\nb'.splitlines() }}"
        "|{{ 'ab'|list }}|{{ {}.fromkeys('ab') }}|{{ 'a b'|wordcount }}",
        "{{ '%(a)5s|%%|%(a)-3s' % {'a': 'x'} }}|{{ '%(n)03d'|format(n=7) }}|{{ '{0}{0}'.format('y') }}"
        "|{{ 'a\tb'.expandtabs(4) }}|{{ 'a\nb'|indent('> ', first=true) }}",
    ],
)
def test_the_bounded_sandbox_renders_what_the_plain_one_does(source):
    plain = ImmutableSandboxedEnvironment().from_string(source).render(messages=MESSAGES)
    assert BoundedSandbox().from_string(source).render(messages=MESSAGES) == plain


@pytest.fixture
def tight_budget(monkeypatch):
    """The watchdog's budget cut to a tenth of a second."""
    monkeypatch.setattr(tokenize.RENDER_WATCHDOG, "seconds", TIGHT_S)
    monkeypatch.setattr(tokenize.RENDER_WATCHDOG, "memory_bytes", 256 << 20)


@pytest.fixture
def tiny(tiny_tokenizer) -> FastTokenizer:
    return FastTokenizer.from_directory(Path(tiny_tokenizer))  # a fresh one: its own tally


def _on_hello(template: str) -> str:
    """template run only for a request saying 'hello world' (never for the probe's)."""
    return "{% if messages[0].content == 'hello world' %}" + template + "{% endif %}"


@pytest.mark.parametrize("name", sorted(RUNAWAY))
def test_a_runaway_template_is_a_template_error(tight_budget, tiny, name):
    start = time.thread_time()
    with pytest.raises(Rejected) as err:
        tokenize.render_chat(tiny, MESSAGES, None, {"chat_template": _on_hello(RUNAWAY[name])})
    assert err.value.reason == "template_error" and "render budget" in err.value.message
    assert time.thread_time() - start < TIGHT_S + GRACE_S


def test_a_template_over_budget_on_the_probe_conversation_stops_the_job(tight_budget, tiny):
    """Judged at the first render on kvtrace's own conversation, whatever the request."""
    with pytest.raises(JobStopped, match="own one-message conversation: it does not render"):
        tokenize.render_chat(tiny, MESSAGES, None, {"chat_template": RUNAWAY["nested_loops"]})


def test_a_template_raising_on_the_probe_conversation_renders_the_requests(tiny):
    kwargs = {"chat_template": "{{ raise_exception('no') if 'probe' in messages[0].content }}ok"}
    assert tokenize.render_chat(tiny, MESSAGES, None, kwargs) == "ok"


def test_a_request_of_more_messages_and_tools_than_any_render_fits_is_refused_first(tiny):
    """Round 3's 340,000 empty tools: a too_large dead letter on any machine, not an overrun
    on a slow one only; the count at the bound still renders."""
    kwargs = {"chat_template": "{{ tools|length }}"}
    tools = [{}] * (tokenize.MAX_RENDERED_ITEMS - 3)  # MESSAGES: a message of two entries
    assert tokenize.render_chat(tiny, MESSAGES, tools, kwargs) == str(len(tools))
    with pytest.raises(Rejected, match="messages, tools and template values") as err:
        tokenize.render_chat(tiny, MESSAGES, [*tools, {}], kwargs)
    assert err.value.reason == "too_large"


def test_everything_a_request_hands_its_template_counts_toward_the_items(tiny):
    """Every list element and object entry of the request's messages (their tool calls too)
    and own template variables, at any depth and under any name (documents or a kwarg's nested
    lists), counts: one more than the bound is refused before a render, the bound renders."""
    kwargs = {"chat_template": "{{ messages|length }}"}
    room = tokenize.MAX_RENDERED_ITEMS - 3  # MESSAGES: a message of two entries
    # documents: one-entry objects, two items each
    documents = [{"text": "x"}] * (room // 2)
    assert tokenize.render_chat(tiny, MESSAGES, None, kwargs, own_kwargs={"documents": documents})
    nested = {"any": {"depth": [[0] * (room - 3)]}}  # 1 + 1 + 1 + (room - 3): the bound
    assert tokenize.render_chat(tiny, MESSAGES, None, kwargs, own_kwargs=nested)
    over = ({"documents": [*documents, {"text": "x"}]}, {"any": {"depth": [[0] * (room - 2)]}})
    for own in over:
        with pytest.raises(Rejected, match="template values") as err:
            tokenize.render_chat(tiny, MESSAGES, None, kwargs, own_kwargs=own)
        assert err.value.reason == "too_large"
    call = {"type": "function", "function": {"name": "f", "arguments": {}}}  # 2 + 2 entries
    calls = [call] * ((room - 4) // 5)  # 5 items a call with its place in the list
    assistant = {"role": "assistant", "content": "", "tool_calls": calls}  # 1 + 3 + the calls
    assert tokenize.render_chat(tiny, [*MESSAGES, assistant], None, kwargs) == "2"
    with pytest.raises(Rejected, match="template values") as err:
        tokenize.render_chat(tiny, [*MESSAGES, assistant, assistant], None, kwargs)
    assert err.value.reason == "too_large"


def test_handed_items_counts_every_entry_and_stops_past_its_limit():
    value = {"a": [1, {"b": [2, 3]}, ()], "c": "text"}  # 2 + 3 + 1 + 2 entries
    assert tokenize.handed_items((value, [value]), 100) == 8 + 1 + 8
    assert tokenize.handed_items(("text",), 100) == 0
    huge = [[0] * 1000] * 1000  # 1 Mi items, walked only until past the limit
    assert 10 < tokenize.handed_items((huge,), 10) <= 10 + 1000


def test_a_template_over_budget_on_some_requests_keeps_the_job(tight_budget, tiny):
    kwargs = {
        "chat_template": "{% if messages[0].content == 'loop' %}"
        + RUNAWAY["nested_loops"]
        + "{% endif %}{{ messages[0].content }}"
    }
    for _ in range(4):  # overruns first decide nothing of the template
        with pytest.raises(Rejected):
            tokenize.render_chat(tiny, [{"role": "user", "content": "loop"}], None, kwargs)
    assert tokenize.render_chat(tiny, MESSAGES, None, kwargs) == "hello world"


@pytest.mark.slow  # every hostile template at the default budget: ~30 s
def test_every_hostile_template_is_a_dead_letter_under_a_memory_cap(tiny_tokenizer):
    """At the shipped budget, in a process capped at 3 GiB of address space: each hostile
    template a template_error within the deadline and a step, none kills the process."""
    code = (
        "import json, sys, time\nfrom pathlib import Path\n"
        "from kvtrace.transforms.encode import tokenize\nfrom kvtrace.transforms.errors import Rejected\n"
        "from kvtrace.transforms.encode.fast_tokenizer import FastTokenizer\n"
        "templates = json.loads(sys.argv[2])\n"
        "for name, source in templates.items():\n"
        "    tokenizer = FastTokenizer.from_directory(Path(sys.argv[1]))\n"
        "    start = time.thread_time()\n"
        "    try:\n"
        "        tokenize.render_chat(tokenizer, [{'role': 'user', 'content': 'hello world'}],\n"
        "                             None, {'chat_template': source})\n"
        "        reason = 'rendered'\n"
        "    except Rejected as err:\n"
        "        reason = err.reason\n"
        "    print(json.dumps([name, reason, time.thread_time() - start]), flush=True)\n"
    )
    hostile = {name: _on_hello(source) for name, source in {**RUNAWAY, **REFUSED}.items()}
    result = subprocess.run(
        under_rlimit(
            [sys.executable, "-c", code, tiny_tokenizer, json.dumps(hostile)], "RLIMIT_AS", 3 << 30
        ),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [name for name, _, _ in rows] == list(hostile)
    for name, reason, seconds in rows:
        assert reason == "template_error", name
        assert seconds < tokenize.RENDER_WATCHDOG.seconds + GRACE_S, name


def test_a_render_is_charged_only_for_the_cpu_time_it_runs():
    """A render kept off the CPU far longer than its budget (as one waits for a core on a loaded
    machine), using almost none of it, renders: whether a record renders never depends on the
    load (seen once as a 3-worker run's extra dead letter, before the budget was CPU time)."""
    off_cpu = threading.Event()
    assert Watchdog(seconds=0.01).run(lambda: off_cpu.wait(0.5) or "rendered") == "rendered"


def test_a_render_spending_its_cpu_time_overruns():
    def spin() -> None:
        while True:
            pass

    with pytest.raises(RenderOverrun):
        Watchdog(seconds=0.05).run(spin)


def test_the_watchdog_leaves_forking_safe_and_a_forked_child_watches_its_own_renders():
    """Its thread is marked as holding no lock a fork could copy held (the local engine forks
    workers only beside such threads): the one lock it takes is replaced in a forked child,
    whose first render starts a watchdog of its own that stops an overrun there too."""
    import os

    from kvtrace.transforms.encode.native_stderr import QUIET_ATTRIBUTE

    watchdog = Watchdog(seconds=0.2)
    assert watchdog.run(lambda: 7) == 7
    assert getattr(watchdog._thread, QUIET_ATTRIBUTE, False)
    child = os.fork()
    if child == 0:  # the child: exit code 0 only if its watchdog stops the overrun
        try:
            watchdog.run(lambda: _busy(60))
            os._exit(1)
        except RenderOverrun:
            os._exit(0)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize(
    "values",
    [
        ([0] * 100,),  # 201 bytes of JSON: the shortest an entry writes
        ([[]] * 100,),
        ({str(i): 0 for i in range(60)},),
        ({1: list(range(100))},),  # a key orjson cannot write: the walk decides
        ([2**70] * 101,),  # an integer past 64 bits, likewise
        ([{"a": [0, 0]}] * 40,),
    ],
)
@pytest.mark.parametrize("limit", [99, 100, 101, 200])
def test_too_many_items_says_what_the_count_says(values, limit):
    """The JSON-size shortcut is a proof (two bytes an entry at least), never a guess: it
    answers as the walk does on either side of the limit."""
    assert tokenize.too_many_items(values, limit) == (tokenize.handed_items(values, limit) > limit)
