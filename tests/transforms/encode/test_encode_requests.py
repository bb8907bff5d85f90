"""encode_requests.hash_request's fingerprint: the private tie-break of rows equal in all they
publish (row_order.py), so it must cover everything a row's ids are made of."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms.encode.blocks import chain_seed, token_bytes
from kvtrace.transforms.encode.encode_requests import hash_request
from kvtrace.transforms.encode.hashed_batch import HashedBatch
from kvtrace.transforms.encode.schemes import HashScheme
from kvtrace.transforms.ids.dense_ids import block_keys, dense_ids, session_keys
from kvtrace.transforms.read.records import Request
from kvtrace.transforms.write.rows import row_batch

SEED = chain_seed(b"fingerprint test salt of 32 byte")
BLOCK = 2


def _hashed(prompt: list[int], answer: list[int] | None, response_ms: int | None = None):
    request = Request("log", b"", 1_000, "tokens", response_ms=response_ms)
    output = None if answer is None else token_bytes(answer)
    return hash_request(request, token_bytes(prompt), 4, BLOCK, SEED, output_data=output)


def test_the_fingerprint_covers_hashed_answers_only():
    """Answers hashed (--emit-output-hashes) tell two requests apart; without the flag, or with
    an empty answer (no ids), the fingerprint is the prompt's, output length's and session's."""
    one, other = _hashed([1, 2, 3], [4, 5, 6, 7]), _hashed([1, 2, 3], [7, 6, 5, 4])
    assert one.fingerprint != other.fingerprint
    assert _hashed([1, 2, 3], None).fingerprint == _hashed([1, 2, 3], []).fingerprint
    assert _hashed([1, 2, 3], None, 5).fingerprint == _hashed([1, 2, 3], None, 9).fingerprint


def test_a_prompt_and_a_session_never_run_together():
    """Prompt [5, 0] of session "s" and prompt [5] of session "\\0\\0\\0\\0s" hold different
    ids and sessions: they do not tie (the digest before fingerprint.py fed both the same
    bytes), nor does a request of no session with one of the empty session."""
    rows = [
        hash_request(
            Request("log", b"", 1_000, "tokens", session=session), token_bytes(p), 0, BLOCK, SEED
        )
        for p, session in (([5, 0], "s"), ([5], "\0\0\0\0s"), ([5], None), ([5], ""))
    ]
    assert len({row.fingerprint for row in rows}) == 4


def test_the_fingerprint_is_alike_under_every_hash_scheme():
    """Published ids do not depend on --hash-scheme, so neither does the order of tied rows."""
    data, request = token_bytes([1, 2, 3]), Request("log", b"", 1_000, "tokens")
    schemes = (HashScheme(), HashScheme("dynamo"), HashScheme("vllm-sha256-cbor", b"\1" * 32))
    prints = {hash_request(request, data, 4, BLOCK, SEED, s).fingerprint for s in schemes}
    assert len(prints) == 1


ANSWERS = st.lists(
    st.tuples(st.lists(st.integers(0, 3), min_size=4, max_size=4), st.integers(0, 3)),
    min_size=1,
    max_size=8,
)


@given(ANSWERS)
def test_rows_alike_but_for_their_answers_sort_as_their_ids_are_numbered(answers):
    """One question asked again (one time, one prompt, one output length), answered
    differently and after different latencies: the rows' published order is the order their
    answers' blocks are first seen in, so the gate's first-seen check passes."""
    requests = [_hashed([9, 8, 7], answer, latency) for answer, latency in answers]
    batch = HashedBatch.pack(requests)
    blocks = dense_ids(block_keys(batch, BLOCK)).ids
    rows = row_batch(batch.requests, blocks, dense_ids(session_keys(batch)).ids, None, True)
    ordered = rows.sorted()
    seen = np.concatenate(
        [np.concatenate(ids) for ids in zip(ordered.row_ids(), ordered.row_output_ids())]
    )
    firsts = seen[np.sort(np.unique(seen, return_index=True)[1])]
    assert firsts.tolist() == list(range(len(firsts)))


