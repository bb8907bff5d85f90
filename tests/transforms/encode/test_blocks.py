import numpy as np
import pytest

from kvtrace.transforms.encode.blocks import (
    DIGEST_SIZE,
    block_count,
    chain_hashes,
    chain_seed,
    keyed_digest,
    last_block_tokens,
    request_chain_seed,
    salt_fingerprint,
    shared_length,
    token_bytes,
)

SEED = chain_seed(b"a test salt of 32 bytes or so...")


def hashes(ids, block_size=4, seed=SEED):
    blob = chain_hashes(token_bytes(ids), block_size, seed)
    return [blob[i : i + DIGEST_SIZE] for i in range(0, len(blob), DIGEST_SIZE)]


def test_block_count_includes_the_partial_last_block():
    assert [block_count(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    assert [last_block_tokens(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 4, 1, 4, 1]


def test_one_hash_per_block():
    assert len(hashes(range(9))) == 3
    assert hashes([]) == []


def test_shared_prefix_gives_shared_hashes_then_diverges_for_good():
    a = hashes([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    b = hashes([1, 2, 3, 4, 5, 6, 7, 0, 9, 10, 11, 12])
    assert a[0] == b[0]
    # Block 2 is identical in both, but its parent differs: chained hashes keep them apart.
    assert a[1] != b[1] and a[2] != b[2]


def test_partial_block_differs_from_full_block_with_same_leading_tokens():
    assert hashes([1, 2, 3])[0] != hashes([1, 2, 3, 0])[0]


def test_salt_keys_every_hash():
    other = chain_seed(b"another salt, also long enough..")
    assert not set(hashes([1, 2, 3, 4, 5], seed=SEED)) & set(hashes([1, 2, 3, 4, 5], seed=other))


def test_hashes_are_stable_across_processes_and_machines():
    # xxh3-128 over little-endian uint32 tokens is fully specified, unlike Python's hash().
    assert hashes([1, 2, 3, 4], seed=b"\0" * 16)[0].hex() == "4e7b4f6b8cadfb2a1b1a20c2457494c4"


def test_salt_fingerprint_does_not_reveal_the_chain_seed():
    salt = b"x" * 16
    assert len(salt_fingerprint(salt)) == 16
    assert salt_fingerprint(salt) not in chain_seed(salt).hex()


def test_keyed_digest_depends_on_salt_and_value():
    assert keyed_digest("s1", SEED) != keyed_digest("s2", SEED)
    assert keyed_digest("s1", SEED) != keyed_digest("s1", chain_seed(b"other salt value!!"))


def test_token_bytes_are_little_endian_uint32_from_lists_and_arrays():
    import numpy as np

    assert token_bytes([1, 258]) == b"\x01\x00\x00\x00\x02\x01\x00\x00"
    assert token_bytes(np.array([1, 258], dtype=np.int64)) == token_bytes([1, 258])


def test_a_requests_chain_seed_is_the_runs_keyed_by_its_cache_salt():
    """No cache salt: the run's seed itself (hashes as before); a salt: a seed of its own,
    which another run's salt or another cache salt never gives."""
    run, other = chain_seed(b"r" * 32), chain_seed(b"o" * 32)
    assert request_chain_seed(run, None) == run
    seeds = {request_chain_seed(s, c) for s in (run, other) for c in (b"a", b"b")}
    assert len(seeds | {run, other}) == 6
    assert request_chain_seed(run, b"a") == request_chain_seed(run, b"a")


@pytest.mark.parametrize(
    ("first", "second", "shared"),
    [([1, 2, 3], [1, 2, 4], 2), ([1, 2], [1, 2, 3], 2), ([], [1], 0), ([5], [6], 0)],
)
def test_shared_length_is_the_leading_elements_two_arrays_share(first, second, shared):
    a, b = np.array(first, dtype=np.uint32), np.array(second, dtype=np.uint32)
    assert shared_length(a, b) == shared_length(b, a) == shared
