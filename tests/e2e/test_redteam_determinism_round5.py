"""Red team round 5 (rt5-det): determinism. Each test asserts a promise and fails today."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from helpers import WORDS, anonymize_night, chat, write_jsonl

pytestmark = pytest.mark.slow

SALT = b"keyed-map-test-salt-of-32-bytes!"
ZERO = 1_700_000_000_000


def _night(folder: Path, files: int, seed: int) -> list[Path]:
    records = []
    for i in range(24):
        record = chat(i, ZERO + 1_000 + 611 * i, f"user-{i % 5}")
        words = random.Random(i).sample(WORDS, len(WORDS))
        record["messages"][1]["content"] = " ".join(words * 2)
        records.append(record)
    random.Random(seed).shuffle(records)
    folder.mkdir()
    return [write_jsonl(folder / f"part-{k}.jsonl", records[k::files]) for k in range(files)]


def test_the_same_night_gives_the_same_id_map_bytes(tiny_tokenizer, tmp_path):
    """Promise: same input and config give byte-identical output, the id map included, whatever
    the split or worker count; docs/ID_MAP.md ('Version record') and id_map.map_id_of derive
    the map id 'not drawn at random, so the same nights give the same map (bytes) on every
    engine (determinism)'. The map id is the same, but every record lists its segment files
    under segments/NNNNNN-RUNID/, RUNID uuid4 (id_map.new_run_id, AnonymizeConfig.run_id), and
    records their paths in `files` and `checksums`: version 1's record (and so every later
    record's previous_sha256, and the marks' record_sha256) differs from run to run. Twin maps
    of one night are 'one map' to the marks, yet never the same bytes: the second's mark names
    another record."""
    (tmp_path / "salt").write_bytes(SALT)
    maps = []
    for name, files, processes in (("one", 1, "1"), ("split", 3, "2")):
        inputs = _night(tmp_path / f"in-{name}", files, len(name))
        assert (
            anonymize_night(
                tiny_tokenizer,
                inputs,
                tmp_path / f"out-{name}",
                "--id-map",
                str(tmp_path / f"map-{name}"),
                "--id-map-marks",
                str(tmp_path / f"marks-{name}"),
                "--salt-file",
                str(tmp_path / "salt"),
                "--processes",
                processes,
            )
            == 0
        )
        maps.append(tmp_path / f"map-{name}")
    records = [(m / "versions" / "000001.json").read_bytes() for m in maps]
    listings = [sorted(str(p.relative_to(m)) for p in m.rglob("*") if p.is_file()) for m in maps]
    assert records[0] == records[1] and listings[0] == listings[1], (
        f"the same night gave two maps of other bytes: {listings[0][:3]} vs {listings[1][:3]}"
    )


def _turns(day: int) -> list[dict]:
    """A night of chat turns with answers: new prompt blocks every night, answers that recur."""
    records = []
    for i in range(25):
        words = random.Random(day * 7 + i % 6).sample(WORDS, 4)
        record = {
            "timestamp": ZERO + day * 86_400_000 + 800 * i,
            "output_length": 6,
            "messages": [
                {"role": "system", "content": "a shared system prompt about caches"},
                {"role": "user", "content": " ".join(words)},
            ],
            "output": " ".join(random.Random(i % 5).sample(WORDS, 6)),
        }
        if i % 2:
            record["session_id"] = f"s{i % 3}"
        records.append(record)
    return records


def test_nights_on_a_map_give_what_one_run_over_them_gives_with_output_blocks(
    tiny_tokenizer, tmp_path
):
    """Promise (docs/NIGHTLY.md): 'night 1 and night 2, one after the other, give byte
    for byte what one run over both nights gives'; same input and config, same bytes, whatever
    the split. With --emit-output-hashes (a documented flag of the same runs) they do not:
    output-only blocks are 'numbered after every prompt block' of the RUN (docs/ANALYSIS.md
    'Output blocks'), so night 1's answers take ids right after night 1's prompt blocks, while the one
    run numbers them after both nights' prompt blocks: every output_hash_ids differs (the
    first row's answer is [18, 19] in night 1, [32, 33] in the single run). The split of a log
    into nights changes the published ids."""
    from helpers import anonymize, trace_bytes

    (tmp_path / "salt").write_bytes(SALT)
    common = ["--block-size", "4", "--salt-file", str(tmp_path / "salt"), "--emit-output-hashes"]
    for day in range(2):
        night = write_jsonl(tmp_path / f"night{day}.jsonl", _turns(day))
        assert (
            anonymize(
                tiny_tokenizer,
                [night],
                tmp_path / f"out{day}",
                "--id-map",
                str(tmp_path / "map"),
                *common,
            )
            == 0
        )
    both = write_jsonl(tmp_path / "both.jsonl", _turns(0) + _turns(1))
    assert anonymize(tiny_tokenizer, [both], tmp_path / "both", *common) == 0
    nights = trace_bytes(tmp_path / "out0") + trace_bytes(tmp_path / "out1")
    one = trace_bytes(tmp_path / "both")
    assert nights == one, (
        f"night 1's first row {nights.splitlines()[0]!r}, one run's {one.splitlines()[0]!r}"
    )


STREAM_SALT = "a-streaming-test-salt-0123456789abcdef"
STREAM_ZERO = 1_767_225_600_000  # 2026-01-01
MINUTE = 60_000


def _stream(tmp_path: Path, tokenizer: str, batches: list[list[dict]], **job: object) -> Path:
    """The streaming pipeline on a TestStream (as tests/pipelines/test_anonymize_streaming.py
    drives it): each batch added in turn; returns the stream's output folder."""
    import json

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
    from apache_beam.testing.test_stream import TestStream

    from kvtrace.pipelines.anonymize_config import AnonymizeConfig
    from kvtrace.pipelines.anonymize_streaming import StreamingConfig, build
    from kvtrace.transforms.encode.salt import SaltSource

    output = tmp_path / "stream"
    output.mkdir()
    (tmp_path / "staging").mkdir()
    config = AnonymizeConfig(
        inputs=(),
        output=str(output),
        staging=str(tmp_path / "staging"),
        tokenizer=tokenizer,
        salt=SaltSource("env", "KVTRACE_SALT"),
        dead_letter=str(tmp_path / "stream-rejected"),
        block_size=4,
        **job,
    )
    stream = TestStream()
    for batch in batches:
        stream = stream.add_elements([json.dumps(r).encode() for r in batch])
    stream = stream.advance_watermark_to_infinity()
    with beam.Pipeline(
        runner=BundleBasedDirectRunner(), options=PipelineOptions(["--streaming"])
    ) as pipeline:
        build(
            pipeline | stream,
            StreamingConfig(config, "pubsub:projects/p/subscriptions/s", MINUTE, 0, 10_000),
        )
    return output


