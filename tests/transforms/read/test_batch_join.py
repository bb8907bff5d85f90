"""OpenAI Batch lines told apart, joined by custom_id whatever their order, spilled and merged
in bounded memory (the local engine), grouped by key (Beam): one pure function decides."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms.dead_letters import DeadLetter
from kvtrace.transforms.read.batch_join import (
    DUPLICATE,
    INPUT,
    OUTPUT,
    UNJOINED,
    BatchSpill,
    Half,
    batch_half,
    join_halves,
    joined_line,
    joined_partition,
)
from kvtrace.transforms.read.records import ParseOptions
from kvtrace.transforms.read.sources import parse_one
from kvtrace.transforms.sorted_runs import merge_files

OPTIONS = ParseOptions()
MESSAGES = [{"role": "user", "content": "the quick brown fox"}]


def request(custom_id: str, **extra) -> bytes:
    line = {"custom_id": custom_id, "url": "/v1/chat/completions", "body": {"messages": MESSAGES}}
    return json.dumps({**line, **extra}).encode()


def answer(custom_id: str, created: int = 1_763_703_600, tokens: int = 3) -> bytes:
    body = {"created": created, "choices": [], "usage": {"completion_tokens": tokens}}
    return json.dumps(
        {"id": "b", "custom_id": custom_id, "response": {"status_code": 200, "body": body}}
    ).encode()


def test_input_and_output_lines_are_told_apart_and_nothing_else_is_a_half():
    assert batch_half(request("a"), OPTIONS) == ("a", INPUT, False)
    assert batch_half(answer("a"), OPTIONS) == ("a", OUTPUT, False)
    error = json.dumps({"custom_id": "a", "response": None, "error": {"code": "x"}}).encode()
    assert batch_half(error, OPTIONS) == ("a", OUTPUT, False)
    joined = joined_line(request("a"), answer("a"))
    assert batch_half(joined, OPTIONS) is None  # joined already: read as it is
    assert batch_half(b'{"timestamp": 1, "messages": []}', OPTIONS) is None
    assert batch_half(b'{"custom_id": 7, "body": {}}', OPTIONS) is None  # its type refused later
    assert batch_half(b'{"custom_id": "a", "body": ', OPTIONS) is None  # not JSON: a letter later
    assert batch_half(b'["custom_id"]', OPTIONS) is None
    assert batch_half({"custom_id": "a", "body": {}}, OPTIONS) is None  # a Parquet row
    bounded = ParseOptions(max_record_bytes=16)
    assert batch_half(request("a"), bounded) is None  # never decoded past its bound


def test_a_joined_pair_parses_to_the_request_with_the_answer_s_time_and_length():
    [(source, line)] = join_halves(
        "a", [Half(OUTPUT, "out", answer("a")), Half(INPUT, "in", request("a"))]
    )
    parsed = parse_one(source, line, OPTIONS)
    assert source == "in" and parsed.messages[0]["content"] == "the quick brown fox"
    assert (parsed.timestamp_ms, parsed.output_length) == (1_763_703_600_000, 3)
    assert json.loads(line)["id"] == "b"  # the output line's fields the input line lacks


def test_a_null_input_field_takes_the_output_line_s_value():
    line = joined_line(request("a", response=None), answer("a"))
    assert json.loads(line)["response"]["status_code"] == 200


def test_a_lone_surrogate_survives_the_join_as_its_line_wrote_it():
    odd = request("a").replace(b"the quick", b"\\ud800 quick")
    parsed = parse_one("in", joined_line(odd, answer("a")), OPTIONS)
    assert isinstance(parsed, DeadLetter) and parsed.reason == parse_one("in", odd, OPTIONS).reason


def test_a_custom_id_not_encodable_as_utf8_is_no_half_but_a_line_parsed_alone():
    """Beam shuffles halves keyed by custom_id with a strict UTF-8 coder: such a line is no key
    on any engine, and letters alike on both."""
    odd = request("a").replace(b'"a"', b'"x\\ud800"')
    assert batch_half(odd, OPTIONS) is None
    parsed = parse_one("in", odd, OPTIONS)
    assert isinstance(parsed, DeadLetter) and parsed.reason == "invalid_unicode"


@pytest.mark.parametrize("side", [INPUT, OUTPUT])
def test_a_pair_nested_past_what_a_record_may_is_one_too_deep_letter_in_either_order(side):
    """orjson reads a line 1,000 levels deep, which json.dumps cannot write back: the pair is
    refused by the depth rule every line reader applies before it is written, one letter."""
    deep = b', "extra": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    lines = {INPUT: request("a"), OUTPUT: answer("a")}
    lines[side] = lines[side][:-1] + deep
    halves = [Half(INPUT, "in", lines[INPUT]), Half(OUTPUT, "out", lines[OUTPUT])]
    for order in (halves, halves[::-1]):
        [letter] = join_halves("a", order)
        assert isinstance(letter, DeadLetter)
        assert (letter.reason, letter.source, letter.line) == ("too_deep", "in", lines[INPUT])


@pytest.mark.parametrize(
    "sides, reason, says",
    [
        ([INPUT], UNJOINED, "give its output file"),
        ([OUTPUT], UNJOINED, "give its input file"),
        ([INPUT, INPUT, OUTPUT], DUPLICATE, "more than one"),
        ([INPUT, OUTPUT, OUTPUT], DUPLICATE, "more than one"),
        ([OUTPUT, OUTPUT], DUPLICATE, "more than one"),
        ([INPUT, INPUT, OUTPUT, OUTPUT], DUPLICATE, "more than one"),
    ],
)
def test_lines_that_do_not_pair_are_each_a_letter_in_whatever_order(sides, reason, says):
    lines = {INPUT: request("a"), OUTPUT: answer("a")}
    halves = [Half(side, f"f{i}", lines[side]) for i, side in enumerate(sides)]
    outcomes = {
        tuple(sorted(join_halves("a", order), key=lambda letter: letter.source))
        for order in itertools.permutations(halves)
    }
    assert len(outcomes) == 1  # the same letters whatever order the lines came in
    [letters] = outcomes
    assert len(letters) == len(sides)  # every line accounted for, none joined
    assert all(x.reason == reason and says in x.message for x in letters)
    assert [x.line for x in letters] == [h.line for h in halves]


@pytest.mark.parametrize(
    "sides, said",
    [
        (
            [INPUT, INPUT, OUTPUT],
            ["is on more than one Batch input line"] * 2
            + ["of this Batch output line is on more than one Batch input line"],
        ),
        (
            [INPUT, OUTPUT, OUTPUT],
            ["of this Batch input line is on more than one Batch output line"]
            + ["is on more than one Batch output line"] * 2,
        ),
        (
            [INPUT, INPUT, OUTPUT, OUTPUT],
            ["is on more than one Batch input line"] * 2
            + ["is on more than one Batch output line"] * 2,
        ),
    ],
)
def test_a_duplicate_letter_names_the_side_the_custom_id_repeats_on(sides, said):
    """Round 11: an input line repeated gave the single output line's letter "is on more
    than one Batch output line". Each letter now names the repeated side, in any order."""
    lines = {INPUT: request("a"), OUTPUT: answer("a")}
    halves = [Half(side, f"f{i}", lines[side]) for i, side in enumerate(sides)]
    for order in itertools.permutations(halves):
        letters = sorted(join_halves("a", order), key=lambda letter: letter.source)
        assert [said_here in x.message for x, said_here in zip(letters, said)] == [True] * len(
            said
        ), [x.message for x in letters]