@given(st.lists(st.text("ab", max_size=3), max_size=6), st.text("ab", max_size=12))
def test_unrendered_is_each_contents_presence_anywhere_in_any_order(contents, prompt):
    """unrendered searches forward from the previous message's match first (round 20: the
    prompt scanned about once); its answer stays `content in prompt` for each, in any order."""
    from kvtrace.transforms.encode.encode_requests import MESSAGE_NOT_RENDERED, unrendered

    messages = [{"role": "system", "content": c} for c in contents]
    request = Request(
        "log", b"", 1_000, "chat", messages=[*messages, {"role": "user", "content": "q"}]
    )
    marked = MESSAGE_NOT_RENDERED in unrendered(request, prompt).defaulted
    assert marked == any(c and c not in prompt for c in contents)


def _encoded(*requests: Request, scheme: HashScheme = HashScheme()):
    """The requests (token ids) encoded as a run encodes them: (each row's input length and
    block keys, the letters' reasons)."""
    from kvtrace.transforms.encode.encode_requests import EncodeOptions, RequestEncoder
    from kvtrace.transforms.encode.salt import SaltSource

    options = EncodeOptions("", SaltSource("random", inline=b"x" * 32), BLOCK, hash_scheme=scheme)
    batch, letters = RequestEncoder(None, SEED, options).encode(requests)
    reasons = [letter.reason for letter in letters]
    if batch is None:
        return [], reasons
    keys = [tuple(key) for key in batch.block_hashes.tolist()]
    rows, at = [], 0
    for row in batch.requests:
        rows.append((int(row["input_length"]), keys[at : at + row["num_blocks"]]))
        at += row["num_blocks"]
    return rows, reasons


def _tokens(ids: list[int], **fields) -> Request:
    return Request("log", b"{}", 1_000, "tokens", input_ids=ids, output_length=1, **fields)


def test_requests_of_different_cache_salts_share_no_block_and_of_one_salt_all():
    """The engine seeds a salted request's first block with its salt: two tenants' equal
    prompts share no cached block, one tenant's share theirs; no salt hashes as before."""
    prompt = [1, 2, 3, 4, 5, 6]
    salted = [_tokens(prompt, cache_salt=salt) for salt in ("a", "b", "a")]
    rows, letters = _encoded(*salted, _tokens(prompt))
    assert letters == []
    (_, a), (_, b), (_, again), (_, plain) = rows
    assert a == again and not set(a) & set(b) and not set(plain) & set(a + b)
    unsalted = hash_request(_tokens(prompt), token_bytes(prompt), 1, BLOCK, SEED)
    assert hash_request(salted[0], token_bytes(prompt), 1, BLOCK, SEED).fingerprint not in {
        unsalted.fingerprint,
        hash_request(salted[1], token_bytes(prompt), 1, BLOCK, SEED).fingerprint,
    }
    assert _encoded(_tokens(prompt))[0] == [rows[3]]


def test_a_cache_salt_under_an_engine_hash_scheme_is_a_letter():
    """An engine scheme's hashes are its tokens' alone: a salted request's would be made up."""
    rows, letters = _encoded(_tokens([1, 2, 3], cache_salt="a"), scheme=HashScheme("dynamo"))
    assert (rows, letters) == ([], ["unsupported_request"])


def test_a_truncated_prompt_keeps_its_last_tokens():
    """truncate_prompt_tokens N: the engine keeps the prompt's last N tokens, so do the ids."""
    rows, letters = _encoded(_tokens([1, 2, 3, 4, 5, 6], truncate_tokens=3), _tokens([4, 5, 6]))
    assert letters == [] and rows[0] == rows[1] and rows[0][0] == 3
    assert _encoded(_tokens([1, 2], truncate_tokens=5))[0][0][0] == 2
