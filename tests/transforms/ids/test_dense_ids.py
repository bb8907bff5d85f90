import functools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms.encode.blocks import chain_hashes, chain_seed, token_bytes
from kvtrace.transforms.encode.encode_requests import _output_block_hashes
from kvtrace.transforms.encode.hashed_batch import HashedBatch, HashedRequest
from kvtrace.transforms.encode.schemes import HashScheme
from kvtrace.transforms.ids.dense_ids import (
    OCCURRENCE,
    UniqueTotals,
    block_keys,
    dense_ids,
    earliest,
    ids_in_request_order,
    number,
    resolve,
    session_keys,
    unique_totals,
)

SEED = chain_seed(b"dense id test salt.............")


def request(ts, tokens, fp=0, block_size=2, session=None):
    return HashedRequest(
        timestamp_ms=ts,
        fingerprint=fp,
        input_length=len(tokens),
        output_length=1,
        block_hashes=chain_hashes(token_bytes(tokens), block_size, SEED),
        session_key=session,
    )


def turn(ts, prompt, output, fp=0, block_size=2):
    """A request whose answer's blocks are hashed too (--emit-output-hashes)."""
    prompt_bytes, output_bytes = token_bytes(prompt), token_bytes(output)
    return HashedRequest(
        timestamp_ms=ts,
        fingerprint=fp,
        input_length=len(prompt),
        output_length=len(output),
        block_hashes=chain_hashes(prompt_bytes, block_size, SEED),
        session_key=None,
        output_block_hashes=_output_block_hashes(
            prompt_bytes, output_bytes, block_size, SEED, HashScheme()
        ),
    )


def table(*rows):
    """Occurrence rows (key, ts, fp, pos), or (key, ts, fp, pos, weight)."""
    out = np.zeros(len(rows), dtype=OCCURRENCE)
    for i, (key, ts, fp, pos, *weight) in enumerate(rows):
        out[i]["hi"], out[i]["lo"], out[i]["ts"], out[i]["fp"], out[i]["pos"] = (
            key,
            key,
            ts,
            fp,
            pos,
        )
        out[i]["weight"] = weight[0] if weight else 0
    return out


def test_earliest_keeps_each_key_at_its_first_occurrence():
    firsts = earliest(table((7, 5, 0, 1), (7, 3, 9, 1), (8, 3, 1, 0), (7, 3, 2, 1)))
    assert sorted(zip(firsts["hi"].tolist(), firsts["ts"].tolist(), firsts["fp"].tolist())) == [
        (7, 3, 2),
        (8, 3, 1),
    ]


def test_number_orders_by_time_then_fingerprint_then_position():
    numbered = number(table((1, 9, 0, 0), (2, 3, 5, 1), (3, 3, 5, 0), (4, 3, 1, 4)), first_id=10)
    assert dict(zip(numbered["hi"].tolist(), numbered["id"].tolist())) == {
        4: 10,
        3: 11,
        2: 12,
        1: 13,
    }


def test_resolve_joins_every_query_to_its_id():
    # First-seen order (9, 5, 6) differs from key order (5, 6, 9): the join must not mix them.
    numbered = number(table((9, 0, 0, 0), (5, 1, 0, 0), (6, 2, 0, 0)), first_id=0)
    queries = table((6, 0, 0, 0), (9, 0, 0, 0), (5, 0, 0, 0), (6, 0, 0, 0))
    assert resolve(numbered, queries).tolist() == [2, 0, 1, 2]


def test_earliest_weighs_a_key_by_its_largest_occurrence():
    """An answer's block (weight 0) seen before a later prompt holds it: first seen at the
    answer, counted with the prompt's tokens; a key only answers hold weighs 0."""
    firsts = earliest(table((7, 1, 0, 3, 0), (7, 2, 0, 1, 4), (7, 3, 0, 1, 4), (8, 1, 0, 4, 0)))
    assert firsts[["hi", "ts", "pos", "weight"]].tolist() == [(7, 1, 3, 4), (8, 1, 4, 0)]


@pytest.mark.beam
def test_combine_is_order_and_grouping_independent():
    from kvtrace.transforms.ids.steps import EarliestOccurrence

    fn = EarliestOccurrence()
    rows = table((1, 5, 0, 0, 2), (1, 2, 0, 0, 0), (2, 7, 0, 0, 1), (2, 7, 0, 3))
    one = fn.extract_output(fn.add_input(fn.create_accumulator(), rows))
    parts = [fn.add_input(fn.create_accumulator(), rows[i : i + 1]) for i in range(4)]
    merged = fn.extract_output(fn.merge_accumulators(reversed(parts)))
    assert one.tobytes() == merged.tobytes()


def test_ids_in_request_order_restores_block_order():
    resolved = np.array(
        [(1, 1, 30), (0, 0, 10), (1, 0, 20)], dtype=[("req", "<u4"), ("pos", "<u4"), ("id", "<i8")]
    )
    assert ids_in_request_order([resolved], np.array([1, 2])).tolist() == [10, 20, 30]


def test_block_keys_weigh_the_partial_last_block_by_its_tokens():
    batch = HashedBatch.pack([request(0, [1, 2, 3, 4, 5]), request(1, []), request(2, [7, 8, 9])])
    table = block_keys(batch, block_size=2)
    assert table["weight"].tolist() == [2, 2, 1, 2, 1]
    assert table["pos"].tolist() == [0, 1, 2, 0, 1] and table["req"].tolist() == [0, 0, 0, 2, 2]


