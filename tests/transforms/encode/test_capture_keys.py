"""Engine hashes re-keyed with the salt (encode/captures.py), and the encoder's capture path:
the prefix structure kept, the engine's values gone, a block size it cannot re-cut refused."""

from __future__ import annotations

import json
import struct

import numpy as np

from helpers import dynamo_request_end, lmcache_lookup
from kvtrace.transforms.encode.blocks import chain_seed
from kvtrace.transforms.encode.captures import BLOCK_SIZE_MISMATCH, hash_capture, rekeyed
from kvtrace.transforms.encode.encode_requests import EncodeOptions, RequestEncoder
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.read.captures import DYNAMO, LMCACHE, Capture
from kvtrace.transforms.read.records import ParseOptions, parse_record

SEED = chain_seed(b"a salt of sixteen bytes or more")


def _capture(hashes: list[int], scheme: str = "s", tail: bytes | None = None) -> Capture:
    return Capture(scheme, 4, 4 * len(hashes), tuple(struct.pack("<Q", h) for h in hashes), tail)


def _keys(capture: Capture, seed: bytes = SEED) -> list[bytes]:
    data = rekeyed(capture, seed)
    return [data[i : i + 16] for i in range(0, len(data), 16)]


def test_equal_engine_hashes_get_equal_keys_and_others_differ():
    a, b = _keys(_capture([1, 2, 3])), _keys(_capture([1, 2, 9, 10]))
    assert a[:2] == b[:2] and a[2] != b[2]
    assert len(set(a + b)) == 5


def test_keys_depend_on_the_salt_and_the_scheme():
    capture = _capture([11, 12])
    assert _keys(capture) != _keys(capture, chain_seed(b"another salt, as long"))
    assert _keys(capture) != _keys(_capture([11, 12], scheme="other"))


def test_no_key_holds_its_engine_hash():
    hashes = [0x0123456789ABCDEF, 0xFEDCBA9876543210]
    data = rekeyed(_capture(hashes), SEED)
    for h in hashes:
        assert struct.pack("<Q", h) not in data and struct.pack(">Q", h) not in data


def test_a_tail_is_keyed_by_its_request_alone():
    one = _keys(_capture([5], tail=b"req-1"))
    two = _keys(_capture([5], tail=b"req-2"))
    assert len(one) == 2 and one[0] == two[0] and one[1] != two[1]


def _encoder(block_size: int) -> RequestEncoder:
    """The encoder as a --capture run opens it: no tokenizer."""
    options = EncodeOptions("", SaltSource("random", inline=b"x" * 32), block_size=block_size)
    return RequestEncoder(None, SEED, options)


def _request(record: dict, capture: str):
    return parse_record(json.dumps(record).encode(), "cap.jsonl", ParseOptions(capture=capture))


def test_the_encoder_hashes_captures_without_a_tokenizer():
    requests = [
        _request(dynamo_request_end(1_000, list(range(10)), 4, output_tokens=3), DYNAMO),
        _request(dynamo_request_end(2_000, list(range(6)), 4, output_tokens=1), DYNAMO),
    ]
    encoder = _encoder(4)
    rendered, failed = encoder.render(requests)
    batch, letters = encoder.hash(rendered, encoder.tokenize(rendered))
    assert not failed and not letters
    assert batch.requests["input_length"].tolist() == [10, 6]
    assert batch.requests["num_blocks"].tolist() == [3, 2]
    keys = [bytes(k) for k in batch.block_hashes.astype("<u8").view(np.uint8).reshape(-1, 16)]
    assert keys[0] == keys[3] and keys[1] != keys[4]  # a shared first block; the second differs
    assert encoder.take_cache_counts().segments == 0


def test_a_capture_at_another_block_size_is_refused_not_recut():
    request = _request(dynamo_request_end(1_000, list(range(10)), 4, output_tokens=3), DYNAMO)
    encoder = _encoder(8)
    rendered, _ = encoder.render([request])
    batch, letters = encoder.hash(rendered, encoder.tokenize(rendered))
    assert batch is None and [letter.reason for letter in letters] == [BLOCK_SIZE_MISMATCH]
    assert "4" in letters[0].message and "8" in letters[0].message


def test_an_lmcache_lookup_gets_a_block_per_token_block():
    request = _request(lmcache_lookup(3.0, "r", list(range(10)), 4), LMCACHE)
    hashed = hash_capture(request, SEED)
    assert hashed.input_length == 10 and len(hashed.block_hashes) == 3 * 16  # ceil(10 / 4)
    assert hashed.output_length == 0 and hashed.timestamp_ms == 3_000
