"""The tie-break fingerprint's one encoder (encode/fingerprint.py): two different requests, text
or capture, never feed it the same bytes, so no field is left out or runs into another."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.encode.blocks import token_bytes
from kvtrace.transforms.encode.fingerprint import fingerprint, fingerprint_bytes

# Few, short values of few symbols, the separators and markers an ambiguous encoding would use
# among them, so values that run together across a field's edge are drawn often.
_BLOBS = st.sampled_from([b"", b"\0", b"\1", b"s", b"\0\0", b"\0s", b"s\0", b"\1\0"])
_TEXTS = st.sampled_from(["", "\0", "s", "\0s", "s\0", "\udc80"])
_SMALL = st.integers(0, 2)
REQUESTS = st.tuples(
    st.none() | _TEXTS,  # scheme: None for token ids
    st.integers(1, 2),
    st.lists(_BLOBS, max_size=3).map(tuple),
    st.none() | _BLOBS,
    _SMALL,
    _SMALL,
    st.none() | _TEXTS,
    st.none() | _BLOBS,
)


@settings(max_examples=300, deadline=None)
@given(REQUESTS, REQUESTS)
def test_different_requests_never_feed_the_fingerprint_the_same_bytes(one, other):
    """Every mix of two requests' fields (each field from one or the other): requests that differ
    in any one field, or in a value moved between any two, are all among them."""
    mixes = {
        tuple(b if pick >> i & 1 else a for i, (a, b) in enumerate(zip(one, other)))
        for pick in range(1 << len(one))
    }
    assert len({fingerprint_bytes(*request) for request in mixes}) == len(mixes)


def test_the_ties_of_the_text_and_capture_encodings_it_replaced_are_told_apart():
    """Each pair fed the digests kvtrace used before the one encoder the same bytes."""
    text = (None, 4, (token_bytes([5, 0]),), None, 2, 1, "s")
    shorter = (None, 4, (token_bytes([5]),), None, 1, 1, "\0\0\0\0s")
    hashes = (b"\7" * 8, b"\x08" * 8)
    unkeyed = ("dynamo-xxh3-64-seed1337", 4, hashes, None, 8, 3, None)
    keyed = ("blake3-keyed-chain64-v1:k0", 4, hashes, None, 8, 3, None)
    runs_on = ("lmcache-lookup-hashes", 4, (b"0x1",), b"ax\0" + b"1.0\0" + b"5", 5, 0, None)
    runs_in = ("lmcache-lookup-hashes", 4, (b"0x1a",), b"x\0" + b"1.0\0" + b"5", 5, 0, None)
    no_session = (None, 4, (token_bytes([5]),), None, 1, 1, None)
    empty_session = (None, 4, (token_bytes([5]),), None, 1, 1, "")
    for one, other in (
        (text, shorter),
        (unkeyed, keyed),
        (runs_on, runs_in),
        (no_session, empty_session),
    ):
        assert fingerprint(*one) != fingerprint(*other)
