"""Red team round 6 (rt6-det): determinism and row order. Each test asserts a promise and fails
today."""

from __future__ import annotations

import pytest

from helpers import anonymize, trace, write_jsonl
from kvtrace.cli import main

pytestmark = pytest.mark.slow

SALT = b"keyed-map-test-salt-of-32-bytes!"
ZERO = 1_700_000_000_000

# Four answers of ten tokens each in the tiny tokenizer's vocabulary: the same output_length.
ANSWERS = [
    "the quick brown fox jumps over the lazy dog again",
    "again dog lazy the over jumps fox brown quick the",
    "hello world this is a prompt about caching blocks again",
    "over the lazy dog the quick brown fox jumps again",
]


def _same_question(latency: bool) -> list[dict]:
    records = []
    for i, answer in enumerate(ANSWERS):
        record = {
            "timestamp": ZERO,
            "messages": [{"role": "user", "content": "What is the capital of France ?"}],
            "output": answer,
        }
        if latency:
            record["latency_ms"] = 100 * (len(ANSWERS) - i)
        records.append(record)
    return records


@pytest.mark.parametrize("latency", [True, False], ids=["with-response-ms", "without"])
def test_requests_alike_but_for_their_answers_publish_what_the_gate_passes(
    tiny_tokenizer, tmp_path, latency
):
    """Promise: the gate accepts the bytes kvtrace writes (docs/ORDERING.md: ids 'numbered
    first-seen in this same order ... so the rows' order and their ids agree in every engine').
    With --emit-output-hashes, requests of one millisecond, one prompt and one output_length
    (a retried or sampled question) tie on time, tie key and fingerprint (the fingerprint has
    the prompt, the output LENGTH and the session: not the answer). Their rows then sort by
    response_ms and the ids' digest (rows.RowBatch.sorted), but the blocks only their answers
    hold are numbered by (ts, key, fp, pos, HASH) (dense_ids.number): two tie-breaks that
    disagree. Rows come out with output ids [6, 8], [3, 9], [4, 7], [5, 10], and
    `kvtrace audit` refuses kvtrace's own folder ('output_hash_ids only outputs hold not
    numbered in first-seen order'). The same in both engines and every input order."""
    (tmp_path / "salt").write_bytes(SALT)
    night = write_jsonl(tmp_path / "night.jsonl", _same_question(latency))
    out = tmp_path / "out"
    code = anonymize(
        tiny_tokenizer,
        [night],
        out,
        "--block-size",
        "4",
        "--salt-file",
        str(tmp_path / "salt"),
        "--emit-output-hashes",
    )
    assert code == 0
    firsts: list[int] = []
    for row in trace(out):
        firsts += [i for i in row["output_hash_ids"] if i >= 3 and i not in firsts]
    assert firsts == sorted(firsts), f"output ids first seen as {firsts}"
    assert main(["audit", str(out)]) == 0


def _prompt(ts: int, text: str, output_length: int) -> dict:
    return {
        "timestamp": ts,
        "output_length": output_length,
        "messages": [{"role": "user", "content": text}],
    }


