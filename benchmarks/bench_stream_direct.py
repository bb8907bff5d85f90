"""The stream (its id map in --id-shards keys) against the batch local engine on the same
requests, on Beam's DirectRunner, whole process: requests of one-hour windows (a backlog, every
request in at once, then the watermark to the end), or the same requests as a JSONL file
through `kvtrace anonymize` (the local engine). Measure each with /usr/bin/time, paired:

    python benchmarks/bench_stream_direct.py corpus --requests 4000 --hours 4 --out /tmp/c.jsonl
    /usr/bin/time -f "%U %S %M" python benchmarks/bench_stream_direct.py stream \
        --corpus /tmp/c.jsonl --tokenizer DIR --id-shards 4 --work /tmp/s
    /usr/bin/time -f "%U %S %M" kvtrace anonymize --input /tmp/c.jsonl --tokenizer DIR \
        --block-size 16 --output /tmp/b
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

HOUR_MS = 3_600_000
START_MS = 1_767_225_600_000  # 2026-01-01


def corpus(args: argparse.Namespace) -> None:
    """Chats of 8 sessions sharing a system prompt, spread evenly over --hours."""
    with open(args.out, "w") as out:
        for i in range(args.requests):
            record = {
                "timestamp": START_MS + i * args.hours * HOUR_MS // args.requests,
                "session_id": f"s{i % 8}",
                "output_length": 50,
                "messages": [
                    {"role": "system", "content": "You answer questions about caches. " * 20},
                    {
                        "role": "user",
                        "content": f"Question {i}: how does prefix caching help " * (1 + i % 16),
                    },
                ],
            }
            out.write(json.dumps(record) + "\n")


def stream(args: argparse.Namespace) -> None:
    import apache_beam as beam

    class Message(beam.DoFn):
        """A line number in, that line of the corpus out."""

        def __init__(self, corpus: str):
            self._corpus = corpus

        def setup(self) -> None:
            self._lines = Path(self._corpus).read_bytes().splitlines()

        def process(self, number: int):
            yield self._lines[number]

    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
    from apache_beam.testing.test_stream import TestStream

    from kvtrace.pipelines.anonymize_config import AnonymizeConfig
    from kvtrace.pipelines.anonymize_streaming import StreamingConfig, build
    from kvtrace.transforms.encode.salt import SaltSource
    from kvtrace.transforms.encode.tokenize import tokenizer_sha256

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    for name in ("stream", "staging"):
        (work / name).mkdir(parents=True)
    job = AnonymizeConfig(
        inputs=(),
        output=str(work / "stream"),
        staging=str(work / "staging"),
        tokenizer=args.tokenizer,
        salt=SaltSource("random", inline=b"a benchmark salt, thirty-two bytes or more"),
        dead_letter=str(work / "stream-rejected"),
        tokenizer_sha256=tokenizer_sha256(args.tokenizer),
        block_size=args.block_size,
    )
    config = StreamingConfig(
        job, "pubsub:projects/p/subscriptions/s", HOUR_MS, 0, 10_000, args.id_shards
    )
    # The stream's elements are line numbers, each read back as its message: a TestStream holding
    # the messages themselves is pickled and bz2-compressed with the graph (~3 CPU-s at 25 MB).
    count = len(Path(args.corpus).read_bytes().splitlines())
    events = TestStream().add_elements(list(range(count))).advance_watermark_to_infinity()
    with beam.Pipeline(
        runner=BundleBasedDirectRunner(), options=PipelineOptions(["--streaming"])
    ) as pipeline:
        build(pipeline | events | beam.ParDo(Message(args.corpus)), config)
    totals = json.loads((work / "stream" / "cumulative.json").read_text())
    print(f"{totals['windows']} windows, {totals['rows']} rows, {totals['unique_blocks']} ids")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("corpus")
    make.add_argument("--requests", type=int, default=4000)
    make.add_argument("--hours", type=int, default=4)
    make.add_argument("--out", required=True)
    run = commands.add_parser("stream")
    run.add_argument("--corpus", required=True)
    run.add_argument("--tokenizer", required=True)
    run.add_argument("--id-shards", type=int, default=4)
    run.add_argument("--block-size", type=int, default=16)
    run.add_argument("--work", required=True)
    args = parser.parse_args()
    corpus(args) if args.command == "corpus" else stream(args)


if __name__ == "__main__":
    main()
