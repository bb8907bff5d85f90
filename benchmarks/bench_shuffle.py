"""Bytes that each shuffle of the Beam pipeline carries, per block occurrence (issue 10, item 4).

Runs the anonymize pipeline in process on a night of token-id requests (as bench_id_map.py
writes them), optionally against a map of --map-ids random ids, and reads the pipeline's
kvtrace/shuffled_bytes_* counters (transforms/steps.py `metered`): the payload entering each
GroupByKey, CoGroupByKey and keyed CombinePerKey (before Beam's combiner lifting, which shrinks
the first). Coders add a few bytes of framing per element on top.

    python benchmarks/bench_shuffle.py --tokenizer ../shared/tokenizers/deepseek-r1
    python benchmarks/bench_shuffle.py --tokenizer ../shared/tokenizers/deepseek-r1 \\
        --map-ids 1000000
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench_id_map import SALT, write_map, write_night

N_BLOCKS = 300_000
BLOCK_SIZE = 16


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--map-ids", type=int, default=0)
    args = parser.parse_args()

    import apache_beam as beam
    from apache_beam.metrics.metric import MetricsFilter
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    from kvtrace.pipelines.anonymize_beam import AnonymizeConfig, build
    from kvtrace.pipelines.anonymize_config import IdMapRun
    from kvtrace.transforms.encode.blocks import HASH_SCHEME, salt_fingerprint
    from kvtrace.transforms.encode.salt import salt_source
    from kvtrace.transforms.encode.tokenize import (
        load_tokenizer,
        tokenization_fingerprint,
        tokenizer_sha256,
    )
    from kvtrace.transforms.ids.id_map import MapIdentity, map_key, open_map
    from kvtrace.transforms.read.paths import file_sizes

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "salt").write_bytes(SALT)
        night = work / "night.jsonl"
        write_night(night, N_BLOCKS, BLOCK_SIZE, shared_blocks=0, prefixes=1, seed=1)
        id_map = None
        if args.map_ids:
            identity = MapIdentity(
                salt_fingerprint(SALT),
                BLOCK_SIZE,
                tokenizer_sha256(args.tokenizer),
                HASH_SCHEME,
                {},
                tokenization_fingerprint(load_tokenizer(args.tokenizer)),
            )
            write_map(work / "map", args.map_ids, identity)
            id_map = IdMapRun(
                str(work / "map"),
                open_map(str(work / "map"), identity, map_key(SALT)),
                str(work / "marks"),
            )
        config = AnonymizeConfig(
            inputs=tuple(file_sizes([str(night)])),
            output=str(work / "out"),
            staging=str(work / "staging"),
            tokenizer=args.tokenizer,
            salt=salt_source(str(work / "salt")),
            dead_letter=str(work / "rejected"),
            block_size=BLOCK_SIZE,
            id_map=id_map,
        )
        pipeline = beam.Pipeline(runner=FnApiRunner())
        build(pipeline, config)
        result = pipeline.run()
        result.wait_until_finish()
        blocks = json.loads((work / "out" / "stats.json").read_text())["blocks"]
    counters = result.metrics().query(MetricsFilter().with_namespace("kvtrace"))["counters"]
    by_step: dict[str, int] = {}  # summed over the block and the session id steps
    for counter in counters:
        name = counter.key.metric.name
        if name.startswith("shuffled_bytes_"):
            step = name.removeprefix("shuffled_bytes_")
            by_step[step] = by_step.get(step, 0) + counter.committed
    print(
        json.dumps(
            {
                "block_occurrences": blocks,
                "map_ids": args.map_ids,
                "bytes_per_block_occurrence": {
                    step: round(b / blocks, 2) for step, b in sorted(by_step.items())
                },
                "total_bytes_per_block_occurrence": round(sum(by_step.values()) / blocks, 2),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
