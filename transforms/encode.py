"""Render, tokenize and chain-hash batches of requests: the one step that ever sees text.

What leaves this step is a HashedBatch: timestamps, lengths and keyed hashes only.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import xxhash

from kvtrace.transforms.blocks import chain_hashes, chain_seed, keyed_digest, token_bytes
from kvtrace.transforms.dead_letters import dead_letter
from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.hashed_batch import HashedBatch, HashedRequest
from kvtrace.transforms.records import Request
from kvtrace.transforms.tokenize import encode_texts, load_tokenizer, render_chat

_LOG = logging.getLogger("kvtrace")
PROGRESS_INTERVAL_S = 30.0


def hash_request(
    request: Request,
    token_ids: list[int],
    output_length: int,
    block_size: int,
    seed: bytes,
) -> HashedRequest:
    data = token_bytes(token_ids)
    session = request.session
    fingerprint = xxhash.xxh3_64_intdigest(
        data + struct.pack("<q", output_length) + (b"" if session is None else session.encode())
    )
    return HashedRequest(
        timestamp_ms=request.timestamp_ms,
        fingerprint=fingerprint,
        input_length=len(token_ids),
        output_length=output_length,
        block_hashes=chain_hashes(data, block_size, seed),
        session_key=None if session is None else keyed_digest(session, seed),
        defaulted=request.defaulted,
    )


class EncodeRequests(beam.DoFn):
    """A batch of Requests in, one HashedBatch out (later steps work per batch); bad requests go
    to the dead-letter output one by one."""

    def __init__(
        self, tokenizer_name: str, block_size: int, salt: bytes, template_kwargs: dict[str, Any]
    ):
        self._tokenizer_name = tokenizer_name
        self._block_size = block_size
        self._salt = salt
        self._template_kwargs = dict(template_kwargs)
        self._tokenizer: Any = None

    def setup(self) -> None:
        self._tokenizer = load_tokenizer(self._tokenizer_name)
        self._seed = chain_seed(self._salt)
        self._progress = _Progress()

    def process(self, batch: Iterable[Request]) -> Iterator[Any]:
        prompts: list[tuple[Request, str | None]] = []
        for request in batch:
            try:
                prompts.append((request, self._prompt(request)))
            except Rejected as err:
                yield dead_letter(request.source, request.line, err.reason, err.message)
        token_lists = iter(encode_texts(self._tokenizer, [p for _, p in prompts if p is not None]))
        output_texts = [r.output_text for r, _ in prompts if r.output_text is not None]
        output_lengths = iter(len(ids) for ids in encode_texts(self._tokenizer, output_texts))
        hashed = []
        for request, prompt in prompts:
            token_ids = request.input_ids if prompt is None else next(token_lists)
            if request.output_text is not None:
                output_length = next(output_lengths)
            else:
                output_length = request.output_length or 0
            if not token_ids:
                yield dead_letter(request.source, request.line, "no_input", "renders to no tokens")
                continue
            hashed.append(
                hash_request(request, token_ids, output_length, self._block_size, self._seed)
            )
            self._progress.add(len(token_ids))
        if hashed:
            yield HashedBatch.pack(hashed)

    def _prompt(self, request: Request) -> str | None:
        """The text to tokenize, or None when the request came as token ids."""
        if request.kind == "chat":
            return render_chat(
                self._tokenizer, request.messages, request.tools, self._template_kwargs
            )
        return request.prompt


class _Progress:
    """Logs requests and tokens per second from each worker, at most every PROGRESS_INTERVAL_S."""

    def __init__(self) -> None:
        self._start = self._last = time.monotonic()
        self._requests = self._tokens = 0

    def add(self, tokens: int) -> None:
        self._requests += 1
        self._tokens += tokens
        now = time.monotonic()
        if now - self._last >= PROGRESS_INTERVAL_S:
            self._last = now
            rate = self._tokens / (now - self._start)
            _LOG.info("tokenized %d requests, %d tokens (%.0f tokens/s)", self._requests,
                      self._tokens, rate)
