"""Routing a session's requests to one worker: keys, what crosses the shuffle, and the
RouteSessions transform in a TestPipeline."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import ROOT
from kvtrace.transforms.dead_letters import DEAD_LETTER_TAG
from kvtrace.transforms.read.records import ParseOptions, Request
from kvtrace.transforms.read.routing import arrived, route_key, routed
from kvtrace.transforms.read.sources import parse_one

OPTIONS = ParseOptions()
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
RECORDS = st.fixed_dictionaries(
    {
        "timestamp": st.integers(0, 10**9),
        "messages": st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "assistant"]), "content": TEXT}
            ),
            min_size=1,
            max_size=4,
        ),
    },
    optional={
        "session_id": TEXT,
        "output_length": st.integers(0, 10**6),
        "tools": st.just([{"type": "function", "function": {"name": "f"}}]),
    },
)


def request(record: dict, source: str = "logs/a.jsonl") -> Request:
    parsed = parse_one(source, json.dumps(record).encode(), OPTIONS)
    assert isinstance(parsed, Request), parsed
    return parsed


@settings(max_examples=100, deadline=None)
@given(RECORDS)
def test_a_request_arrives_as_it_left(record):
    sent = request(record)
    assert arrived(routed(sent), OPTIONS) == sent
    assert routed(sent) == (sent.source, sent.line)  # its line, not the parsed request


def test_a_parquet_row_travels_whole():
    sent = parse_one("logs/a.parquet", {"timestamp": 1, "prompt": "p"}, OPTIONS)
    assert routed(sent) is sent
    assert arrived(routed(sent), OPTIONS) is sent


def test_a_session_is_one_key_and_requests_without_one_spread():
    turns = [
        request(
            {
                "timestamp": t,
                "session_id": "s1",
                "messages": [{"role": "user", "content": "hi " * t}],
            }
        )
        for t in range(1, 4)
    ]
    assert len({route_key(r) for r in turns}) == 1
    alone = [
        request({"timestamp": 5, "messages": [{"role": "user", "content": c}]})
        for c in ("a", "b", "c")
    ]
    assert len({route_key(r) for r in alone}) == 3
    assert route_key(turns[0]) != route_key(alone[0])
    huge = request({"timestamp": 1, "session_id": "x" * 100_000, "prompt": "p"})
    assert len(route_key(huge)) == len(route_key(alone[0]))  # keys stay short


def test_keys_are_the_same_in_every_worker_process():
    """Workers of a distributed runner key the same session alike (no per-process hash salt)."""
    code = (
        "from kvtrace.transforms.read.routing import route_key; "
        "from kvtrace.transforms.read.sources import parse_one; "
        "from kvtrace.transforms.read.records import ParseOptions; "
        'print(route_key(parse_one(\'a.jsonl\', b\'{"timestamp": 1, "prompt": "p"}\', '
        "ParseOptions())))"
    )
    keys = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
        ).stdout
        for _ in range(2)
    }
    assert len(keys) == 1


@pytest.mark.beam
def test_route_sessions_passes_every_request_on_in_a_test_pipeline():
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.transforms.read.steps import RouteSessions

    sent = [
        request(
            {
                "timestamp": i,
                "session_id": f"s{i % 2}",
                "messages": [{"role": "user", "content": f"turn {i}"}],
            }
        )
        for i in range(6)
    ]
    sent.append(parse_one("logs/b.parquet", {"timestamp": 9, "prompt": "row"}, OPTIONS))
    with TestPipeline() as pipeline:
        out = pipeline | beam.Create(sent) | RouteSessions(OPTIONS)
        assert_that(
            out.requests | beam.Map(lambda r: (r.source, r.timestamp_ms, r.line)),
            equal_to([(r.source, r.timestamp_ms, r.line) for r in sent]),
        )
        assert_that(out[DEAD_LETTER_TAG], equal_to([]), label="NoLetters")