def test_a_streams_windows_with_output_blocks_are_the_batch_output(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise (docs/STREAMING.md, 'Running a stream'): 'with nothing late the windows
    concatenated are, byte for byte, the batch output of the same requests', each window 'a
    night of the batch job'. With emit_output_hashes (--emit-output-hashes) they are not: each
    window numbers its answers' output-only blocks after ITS prompt blocks (dense_ids.block_keys:
    output blocks seen OUTPUT_TS_OFFSET later), then the next window's new prompt blocks come
    after those, while the batch job numbers every prompt block of the input first. Three
    one-minute windows of chat turns with answers, nothing late, no dead letter: the first row's
    output_hash_ids already differ, and every later window's prompt ids too."""

    from helpers import write_jsonl
    from kvtrace.cli import main

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "again", "hello"]
    records = []
    for i in range(30):
        record = {
            "timestamp": STREAM_ZERO + 9_000 * (i // 2) + 3 * (i % 2),
            "output_length": 5,
            "messages": [
                {"role": "system", "content": "a shared system prompt about caches"},
                {"role": "user", "content": " ".join(random.Random(i).sample(words, 5))},
            ],
            "output": " ".join(random.Random(i % 4).sample(words, 5)),
        }
        if i % 3 == 0:
            record["session_id"] = f"s{i % 4}"
        records.append(record)
    output = _stream(
        tmp_path,
        tiny_tokenizer,
        [records[:14], records[14:28], records[28:]],
        emit_output_hashes=True,
    )
    letters = [
        line
        for p in (tmp_path / "stream-rejected").rglob("*.jsonl")
        for line in p.read_text().splitlines()
    ]
    streamed = b"".join(p.read_bytes() for p in sorted(output.glob("window-*/trace-*.jsonl")))
    batch = write_jsonl(tmp_path / "batch.jsonl", records)
    assert (
        main(
            [
                "anonymize",
                "--input",
                str(batch),
                "--tokenizer",
                tiny_tokenizer,
                "--block-size",
                "4",
                "--output",
                str(tmp_path / "batch"),
                "--emit-output-hashes",
            ]
        )
        == 0
    )
    expected = b"".join(p.read_bytes() for p in sorted((tmp_path / "batch").glob("trace-*.jsonl")))
    assert len(list(output.glob("window-*"))) == 3 and not letters
    assert streamed == expected, (
        f"stream's first row {streamed.splitlines()[0]!r}, batch's {expected.splitlines()[0]!r}"
    )
