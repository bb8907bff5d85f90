"""Encoding with tokenization in a background thread gives what encoding batch by batch gives."""

from __future__ import annotations

import json

import numpy as np

from helpers import chat
from kvtrace.transforms.encode.encode_requests import (
    EncodeOptions,
    OverlappedEncoder,
    RequestEncoder,
)
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.encode.tokenize import load_tokenizer
from kvtrace.transforms.read.records import parse_record


def batches() -> list[list]:
    records = [chat(i, 1_000 * i) for i in range(7)] + [{"timestamp": 9, "prompt": "fox dog"}]
    requests = [parse_record(json.dumps(r).encode(), "f") for r in records]
    return [requests[:3], requests[3:6], requests[6:]]


def test_overlapped_batches_equal_batches_encoded_one_after_another(tiny_tokenizer):
    encoder = RequestEncoder(
        load_tokenizer(tiny_tokenizer),
        b"\0" * 16,
        EncodeOptions(tiny_tokenizer, SaltSource("random"), block_size=4),
    )
    expected = []
    for batch in batches():
        rendered, failed = encoder.render(batch)
        expected.append((failed, encoder.hash(rendered, encoder.tokenize(rendered))))
    overlapped = OverlappedEncoder(encoder)
    got, finished = [], []
    for batch in batches():
        failed, previous = overlapped.push(batch)
        got.append(failed)
        finished.append(previous)
    finished.append(overlapped.flush())
    overlapped.close()
    assert finished[0] is None and overlapped.flush() is None
    for (failed, (hashed, rejected)), mine, (my_hashed, my_rejected) in zip(
        expected, got, finished[1:]
    ):
        assert [d.reason for d in mine] == [d.reason for d in failed]
        assert [d.reason for d in my_rejected] == [d.reason for d in rejected]
        assert (hashed is None) == (my_hashed is None)
        if hashed is not None:
            assert np.array_equal(hashed.requests, my_hashed.requests)
            assert np.array_equal(hashed.block_hashes, my_hashed.block_hashes)