def test_the_spill_joins_every_custom_id_once_across_runs_and_partitions(tmp_path):
    """Two workers' spills, each forced into many runs: each partition merged and read in
    custom_id order gives every pair joined and every stray line a letter, nothing twice."""
    spills = [BatchSpill(str(tmp_path), partitions=3, run_bytes=300) for _ in range(2)]
    for i in range(40):
        spills[i % 2].add(f"r{i}", Half(INPUT, "in", request(f"r{i}")))
        if i % 10:  # r0, r10, r20, r30 unanswered
            spills[(i + 1) % 2].add(f"r{i}", Half(OUTPUT, "out", answer(f"r{i}", tokens=i)))
    runs = [run for spill in spills for run in spill.close()]
    assert len(runs) > 6  # many runs per partition
    outcomes = []
    for partition in range(3):
        mine = [path for p, path, _ in runs if p == partition]
        merged = merge_files(mine, str(tmp_path / f"joined-{partition}.jsonl"), fan_in=2)
        outcomes += list(joined_partition(merged))
    letters = [x for x in outcomes if isinstance(x, DeadLetter)]
    joined = [parse_one(*x, OPTIONS) for x in outcomes if not isinstance(x, DeadLetter)]
    assert sorted(r.output_length for r in joined) == [i for i in range(40) if i % 10]
    assert sorted(json.loads(x.line)["custom_id"] for x in letters) == ["r0", "r10", "r20", "r30"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"joined-{k}.jsonl" for k in range(3)]


