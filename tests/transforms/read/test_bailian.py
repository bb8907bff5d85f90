"""kvtrace convert: Bailian usage traces become Mooncake rows with sessions."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms.read.bailian import convert


def bailian(chat, parent, ts, isl, ids, turn=1) -> dict:
    return {
        "chat_id": chat,
        "parent_chat_id": parent,
        "timestamp": ts,
        "input_length": isl,
        "output_length": 5,
        "type": "text",
        "turn": turn,
        "hash_ids": ids,
    }


ROWS = [
    bailian(159, -1, 61.114, 40, [1, 2, 3]),
    bailian(160, 159, 62.5, 70, [1, 2, 3, 4, 5], 2),
    bailian(161, 160, 64.0, 90, [1, 2, 3, 4, 5, 6], 3),
    bailian(170, 99, 60.0, 17, [7, 8], 3),  # parent not in this subset
    bailian(171, 99, 63.0, 17, [7, 9], 3),
    bailian(300, -1, 65.25, 10, [10]),
]


def test_turns_are_linked_into_sessions_and_rows_are_mooncake():
    converted = convert(json.dumps(r).encode() for r in ROWS)
    rows = converted.rows
    assert [r["timestamp"] for r in rows] == [60000, 61114, 62500, 63000, 64000, 65250]
    assert [r["session"] for r in rows] == [0, 1, 1, 0, 1, 2]
    assert set(rows[0]) == {"timestamp", "input_length", "output_length", "hash_ids", "session"}
    assert converted.malformed == 0


def test_bad_lines_are_counted_not_fatal():
    lines = [
        json.dumps(ROWS[0]),
        "{not json",
        json.dumps({"chat_id": 1}),
        json.dumps({**ROWS[1], "input_length": "70"}),
        "[1, 2]",
        json.dumps(bailian(1, 2, 1.0, 1, [1])),
        json.dumps(bailian(2, 1, 1.0, 1, [1])),
    ]
    converted = convert(line.encode() for line in lines)
    assert len(converted.rows) == 1 and converted.malformed == 6
    assert "cycle" in converted.examples[4]  # 1 and 2 are each other's parents


@given(
    st.lists(
        st.one_of(
            st.dictionaries(
                st.sampled_from(
                    [
                        "chat_id",
                        "parent_chat_id",
                        "timestamp",
                        "input_length",
                        "output_length",
                        "hash_ids",
                        "turn",
                    ]
                ),
                st.one_of(
                    st.integers(-3, 10**6),
                    st.floats(allow_nan=True),
                    st.text(max_size=3),
                    st.none(),
                    st.lists(st.integers(-5, 10**9), max_size=4),
                ),
            ),
            st.builds(
                bailian,
                st.integers(0, 50),
                st.integers(-1, 50),
                st.floats(0, 1e6),
                st.integers(0, 100),
                st.lists(st.integers(0, 100), max_size=7),
            ),
        ),
        max_size=30,
    )
)
def test_arbitrary_records_never_crash_and_good_ones_are_kept(records):
    converted = convert(json.dumps(r).encode() for r in records)
    assert len(converted.rows) + converted.malformed == len(records)
    assert [r["timestamp"] for r in converted.rows] == sorted(
        r["timestamp"] for r in converted.rows
    )
    assert sorted({r["session"] for r in converted.rows}) == list(
        range(len({r["session"] for r in converted.rows}))
    )


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_a_long_parent_chain_converts_walking_each_chat_once():
    from kvtrace.transforms.read import bailian

    class Counted(dict):
        steps = 0

        def __getitem__(self, key):
            Counted.steps += 1
            return super().__getitem__(key)

    n = 50_000
    roots = bailian._roots(Counted({i: i - 1 if i else -1 for i in range(n)}))
    assert Counted.steps <= n  # a walk per chat to the root would be n^2 / 2
    assert set(roots.values()) == {0}
    chain = [
        json.dumps(
            {
                "chat_id": i,
                "parent_chat_id": i - 1 if i else -1,
                "timestamp": i,
                "input_length": 16,
                "output_length": 1,
                "hash_ids": [0],
            }
        )
        for i in range(n)
    ]
    converted = convert(line.encode() for line in chain)
    assert converted.malformed == 0 and {row["session"] for row in converted.rows} == {0}


def test_unhashable_parents_are_malformed_lines_not_a_crash():
    lines = [
        json.dumps(
            {
                "chat_id": 1,
                "parent_chat_id": [1],
                "timestamp": 1,
                "input_length": 1,
                "output_length": 1,
                "hash_ids": [0],
            }
        ),
        "[" * 100_000,
    ]
    converted = convert(line.encode() for line in lines)
    assert converted.malformed == 2 and not converted.rows


def test_rows_are_written_by_the_trace_writer_as_json_dumps_would():
    """convert writes through trace_format.jsonl_bytes: the same bytes as each row's
    json.dumps (what convert wrote before), every row within a trace reader's line."""
    from kvtrace.transforms.read.bailian import trace_jsonl

    rows = convert(json.dumps(r).encode() for r in ROWS).rows
    assert trace_jsonl(rows) == "".join(json.dumps(r) + "\n" for r in rows).encode()


