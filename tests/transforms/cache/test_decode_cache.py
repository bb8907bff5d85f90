"""Output blocks: --emit-output-hashes numbers the blocks an engine caches after decoding, and
simulate --decode-cache lets later turns hit them."""

from __future__ import annotations

import pytest

from helpers import write_jsonl
from kvtrace.pipelines.simulate import SimulateConfig, run_simulate
from kvtrace.transforms.cache.capacity import Capacity
from kvtrace.transforms.encode.blocks import chain_hashes, chain_seed, token_bytes
from kvtrace.transforms.encode.encode_requests import _output_block_hashes
from kvtrace.transforms.encode.schemes import HashScheme

SEED = chain_seed(b"a salt for the output block tests")


def test_output_blocks_complete_the_prompt_and_chain_on():
    prompt, output = token_bytes(list(range(10))), token_bytes(list(range(100, 110)))
    whole = chain_hashes(prompt + output, 4, SEED)  # 5 blocks of 4 tokens
    out = _output_block_hashes(prompt, output, 4, SEED, HashScheme())
    assert out == whole[2 * 16 :]  # blocks 2, 3, 4: the partial prompt block completed, then on
    assert _output_block_hashes(prompt, token_bytes([1]), 4, SEED, HashScheme()) == b""


def test_simulate_counts_hits_on_cached_outputs(tmp_path):
    rows = [
        {
            "timestamp": 0,
            "input_length": 8,
            "output_length": 4,
            "hash_ids": [0, 1],
            "output_hash_ids": [2],
        },
        {
            "timestamp": 5,
            "input_length": 16,
            "output_length": 1,
            "hash_ids": [0, 1, 2, 3],
            "output_hash_ids": [],
        },
    ]
    src = str(write_jsonl(tmp_path / "t.jsonl", rows))
    rates = {}
    for decode in (False, True):
        report = run_simulate(
            SimulateConfig(
                (src,), (Capacity(1000, None),), ("lru", "belady"), 4, decode_cache=decode
            )
        )
        rates[decode] = report
        assert report["rows"] == 2 and report["prompt_tokens"] == 24
    assert rates[False]["infinite_cache"]["token_weighted"] == pytest.approx(8 / 24)
    assert rates[True]["infinite_cache"]["token_weighted"] == pytest.approx(12 / 24)
    assert rates[True]["policies"]["lru"][0]["hit_rate"] == pytest.approx(12 / 24)
    with pytest.raises(ValueError, match="--emit-output-hashes"):
        plain = write_jsonl(
            tmp_path / "p.jsonl",
            [{k: v for k, v in r.items() if k != "output_hash_ids"} for r in rows],
        )
        run_simulate(
            SimulateConfig((str(plain),), (Capacity(1000, None),), ("lru",), 4, decode_cache=True)
        )


def test_a_line_of_more_containers_than_a_row_is_never_parsed(tmp_path):
    """The trace reader counts such a line malformed before parsing it; the output-id reader
    skips it by the same rule (json_tree.containers_over), not after ~64 bytes per bracket."""
    import tracemalloc

    from kvtrace.transforms.cache.decode_cache import _output_ids

    path = tmp_path / "t.jsonl"
    junk = ",".join(["[]"] * 1_000_000)
    path.write_text(
        '{"timestamp": 0, "input_length": 4, "output_length": 4, "hash_ids": [0], '
        f'"output_hash_ids": [1], "junk": [{junk}]}}\n'
        '{"timestamp": 1, "input_length": 4, "output_length": 4, "hash_ids": [0], '
        '"output_hash_ids": [2]}\n'
    )
    tracemalloc.start()
    try:
        assert list(_output_ids(str(path))) == [(2, [2])]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20  # the 3 MB line held once or twice; parsed, ~64 MB
