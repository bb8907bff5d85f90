"""Engine-compatible block hashes: Dynamo's and vLLM's, checked against vectors from the engines'
own code; the published ids do not depend on the scheme."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import replace

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms.encode.blocks import token_bytes
from kvtrace.transforms.encode.schemes import (
    HashScheme,
    dynamo_local_hashes,
    dynamo_sequence_hashes,
    vllm_block_hashes,
    vllm_int_hash,
    vllm_none_hash,
)

# From dynamo._core.compute_block_hash_for_seq (ai-dynamo-runtime 1.6.1), block size 4; Dynamo
# hashes full blocks only, so tokens 8, 9 (a partial block) have no vector.
DYNAMO_VECTORS = [
    (
        list(range(10)),
        [9143094415614847814, 12124091508212882195],
        [9143094415614847814, 9510318385840434533],
    ),
    (
        list(range(1, 9)),
        [14643705804678351452, 16777012769546811212],
        [14643705804678351452, 4945711292740353085],
    ),
]


@pytest.mark.parametrize("tokens,local,sequence", DYNAMO_VECTORS)
def test_dynamo_hashes_match_the_engines_vectors(tokens, local, sequence):
    data = token_bytes(tokens)
    assert dynamo_local_hashes(data, 4)[:2] == local
    assert dynamo_sequence_hashes(data, 4)[:2] == sequence


def test_the_partial_tail_is_hashed_by_the_same_function():
    data = token_bytes(list(range(10)))
    full = dynamo_sequence_hashes(data, 4)
    assert len(full) == 3
    # What Dynamo would give the tail had it been a full block of those tokens.
    assert full[2] == dynamo_sequence_hashes(token_bytes(list(range(8)) + [8, 9]), 4)[2]


def vllm_reference(tokens: list[int], block_size: int, none_hash: bytes) -> list[bytes]:
    """vllm/v1/core/kv_cache_utils.hash_block_tokens with sha256_cbor, written out from its
    source: sha256(cbor2.dumps((parent or NONE_HASH, tuple(block tokens), extra_keys),
    canonical=True)), full blocks, extra_keys None for a plain text request."""
    parent, out = none_hash, []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = tuple(tokens[start : start + block_size])
        parent = hashlib.sha256(cbor2.dumps((parent, block, None), canonical=True)).digest()
        out.append(parent)
    return out


@given(st.lists(st.integers(0, 2**32 - 1), max_size=40), st.integers(1, 8))
def test_vllm_hashes_follow_its_definition(tokens, block_size):
    none_hash = vllm_none_hash("0")
    ours = vllm_block_hashes(token_bytes(tokens), block_size, none_hash)
    full = len(tokens) // block_size
    assert ours[:full] == vllm_reference(tokens, block_size, none_hash)
    assert len(ours) == -(-len(tokens) // block_size)


def test_vllm_none_hash_is_sha256_cbor_of_the_seed_string():
    assert vllm_none_hash("0") == hashlib.sha256(cbor2.dumps("0", canonical=True)).digest()
    digest = bytes(range(32))
    assert vllm_int_hash(digest) == struct.unpack(">Q", digest[24:])[0]


def test_raw_engine_keys_carry_the_engine_hash():
    """Only a run writing them out (--emit-block-hashes) keeps the engine's hashes as keys."""
    data = token_bytes(list(range(10)))
    keys = HashScheme("dynamo", raw=True).block_keys(data, 4, b"")
    assert [struct.unpack_from("<Q", keys, 16 * i)[0] for i in range(3)] == dynamo_sequence_hashes(
        data, 4
    )
    with pytest.raises(ValueError, match="only an engine hash scheme"):
        HashScheme(raw=True)
    with pytest.raises(ValueError, match="NONE_HASH"):
        HashScheme("vllm-sha256-cbor")
    assert (
        HashScheme("vllm-sha256-cbor", b"\0" * 32).identity
        != HashScheme("vllm-sha256-cbor", b"\1" * 32).identity
    )


@pytest.mark.parametrize(
    "scheme", [HashScheme("dynamo"), HashScheme("vllm-sha256-cbor", b"\0" * 32)], ids=str
)
def test_engine_keys_are_keyed_by_the_salt_and_number_as_the_engine_hashes_do(scheme):
    """An id map keeps keys: without the salt's chain seed none is the engine's hash a guessed
    prompt gives, and another seed gives others; equal engine hashes still give equal keys, so
    the dense ids (first occurrence) are those the raw hashes give."""
    prompts = [list(range(10)), list(range(8)) + [7, 7], list(range(1, 9))]
    raw = replace(scheme, raw=True)
    keyed = [scheme.block_keys(token_bytes(p), 4, b"seed-one") for p in prompts]
    plain = [raw.block_keys(token_bytes(p), 4, b"seed-one") for p in prompts]
    hashes = {k[i : i + 8] for k in plain for i in range(0, len(k), 16)}
    halves = {k[i : i + 8] for k in keyed for i in range(0, len(k), 8)}
    assert hashes and not hashes & halves
    assert keyed[0] != scheme.block_keys(token_bytes(prompts[0]), 4, b"seed-two")

    def firsts(keys: list[bytes]) -> list[int]:
        ids: dict[bytes, int] = {}
        return [ids.setdefault(k[i : i + 16], len(ids)) for k in keys for i in range(0, len(k), 16)]

    assert firsts(keyed) == firsts(plain) and len(set(firsts(plain))) < len(firsts(plain))
    assert scheme.map_identity != raw.map_identity == raw.identity == scheme.identity