def test_a_row_is_bounded_as_a_trace_row_kvtrace_writes():
    """More ids than MAX_ROW_IDS, or an id past MAX_PUBLISHED_INT, would write a line a trace
    reader refuses: the record is malformed instead."""
    from kvtrace.transforms.trace_format import MAX_PUBLISHED_INT, MAX_ROW_IDS

    many = (
        '{"chat_id": 1, "timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": ['
        + ",".join(["1"] * (MAX_ROW_IDS + 1))
        + "]}"
    )
    converted = convert(
        line.encode()
        for line in [
            many,
            json.dumps(bailian(2, -1, 1.0, 1, [MAX_PUBLISHED_INT])),
            json.dumps(bailian(3, -1, 1.0, 1, [MAX_PUBLISHED_INT - 1])),
        ]
    )
    assert converted.malformed == 2 and len(converted.rows) == 1
    assert "over the" in converted.examples[0] and "below" in converted.examples[1]


def test_records_are_kept_as_the_fields_conversion_reads():
    """A record may carry any other field of the format's kinds (a number or a name): memory
    follows one record's parse, not the file's."""
    import tracemalloc

    junk = "x" * 1_000_000
    lines = (
        (json.dumps(bailian(chat, -1, 1.0, 1, [chat]))[:-1] + f', "junk": "{junk}"}}').encode()
        for chat in range(10)
    )
    tracemalloc.start()
    converted = convert(lines)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(converted.rows) == 10
    assert peak < 4 * len(junk), peak  # a line, its parse; all ten kept whole: ~20 x


def test_a_record_of_more_containers_than_a_row_holds_is_malformed_unparsed():
    """A row holds two containers (itself, hash_ids): 50,000 empty lists more (~3 MB of Python
    objects once parsed, from 200 KB of text) make the line malformed before it is parsed,
    brackets inside its strings (names) not counted."""
    import tracemalloc

    junk = json.dumps([[]] * 50_000)
    named = json.dumps(bailian("[chat] {1}", -1, 1.0, 1, [1])).encode()
    lines = [(json.dumps(bailian(2, -1, 1.0, 1, [2]))[:-1] + f', "junk": {junk}}}').encode(), named]
    tracemalloc.start()
    converted = convert(iter(lines))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert converted.malformed == 1 and len(converted.rows) == 1
    assert converted.examples == [
        "line 1: 50003 JSON objects and lists, over the 2 a Bailian row holds "
        "(the row and its hash_ids): not parsed"
    ]
    assert peak < 64 * 50_000 // 4, peak  # the line and a copy at most, never its parse


@given(
    st.lists(
        st.builds(
            bailian,
            st.one_of(st.integers(0, 6), st.sampled_from(["3", "x"])),
            st.one_of(st.integers(-1, 6), st.sampled_from([None, "-1", "x"])),
            st.sampled_from([1.0, 1.0004, 2.5, 3.0]),  # ties, and times of one published ms
            st.integers(0, 3),
            st.lists(st.integers(0, 3), max_size=3),
        ),
        max_size=12,
    ),
    st.randoms(use_true_random=False),
)
def test_the_same_rows_in_any_order_convert_alike(records, random):
    shuffled = random.sample(records, len(records))
    given_order, other_order = (
        convert(json.dumps(r).encode() for r in rs) for rs in (records, shuffled)
    )
    assert given_order.rows == other_order.rows
    assert given_order.malformed == other_order.malformed


def test_a_chat_id_on_rows_of_one_parent_is_one_chat_of_different_parents_malformed():
    rows = [
        bailian(1, -1, 1.0, 16, [1]),
        bailian(2, 1, 2.0, 32, [1, 2], 2),
        bailian(2, 1, 2.0, 32, [1, 2], 2),  # a chat logged twice: the same conversation
        bailian(3, 1, 3.0, 16, [5]),
        bailian(3, None, 3.5, 16, [6]),  # chat 3: a follow-up of 1, or a first request?
        bailian(4, 3, 4.0, 32, [6, 7], 2),
    ]
    for order in (rows, rows[::-1]):
        converted = convert(json.dumps(r).encode() for r in order)
        assert converted.malformed == 2
        assert all("different parent_chat_id" in example for example in converted.examples)
        # chat 4's parent is then missing from the file: it names the session, as a subset's
        assert [(r["timestamp"], r["session"]) for r in converted.rows] == [
            (1000, 0),
            (2000, 0),
            (2000, 0),
            (4000, 1),
        ]