@pytest.mark.parametrize("engine", ["local", pytest.param("beam", marks=pytest.mark.beam)])
def test_nights_cut_inside_a_granule_give_what_one_run_over_them_gives(
    tiny_tokenizer, tmp_path, capsys, engine
):
    """Promise (README 'Nightly exports'): 'night 1 and night 2, one after the other, give byte
    for byte what one run over both nights gives'; docs/ORDERING.md: 'Raw times never order
    rows', rows of one published time sort by input_length, output_length. With
    --timestamp-granularity-ms, granules are rounded half up from the map's origin, so a
    night's end (a raw cut: midnight, the log's rotation) can fall inside a granule: a long
    request 300 ms before the cut (night 1) and a short one 200 ms after it (night 2) both
    publish at 2000, where one run writes the short one first. Rule (docs/NIGHTLY.md): a night
    on a map begins after the last time its nights published (id_map.published_to_ms), else it
    is refused with one line and publishes nothing; the same requests cut at the granule's end
    give what one run gives."""
    (tmp_path / "salt").write_bytes(SALT)
    common = ["--block-size", "4", "--salt-file", str(tmp_path / "salt")]
    common += ["--timestamp-granularity-ms", "1000", "--engine", engine]
    short = _prompt(ZERO, "hello world", 3)
    long = _prompt(ZERO + 1_700, "the quick brown fox jumps over the lazy dog again and again", 4)
    late = _prompt(ZERO + 2_200, "What is the capital of France ?", 5)
    both = write_jsonl(tmp_path / "both.jsonl", [short, long, late])
    assert anonymize(tiny_tokenizer, [both], tmp_path / "both", *common) == 0
    assert [r["input_length"] for r in trace(tmp_path / "both")] == [7, 12, 17]

    def night(day: int, records: list[dict], map_name: str) -> int:
        path = write_jsonl(tmp_path / f"{map_name}-night{day}.jsonl", records)
        out = tmp_path / f"{map_name}-out{day}"
        return anonymize(tiny_tokenizer, [path], out, "--id-map", str(tmp_path / map_name), *common)

    assert night(0, [short, long], "cut-inside") == 0
    versions = sorted((tmp_path / "cut-inside" / "versions").iterdir())
    capsys.readouterr()
    assert night(1, [late], "cut-inside") == 1
    assert "at or before 2000 ms" in capsys.readouterr().err
    assert not (tmp_path / "cut-inside-out1").exists()
    assert sorted((tmp_path / "cut-inside" / "versions").iterdir()) == versions

    assert night(0, [short], "cut-at-end") == 0
    assert night(1, [long, late], "cut-at-end") == 0
    nights = trace(tmp_path / "cut-at-end-out0") + trace(tmp_path / "cut-at-end-out1")
    assert nights == trace(tmp_path / "both")


@pytest.mark.parametrize("engine", ["local", pytest.param("beam", marks=pytest.mark.beam)])
def test_a_quiet_nights_clock_reset_is_judged_against_the_map_as_one_run_judges_it(
    tiny_tokenizer, tmp_path, engine
):
    """Promise (README 'Nightly exports'): nights on a map give byte for byte what one run over
    them gives; a clock reset is a dead letter (read/timestamps.plausible_days: the bulk of the
    input's days decides). A stream judges a reset against the windows it published
    (docs/STREAMING.md 'Clock resets'); a night on a map is judged alone: its bulk is its own.
    A quiet night (one real request) with two requests from a gateway whose clock jumped 400
    days ahead takes the reset as its bulk: the real request is the dead letter
    (implausible_timestamp) and the two reset rows are published 400 days after the map's
    origin. One run over both nights exports the real request and dead-letters the reset."""
    (tmp_path / "salt").write_bytes(SALT)
    common = ["--block-size", "4", "--salt-file", str(tmp_path / "salt")]
    common += ["--max-rejected-fraction", "0.9", "--engine", engine]
    day = 86_400_000
    first = [_prompt(ZERO + 1_000 * i, "hello world " + "again " * i, 3) for i in range(5)]
    quiet = [
        _prompt(ZERO + day, "the quick brown fox", 4),
        _prompt(ZERO + 401 * day, "What is the capital of France ?", 5),
        _prompt(ZERO + 401 * day + 5, "the lazy dog", 5),
    ]
    for n, records in enumerate([first, quiet]):
        night = write_jsonl(tmp_path / f"night{n}.jsonl", records)
        assert (
            anonymize(
                tiny_tokenizer,
                [night],
                tmp_path / f"out{n}",
                "--id-map",
                str(tmp_path / "map"),
                *common,
            )
            == 0
        )
    both = write_jsonl(tmp_path / "both.jsonl", first + quiet)
    assert anonymize(tiny_tokenizer, [both], tmp_path / "both", *common) == 0
    assert [r["timestamp"] for r in trace(tmp_path / "out1")] == [day], (
        "the quiet night published the reset and dead-lettered its real request"
    )
    assert trace(tmp_path / "out0") + trace(tmp_path / "out1") == trace(tmp_path / "both")
