"""Sessions: by the trace's session ids, else by first block; reuse within one vs across."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers import trace_of
from kvtrace.transforms.cache.cache_trace import CacheTrace
from kvtrace.transforms.cache.sessions import session_report

ROWS = [(0, 0.0, [1, 2]), (0, 1.0, [1, 2, 3]), (0, 2.0, [7, 8]), (0, 3.0, [1, 2, 3, 4])]


def report(trace):
    return session_report(trace, CacheTrace.of(trace, 4))


def test_sessions_by_first_block_keep_every_reuse_within():
    sessions = report(trace_of(ROWS))
    assert sessions["defined_by"] == "first block"
    assert sessions["sessions"] == 2 and sessions["single_request_sessions"] == 1
    assert sessions["requests_per_session"]["max"] == 3
    assert sessions["reused_within_session"] == 1.0 and sessions["reused_across_sessions"] == 0.0


def test_session_ids_split_reuse_within_and_across():
    # Rows 0 and 1 are one conversation, row 3 another that shares their opening blocks.
    trace = dataclasses.replace(
        trace_of(ROWS), session=np.array(["a", "a", "b", "c"], dtype=object)
    )
    sessions = report(trace)
    assert sessions["defined_by"] == "session ids" and sessions["sessions"] == 3
    # Reused: row 1's blocks 1, 2 (8 tokens, within "a"); row 3's 1, 2, 3 (12 tokens, across).
    assert sessions["reused_tokens"] == 20
    assert sessions["reused_within_session"] == pytest.approx(8 / 20)
    assert sessions["reused_across_sessions"] == pytest.approx(12 / 20)


def test_rows_without_a_session_id_are_sessions_of_their_first_block():
    trace = dataclasses.replace(trace_of(ROWS), session=np.array([None, None, "b", None]))
    sessions = report(trace)
    assert sessions["sessions"] == 2 and sessions["reused_across_sessions"] == 0.0
