"""A chat template sees only pure names: strftime_now reads the request's own time in UTC,
whatever the worker's clock and zone, and a name off the lists (Jinja's random and lipsum,
anything added later) fails to render the same way every time."""

from __future__ import annotations

import datetime
import time

import jinja2.defaults
import jinja2.filters
import jinja2.tests
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtrace.transforms.encode import template_names
from kvtrace.transforms.encode.bounded_sandbox import BoundedSandbox
from kvtrace.transforms.encode.fast_tokenizer import FastTokenizer
from kvtrace.transforms.encode.template_names import strftime_now
from kvtrace.transforms.encode.tokenize import load_tokenizer, render_chat
from kvtrace.transforms.errors import Rejected

CHAT = [{"role": "user", "content": "hi"}]
REQUEST_MS = 1_700_000_000_123  # 2023-11-14 22:13:20.123 UTC; 12:13 the next day in Kiritimati


def _with_template(folder: str, template: str) -> FastTokenizer:
    tokenizer = load_tokenizer(folder)
    return FastTokenizer(tokenizer.backend_tokenizer, template, tokenizer.special_tokens_map)


@pytest.fixture
def far_zone(monkeypatch):
    """The process in a zone 14 hours from UTC, so that a local clock never reads its hours."""
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_strftime_now_reads_the_requests_time_in_utc(tiny_tokenizer, far_zone):
    clock = _with_template(tiny_tokenizer, '{{ strftime_now("%Y-%m-%d %H:%M:%S.%f %Z") }}')
    text = render_chat(clock, CHAT, None, {}, timestamp_ms=REQUEST_MS)
    assert text == "2023-11-14 22:13:20.123000 UTC"
    assert render_chat(clock, CHAT, None, {}) == "1970-01-01 00:00:00.000000 UTC"  # no request


@pytest.fixture
def utc_zone(monkeypatch):
    """The process in UTC, where C's strftime spells a UTC time right (its %s reads TZ)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


SPELLED = sorted(template_names.SPECIFIERS.keys() | template_names.COMPOUNDS.keys())


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 4_102_444_800_000), st.sampled_from(SPELLED))
def test_each_specifier_is_spelled_as_c_spells_it_in_utc(utc_zone, timestamp_ms, letter):
    moment = datetime.datetime.fromtimestamp(timestamp_ms / 1000, datetime.timezone.utc)
    moment = moment.replace(microsecond=timestamp_ms % 1000 * 1000)  # the ms, not a float's
    spelled = template_names.render_at(timestamp_ms, lambda: strftime_now(f"<%{letter}>"))
    assert spelled == moment.strftime(f"<%{letter}>")
    if (
        letter in template_names.SPECIFIERS and letter not in "%ntfzZ"
    ):  # Python spells %f %z %Z, not C
        unpadded = template_names.render_at(timestamp_ms, lambda: strftime_now(f"%-{letter}"))
        assert unpadded == moment.strftime(f"%-{letter}")


def test_strftime_now_never_reads_the_worker_s_zone(far_zone):
    """C's %s converts with mktime in the process's zone: kvtrace's is the request's."""
    epoch_s = template_names.render_at(REQUEST_MS, lambda: strftime_now("%s %c %Z %z"))
    assert epoch_s == f"{REQUEST_MS // 1000} Tue Nov 14 22:13:20 2023 UTC +0000"


@pytest.mark.parametrize("format", ["%Q", "%Ec", "%", "50%", "%-c"])
def test_a_specifier_off_the_list_is_refused(format):
    with pytest.raises(ValueError, match="not a specifier kvtrace spells"):
        template_names.render_at(REQUEST_MS, lambda: strftime_now(format))


def test_strftime_now_outside_a_render_at_is_refused():
    with pytest.raises(ValueError, match="no request time"):
        template_names.strftime_now("%Y")
    assert template_names.render_at(5, lambda: template_names.strftime_now("%S")) == "00"


def test_strftime_now_formats_at_most_a_bounded_format():
    """One C call expands each directive: `"%c" * 16_000_000` would be ~2 GB in it."""
    bound = template_names.MAX_CLOCK_FORMAT
    at_bound = template_names.render_at(0, lambda: template_names.strftime_now("%Y" * (bound // 2)))
    assert at_bound == "1970" * (bound // 2)
    with pytest.raises(ValueError, match=f"over {bound}"):
        template_names.render_at(0, lambda: template_names.strftime_now("%c" * (bound // 2 + 1)))


@pytest.mark.parametrize(
    "template", ["{{ range(9) | random }}", "{{ lipsum(1) }}", "{{ [1] | map('random') | list }}"]
)
def test_a_name_off_the_lists_fails_every_render_alike(tiny_tokenizer, template):
    drawing = _with_template(tiny_tokenizer, template)
    messages = set()
    for _ in range(3):
        with pytest.raises(Rejected) as caught:
            render_chat(drawing, CHAT, None, {}, timestamp_ms=REQUEST_MS)
        assert caught.value.reason == "template_error"
        messages.add(caught.value.message)
    assert len(messages) == 1


def test_the_sandbox_holds_exactly_the_listed_names_whatever_is_added():
    sandbox = BoundedSandbox()
    jinjas = set(jinja2.defaults.DEFAULT_NAMESPACE)
    assert set(sandbox.globals) == jinjas - {"lipsum"}
    assert set(sandbox.filters) == set(jinja2.filters.FILTERS) - {"random"}
    assert set(sandbox.tests) == set(jinja2.tests.TESTS) == template_names.TESTS
    # what transformers adds after the environment is built: its clock is replaced, and a name
    # off the list is never held
    sandbox.globals["strftime_now"] = time.strftime
    sandbox.globals["raise_exception"] = print
    sandbox.globals.update(wall_clock=time.time)
    sandbox.filters["shuffle"] = sorted
    assert sandbox.globals["strftime_now"] is template_names.strftime_now
    assert sandbox.globals["raise_exception"].__wrapped__ is print  # behind its message's check
    assert "wall_clock" not in sandbox.globals and "shuffle" not in sandbox.filters
    assert set(sandbox.globals) == template_names.GLOBALS