def test_an_answers_blocks_are_seen_at_its_request_after_its_prompt():
    batch = HashedBatch.pack([turn(5, [1, 2, 3], [4, 5, 6, 7]), turn(9, [1, 2], [3])])
    keys = block_keys(batch, block_size=2)
    # Request 0: prompt blocks [1,2] [3]; answer blocks [3,4] [5,6]; request 1: [1,2] only.
    assert keys[["ts", "pos", "weight", "req"]].tolist() == [
        (5, 0, 2, 0),
        (5, 1, 1, 0),
        (5, 2, 0, 0),
        (5, 3, 0, 0),
        (9, 0, 2, 1),
    ]
    assert dense_ids(keys).ids.tolist() == [0, 1, 2, 3, 0]


# A chat log: each turn's prompt is its conversation's last prompt, answer and a new message.
# Few token values and short messages, so conversations share blocks and answers become prompts.
TURNS = st.lists(
    st.tuples(
        st.integers(0, 2),  # the conversation
        st.integers(1, 3),  # ms since the turn before
        st.lists(st.integers(0, 2), max_size=4),  # the new message
        st.lists(st.integers(0, 2), max_size=5),  # the answer
    ),
    max_size=12,
)


def _chat(turns, with_answers=True):
    said: dict[int, list[int]] = {}
    requests, ts = [], 0
    for fp, (conversation, gap, message, answer) in enumerate(turns):
        ts += gap
        prompt = said.get(conversation, []) + message
        requests.append(turn(ts, prompt, answer if with_answers else [], fp=fp))
        said[conversation] = prompt + answer
    return requests


@given(TURNS, st.data())
def test_nights_number_answers_as_one_run_over_them(turns, data):
    """The promise behind nights on an id map and a stream's windows: cut a log anywhere in
    time, number the first part, then the second from the first's ids, and every request gets
    the ids one run over both gives, its answers' ids included."""
    requests = _chat(turns)
    cut = data.draw(st.integers(0, len(requests)))
    whole = dense_ids(block_keys(HashedBatch.pack(requests), 2))
    first = dense_ids(block_keys(HashedBatch.pack(requests[:cut]), 2))
    second = dense_ids(
        block_keys(HashedBatch.pack(requests[cut:]), 2), lambda _: first.added, first.added_count
    )
    assert np.concatenate([first.ids, second.ids]).tolist() == whole.ids.tolist()


@given(TURNS)
def test_answers_change_no_unique_prompt_total(turns):
    """Unique prompt blocks and tokens count prompts only: the same log gives the same totals
    with its answers' blocks numbered as without, though answers now see keys first."""
    with_answers = block_keys(HashedBatch.pack(_chat(turns)), 2)
    without = block_keys(HashedBatch.pack(_chat(turns, with_answers=False)), 2)
    assert unique_totals(earliest(with_answers)) == unique_totals(earliest(without))


def test_session_keys_only_for_requests_with_a_session():
    batch = HashedBatch.pack([request(0, [1]), request(5, [2], session=b"k" * 16)])
    table = session_keys(batch)
    assert table["req"].tolist() == [1] and table["ts"].tolist() == [5]


@pytest.mark.beam
@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_assign_dense_ids_pipeline_numbers_in_first_seen_order():
    # Request b comes first in time, though it sits in the later batch.
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.transforms.ids.steps import AssignDenseIds

    a = request(100, [1, 2, 3, 4, 5])  # blocks [1,2] [3,4] [5]
    b = request(50, [1, 2, 9, 9])  # blocks [1,2] [9,9]
    c = request(100, [1, 2, 3, 4, 5], fp=1)  # exact repeat of a
    with TestPipeline() as p:
        batches = p | beam.Create([(1, HashedBatch.pack([a, c])), (2, HashedBatch.pack([b]))])
        out = batches | AssignDenseIds(functools.partial(block_keys, block_size=2), shards=3)
        ids = out["ids"] | beam.Map(lambda kv: (kv[0], sorted(kv[1].tolist())))
        merged = ids | beam.CombinePerKey(lambda parts: sorted(x for p in parts for x in p))
        assert_that(
            merged,
            equal_to(
                [
                    (1, [(0, 0, 0), (0, 1, 2), (0, 2, 3), (1, 0, 0), (1, 1, 2), (1, 2, 3)]),
                    (2, [(0, 0, 0), (0, 1, 1)]),
                ]
            ),
            label="ids",
        )
        assert_that(out["unique"], equal_to([UniqueTotals(4, 2 + 2 + 2 + 1)]), label="unique")


def test_hash_shards_grow_with_the_map_between_bounds():
    from kvtrace.transforms.ids.dense_ids import (
        DEFAULT_HASH_SHARDS,
        MAX_HASH_SHARDS,
        hash_shards_for,
    )

    assert hash_shards_for(0) == hash_shards_for(10**6) == DEFAULT_HASH_SHARDS
    assert hash_shards_for(10**10) == 895  # 24-byte rows, 256 MiB per shard
    assert hash_shards_for(10**12) == MAX_HASH_SHARDS
