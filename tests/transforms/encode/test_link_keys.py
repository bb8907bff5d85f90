"""The keys links are joined by (encode/hashed_batch.py): keyed, scoped where ids recur, and
carried by the batch with each request through select and concat."""

from __future__ import annotations

import numpy as np

from kvtrace.transforms.encode.hashed_batch import (
    LINK_SIZE,
    NO_LINK,
    HashedBatch,
    HashedRequest,
    link_key,
    link_keys,
    links_digest,
)

SEED, OTHER_SEED = b"s" * 32, b"t" * 32


def test_call_ids_join_within_a_session_response_ids_across():
    call, response = "call:call_0", "response:resp_1"
    assert link_key("a", call, SEED) != link_key("b", call, SEED)  # clients reuse call_0
    assert link_key(None, call, SEED) is None  # nor is a sessionless conversation's call_0 one
    assert link_key("a", response, SEED) == link_key(None, response, SEED)  # a forked session
    assert link_key("a", call, SEED) != link_key("a", call, OTHER_SEED)  # keyed by the salt
    assert NO_LINK not in {link_key(s, call, SEED) for s in map(str, range(200))}


def test_no_session_and_link_run_into_one_another():
    """Ids may hold NUL: a session and the link it scopes are encoded each length first, so no
    session's call meets another's, nor a response id a call of a session named like it."""
    assert link_key("a\0call:x", "call:y", SEED) != link_key("a", "call:x\0call:y", SEED)
    assert link_key("\0response:r", "call:c", SEED) != link_key(None, "response:r\0call:c", SEED)


def test_a_sessionless_requests_call_links_are_keyed_to_nothing():
    """A request in no session links only by response id: its calls name nothing and a tool
    result it holds continues nothing."""
    response, call = "response:resp_1", "call:call_0"
    assert link_keys(None, call, (response, call), SEED) == (
        NO_LINK,
        link_key(None, response, SEED).to_bytes(LINK_SIZE, "little"),
    )
    parent, named = link_keys("s", call, (response, call), SEED)
    assert parent == link_key("s", call, SEED) and len(named) == 2 * LINK_SIZE


def test_the_tie_digest_does_not_depend_on_the_salt_and_is_none_without_links():
    assert links_digest(None, ()) == 0
    assert links_digest("response:r", ("call:c",)) != links_digest(None, ("response:r", "call:c"))


def test_the_tie_digest_keeps_links_apart_whatever_characters_they_hold():
    """An id may hold NUL (JSON \\u0000): no separator keeps links apart, their lengths do."""
    nul = "response:resp_a\0call:c"
    assert links_digest(nul, ()) != links_digest("response:resp_a", ("call:c",))
    assert links_digest(None, (nul,)) != links_digest(None, ("response:resp_a", "call:c"))
    assert links_digest("", ()) != links_digest(None, ("",)) != links_digest(None, ())


def request(ts: int, parent: int, links: list[int]) -> HashedRequest:
    return HashedRequest(
        timestamp_ms=ts,
        fingerprint=ts,
        input_length=1,
        output_length=1,
        block_hashes=b"\0" * 16,
        session_key=None,
        parent_key=parent,
        link_keys=np.array(links, "<u8").tobytes(),
    )


def test_each_requests_links_stay_with_it():
    batch = HashedBatch.pack([request(0, NO_LINK, [5, 6]), request(1, 5, []), request(2, 6, [7])])
    assert batch.requests["num_links"].tolist() == [2, 0, 1]
    kept = batch.select(np.array([False, True, True]))
    assert kept.requests["parent_key"].tolist() == [5, 6] and kept.links.tolist() == [7]
    both = HashedBatch.concat([kept, batch])
    assert both.links.tolist() == [7, 5, 6, 7]
