"""Total order: the same requests give the same bytes whatever their order, however the input is
split into files, with any number of workers and either engine; ties included (requests alike
in time and prompt, differing only in response, session, or not at all)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from helpers import anonymize, assert_same_output, write_jsonl

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog"]


def _records() -> list[dict]:
    """Requests with deliberate ties: several at one millisecond with the same prompt, some told
    apart only by their response (its output blocks), some by their session, some identical."""
    records = []
    for i in range(40):
        ts = 1_700_000_000_000 + 1000 * (i // 8)  # eight requests per millisecond
        prompt = " ".join(WORDS[: 2 + i % 3])
        answer = " ".join(WORDS[(i % 5) :] + WORDS[: (i % 5)])
        record = {"timestamp": ts, "input": [{"role": "user", "content": prompt}], "output": answer}
        if i % 4 == 1:
            record["session_id"] = f"user-{i % 3}"
        records.append(record)
    return records + records[:6]  # exact duplicates too


def _write_split(records: list[dict], folder: Path, files: int, seed: int) -> list[Path]:
    shuffled = records[:]
    random.Random(seed).shuffle(shuffled)
    folder.mkdir()
    return [write_jsonl(folder / f"part-{i}.jsonl", shuffled[i::files]) for i in range(files)]


def _run(tokenizer: str, inputs: list[Path], out: Path, *extra: str) -> Path:
    salt = out.parent / "salt"
    salt.write_text("a-salt-for-tests-that-is-long-enough")
    assert (
        anonymize(
            tokenizer,
            inputs,
            out,
            "--block-size",
            "2",
            "--emit-output-hashes",
            "--salt-file",
            str(salt),
            *extra,
        )
        == 0
    )
    return out


# The runs with worker processes take ~8 s each (CI runs them): the one-process split and order
# cases stay fast, and workers claiming every range once whatever the order is checked fast in
# tests/pipelines/test_local_engine.py
# (test_claims_take_every_range_once_whatever_the_order_workers_ask_in).
MULTI_PROCESS = pytest.mark.slow


@pytest.mark.parametrize(
    "files,processes,seed",
    [
        (1, 1, 1),
        pytest.param(2, 2, 2, marks=MULTI_PROCESS),
        pytest.param(3, 3, 3, marks=MULTI_PROCESS),
        (3, 1, 4),
    ],
)
def test_local_engine_bytes_depend_on_no_order_split_or_worker_count(
    tiny_tokenizer, tmp_path, files, processes, seed
):
    records = _records()
    reference = _run(
        tiny_tokenizer,
        [write_jsonl(tmp_path / "in.jsonl", records)],
        tmp_path / "reference",
        "--processes",
        "1",
    )
    inputs = _write_split(records, tmp_path / "split", files, seed)
    other = _run(tiny_tokenizer, inputs, tmp_path / "other", "--processes", str(processes))
    assert_same_output(reference, other)


@pytest.mark.slow
def test_beam_engine_writes_the_local_bytes_for_shuffled_split_input(tiny_tokenizer, tmp_path):
    records = _records()
    reference = _run(
        tiny_tokenizer,
        [write_jsonl(tmp_path / "in.jsonl", records)],
        tmp_path / "reference",
        "--processes",
        "1",
    )
    inputs = _write_split(records, tmp_path / "split", 3, 7)
    beam = _run(
        tiny_tokenizer,
        inputs,
        tmp_path / "beam",
        "--engine",
        "beam",
        "--direct_num_workers",
        "2",
        "--direct_running_mode",
        "multi_threading",
    )
    assert_same_output(reference, beam)


def _moved_within_granules(records: list[dict], seed: int) -> list[dict]:
    """The records, each but the earliest (the trace's origin) at another raw time inside its
    1000 ms granule: the finer times differ, the published ones do not."""
    rng, start = random.Random(seed), records[0]["timestamp"]
    moved = [records[0]]
    for record in records[1:]:
        granule = (record["timestamp"] - start + 500) // 1000
        offset = rng.randint(-499, 499) if granule else rng.randint(0, 499)
        moved.append({**record, "timestamp": start + 1000 * granule + offset})
    return moved


# Both engines' runs are whole (~8 s; CI runs them): rows within a granule publishing one time
# whatever their finer times is checked fast in tests/transforms/ids/test_row_order.py
# (test_rows_and_their_ids_follow_the_published_order_whatever_the_finer_times).
@pytest.mark.slow
@pytest.mark.parametrize("engine", ["local", "beam"])
def test_rows_within_a_granule_come_out_the_same_whatever_their_finer_times(
    tiny_tokenizer, tmp_path, engine
):
    """With --timestamp-granularity-ms 1000 the eight requests of each second share a published
    time: two logs that differ in the requests' times within those seconds (and in their input
    order and split) publish the same bytes, so no finer order is published."""
    coarse = ("--timestamp-granularity-ms", "1000")
    records = _records()
    reference = _run(
        tiny_tokenizer,
        [write_jsonl(tmp_path / "in.jsonl", records)],
        tmp_path / "reference",
        "--processes",
        "1",
        *coarse,
    )
    inputs = _write_split(_moved_within_granules(records, 5), tmp_path / "split", 3, 6)
    extra = (
        (
            "--engine",
            "beam",
            "--direct_num_workers",
            "2",
            "--direct_running_mode",
            "multi_threading",
        )
        if engine == "beam"
        else ("--processes", "2")
    )
    assert_same_output(reference, _run(tiny_tokenizer, inputs, tmp_path / engine, *extra, *coarse))
