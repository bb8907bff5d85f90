"""The gate's first-seen check over prompt and output block ids together: it passes the ids
dense_ids gives a night with answers, and refuses them numbered any other way (an earlier
kvtrace numbered answers' own blocks after every prompt block of the night)."""

from __future__ import annotations

import numpy as np

from kvtrace.transforms.encode.blocks import chain_seed, token_bytes
from kvtrace.transforms.encode.encode_requests import _output_block_hashes
from kvtrace.transforms.encode.hashed_batch import HashedBatch, HashedRequest
from kvtrace.transforms.encode.schemes import HashScheme
from kvtrace.transforms.ids.dense_ids import block_keys, dense_ids
from kvtrace.transforms.stats.audit import _Rows
from kvtrace.transforms.trace_format import NO_RESPONSE_MS, NO_SESSION, TraceColumns

SEED = chain_seed(b"a salt for the gate's order tests")
BLOCK = 2
# (ms, prompt, answer): the second turn's prompt holds the first's answer; the third is new.
TURNS = [(0, [1, 2, 3], [4, 5, 6]), (1, [1, 2, 3, 4, 5, 6, 7], [8]), (2, [9, 9], [])]


def _batch() -> HashedBatch:
    scheme = HashScheme()
    return HashedBatch.pack(
        [
            HashedRequest(
                timestamp_ms=ts,
                fingerprint=0,
                input_length=len(prompt),
                output_length=len(answer),
                block_hashes=scheme.block_keys(token_bytes(prompt), BLOCK, SEED),
                session_key=None,
                output_block_hashes=_output_block_hashes(
                    token_bytes(prompt), token_bytes(answer), BLOCK, SEED, scheme
                ),
            )
            for ts, prompt, answer in TURNS
        ]
    )


def _columns(batch: HashedBatch, ids: np.ndarray) -> TraceColumns:
    """The rows as published: each request's ids, its prompt's then its answer's."""
    requests = batch.requests
    prompt, answer = requests["num_blocks"], requests["num_output_blocks"]
    is_answer = np.concatenate([np.repeat([False, True], [p, a]) for p, a in zip(prompt, answer)])
    return TraceColumns(
        requests["timestamp_ms"],
        requests["input_length"],
        requests["output_length"],
        prompt,
        ids[~is_answer],
        np.full(len(requests), NO_SESSION),
        np.full(len(requests), NO_RESPONSE_MS),
        answer,
        ids[is_answer],
    )


def _problems(columns: TraceColumns) -> list[str]:
    rows = _Rows()
    rows.add(columns, None)
    return rows.problems


def test_the_gate_passes_answers_numbered_where_they_are_first_seen():
    batch = _batch()
    columns = _columns(batch, dense_ids(block_keys(batch, BLOCK)).ids)
    # Row 1's answer takes 2 and 3 right after its prompt's 0 and 1; row 2's prompt holds
    # them, then its own last block is 4 and its answer 5; row 3's prompt is 6.
    assert columns.ids.tolist() == [0, 1, 0, 2, 3, 4, 6]
    assert columns.output_ids.tolist() == [2, 3, 5]
    assert _problems(columns) == []


def test_the_gate_refuses_answers_numbered_after_every_prompt():
    batch = _batch()
    keys = block_keys(batch, BLOCK)
    keys["ts"][keys["weight"] == 0] += 1 << 40  # answers' blocks seen after every prompt's
    columns = _columns(batch, dense_ids(keys).ids)
    assert columns.output_ids.tolist() == [2, 3, 6]  # row 3's prompt took 5
    assert "block ids not numbered in first-seen order (dense from the night's first)" in (
        _problems(columns)
    )