@given(
    lines=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c", "d\t", "é"]), st.sampled_from([INPUT, OUTPUT])),
        max_size=12,
    ),
    partitions=st.integers(1, 3),
    run_bytes=st.sampled_from([1, 400, 1 << 20]),
)
def test_however_lines_are_spilled_each_is_joined_or_a_letter_once(
    tmp_path_factory, lines, partitions, run_bytes
):
    """Every line is in exactly one outcome (a pair's two lines in its joined record), and the
    outcomes are what join_halves makes of each custom_id's lines whole."""
    folder = tmp_path_factory.mktemp("spill")
    spills = [BatchSpill(str(folder), partitions, run_bytes) for _ in range(2)]
    halves = []
    for i, (custom_id, side) in enumerate(lines):
        line = (request if side == INPUT else answer)(
            custom_id, **({"n": i} if side == INPUT else {})
        )
        halves.append((custom_id, Half(side, f"f{i}", line)))
        spills[i % 2].add(custom_id, halves[-1][1])
    runs = [run for spill in spills for run in spill.close()]
    got = []
    for partition in range(partitions):
        mine = [path for p, path, _ in runs if p == partition]
        if mine:
            got += joined_partition(merge_files(mine, str(folder / f"p{partition}"), fan_in=2))
    expected = [
        item
        for custom_id in sorted({c for c, _ in lines})
        for item in join_halves(custom_id, [h for c, h in halves if c == custom_id])
    ]
    assert sorted(map(repr, got)) == sorted(map(repr, expected))
    joined = [x for x in got if not isinstance(x, DeadLetter)]
    assert 2 * len(joined) + len(got) - len(joined) == len(lines)  # each line once


def test_a_spilled_line_keeps_its_bytes_and_source_whatever_they_hold(tmp_path):
    line = request('a\t"b\n', note="tab\tinside")
    spill = BatchSpill(str(tmp_path), partitions=1)
    spill.add('a\t"b\n', Half(INPUT, "dir/na\\x80me", line))
    [(_, path, size)] = spill.close()
    assert size == (tmp_path / path.rsplit("/", 1)[1]).stat().st_size
    [letter] = joined_partition(path)
    assert (letter.source, letter.line, letter.reason) == ("dir/na\\x80me", line, UNJOINED)


def test_a_line_naming_engine_hashes_withholds_every_letter_made_of_it(tmp_path):
    """batch_half decides once whether a line's letters withhold it; the Half carries that
    through a spill, so a lone line's letter withholds it, and a plain line's does not."""
    hashed = request("h", chunk_hashes=[123456789])
    assert batch_half(hashed, OPTIONS) == ("h", INPUT, True)
    spill = BatchSpill(str(tmp_path), partitions=1)
    for line in (hashed, request("p")):
        custom_id, side, withhold = batch_half(line, OPTIONS)
        spill.add(custom_id, Half(side, "in", line, withhold))
    [(_, path, _)] = spill.close()
    assert [letter.withhold for letter in joined_partition(path)] == [True, False]
    twice = [Half(INPUT, "in", hashed, True), Half(INPUT, "in", hashed, True)]
    assert all(letter.withhold for letter in join_halves("h", twice))


def test_every_letter_of_a_batch_line_weighs_its_bytes_as_read_through_a_spill(tmp_path):
    """A Batch line's letter weighs its line's bytes as read (records.line_weight: a compressed
    file's at its share), kept through the local engine's spill as Beam's pickle keeps it; a
    pair refused as one record weighs both its lines (round 16)."""
    from kvtrace.transforms.read.records import StoredLine

    lone = StoredLine.weighing(request("lone"), 7)
    spill = BatchSpill(str(tmp_path), partitions=1)
    spill.add("lone", Half(INPUT, "in.gz", lone))
    [(_, path, _)] = spill.close()
    [letter] = joined_partition(path)
    assert (letter.reason, letter.lost_bytes) == (UNJOINED, 7)
    asked, answered = request("p", timestamp=1), answer("p", tokens=-1)
    [(_, joined)] = join_halves("p", [Half(INPUT, "in", asked), Half(OUTPUT, "out", answered)])
    refused = parse_one("in", joined, OPTIONS)
    assert isinstance(refused, DeadLetter)
    assert refused.lost_bytes == len(asked) + len(answered)


@pytest.mark.beam
def test_the_beam_step_joins_as_the_local_engine_does():
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.transforms.dead_letters import DEAD_LETTER_TAG
    from kvtrace.transforms.read.steps import JoinBatchHalves

    records = [
        ("in", request("a")),
        ("out", answer("a")),
        ("in", request("lone")),
        ("log", b'{"timestamp": 1, "messages": []}'),
    ]
    with TestPipeline() as pipeline:
        joined = pipeline | beam.Create(records) | JoinBatchHalves(OPTIONS)
        assert_that(
            joined["records"],
            equal_to([("in", joined_line(request("a"), answer("a"))), records[3]]),
            label="Records",
        )
        assert_that(
            joined[DEAD_LETTER_TAG] | beam.Map(lambda letter: (letter.line, letter.reason)),
            equal_to([(request("lone"), UNJOINED)]),
            label="Letters",
        )
