"""Render, tokenize and chain-hash batches of requests: the one step that ever sees text.

What leaves this step is a HashedBatch: timestamps, lengths and keyed hashes only. Pure:
encode/steps.py runs it on Beam workers, pipelines/anonymize_local.py in local processes.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Iterable
from typing import Any

import xxhash

from transforms.encode.blocks import keyed_digest, token_bytes
from transforms.encode.schemes import HashScheme
from transforms.dead_letters import DeadLetter
from transforms.errors import Rejected
from transforms.encode.hashed_batch import HashedBatch, HashedRequest
from transforms.read.records import Request
from transforms.encode.tokenize import encode_texts, render_chat

_LOG = logging.getLogger("kvtrace")
PROGRESS_INTERVAL_S = 30.0


def hash_request(
    request: Request,
    token_ids: list[int],
    output_length: int,
    block_size: int,
    seed: bytes,
    scheme: HashScheme = HashScheme(),
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
        block_hashes=scheme.block_keys(data, block_size, seed),
        session_key=None if session is None else keyed_digest(session, seed),
        defaulted=request.defaulted,
    )


Rendered = list[tuple[Request, "str | None"]]  # each request with its prompt text, if any
Tokenized = tuple[list[list[int]], list[int]]  # prompt token ids, output lengths


class RequestEncoder:
    """Batches of Requests in, one HashedBatch (or None) and dead letters out, in three steps
    that callers may overlap: render (Python), tokenize (Rust, releases the GIL), hash."""

    def __init__(self, tokenizer: Any, block_size: int, seed: bytes,
                 template_kwargs: dict[str, Any], scheme: HashScheme = HashScheme()):
        self._tokenizer = tokenizer
        self._scheme = scheme
        self._block_size = block_size
        self._seed = seed
        self._template_kwargs = dict(template_kwargs)
        self._progress = _Progress()

    def encode(self, batch: Iterable[Request]) -> tuple[HashedBatch | None, list[DeadLetter]]:
        rendered, rejected = self.render(batch)
        hashed, empty = self.hash(rendered, self.tokenize(rendered))
        return hashed, rejected + empty

    def render(self, batch: Iterable[Request]) -> tuple[Rendered, list[DeadLetter]]:
        rendered: Rendered = []
        rejected = []
        for request in batch:
            try:
                rendered.append((request, self._prompt(request)))
            except Rejected as err:
                rejected.append(DeadLetter(request.source, request.line, err.reason, err.message))
        return rendered, rejected

    def tokenize(self, rendered: Rendered) -> Tokenized:
        """(prompt token ids, output lengths), from one batched call for both."""
        prompts = [p for _, p in rendered if p is not None]
        outputs = [r.output_text for r, _ in rendered if r.output_text is not None]
        ids = encode_texts(self._tokenizer, prompts + outputs)
        return ids[: len(prompts)], [len(o) for o in ids[len(prompts) :]]

    def hash(self, rendered: Rendered, tokenized: Tokenized
             ) -> tuple[HashedBatch | None, list[DeadLetter]]:
        prompt_ids, output_lengths = tokenized
        token_lists, lengths = iter(prompt_ids), iter(output_lengths)
        hashed, rejected = [], []
        for request, prompt in rendered:
            token_ids = request.input_ids if prompt is None else next(token_lists)
            if request.output_text is not None:
                output_length = next(lengths)
            else:
                output_length = request.output_length or 0
            if not token_ids:
                rejected.append(DeadLetter(request.source, request.line, "no_input",
                                           "renders to no tokens"))
                continue
            hashed.append(
                hash_request(request, token_ids, output_length, self._block_size, self._seed,
                             self._scheme)
            )
            self._progress.add(len(token_ids))
        return (HashedBatch.pack(hashed) if hashed else None), rejected

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
