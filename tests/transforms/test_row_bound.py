"""No request becomes a row longer than its own readers hold: the writer's bound on a row's ids
is the one the readers' line bound gives (trace_format), and the gate refuses a row past it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvtrace.transforms.encode import encode_requests
from kvtrace.transforms.encode.encode_requests import EncodeOptions, RequestEncoder
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.encode.tokenize import load_tokenizer
from kvtrace.transforms.read.records import parse_record
from kvtrace.transforms.trace_format import (
    MAX_PUBLISHED_INT,
    MAX_ROW_IDS,
    MAX_TRACE_LINE_BYTES,
    NO_RESPONSE_MS,
    NO_SESSION,
    FormatError,
    TraceColumns,
    check_values,
    jsonl_bytes,
)


def test_the_longest_row_kvtrace_writes_is_a_line_its_readers_hold():
    """Every field at its widest: the longest ids, a session, a response time, output ids."""
    widest = np.array([(1 << 63) - 1])
    split = MAX_ROW_IDS // 2
    row = TraceColumns(
        widest,
        widest,
        widest,
        np.array([split]),
        np.full(split, MAX_PUBLISHED_INT - 1),
        widest,
        widest,
        np.array([MAX_ROW_IDS - split]),
        np.full(MAX_ROW_IDS - split, MAX_PUBLISHED_INT - 1),
    )
    assert row.session[0] != NO_SESSION
    line = jsonl_bytes(row)
    assert MAX_TRACE_LINE_BYTES - 1024 < len(line) <= MAX_TRACE_LINE_BYTES


def test_a_request_of_more_blocks_than_a_row_holds_is_a_too_large_dead_letter(
    tiny_tokenizer, monkeypatch
):
    monkeypatch.setattr(encode_requests, "MAX_ROW_IDS", 3)  # the bound, made small to test
    encoder = RequestEncoder(
        load_tokenizer(tiny_tokenizer),
        b"\0" * 16,
        EncodeOptions(tiny_tokenizer, SaltSource("random"), block_size=4),
    )
    requests = [
        parse_record(
            json.dumps(
                {"timestamp": 0, "input_ids": list(range(tokens)), "output_length": 1}
            ).encode(),
            "f",
        )
        for tokens in (12, 13)
    ]  # 3 blocks of 4, then a fourth
    hashed, rejected = encoder.encode(requests)
    assert len(hashed) == 1 and hashed.requests["input_length"].tolist() == [12]
    (letter,) = rejected
    assert letter.reason == "too_large" and letter.message.startswith("4 blocks, over the 3")


def test_the_gate_refuses_a_row_longer_than_kvtrace_writes():
    """check_values: the ranges columns_of_jsonl (audit's parse) holds every shard's rows to."""

    def row(ids: int, output_ids: int) -> TraceColumns:
        one = np.array([0])
        return TraceColumns(
            one,
            np.array([ids]),
            one,
            np.array([ids]),
            np.arange(ids),
            np.array([NO_SESSION]),
            np.array([NO_RESPONSE_MS]),
            np.array([output_ids]),
            np.arange(output_ids),
        )

    check_values(row(MAX_ROW_IDS - 5, 5))
    with pytest.raises(FormatError, match=f"a row of {MAX_ROW_IDS + 1} ids, over the "):
        check_values(row(MAX_ROW_IDS - 5, 6))  # output ids count too
