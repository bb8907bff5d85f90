"""Render, tokenize and chain-hash batches of requests: the one step that ever sees text.

What leaves this step is a HashedBatch: timestamps, lengths and keyed hashes only.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import apache_beam as beam
import xxhash
from apache_beam.utils.windowed_value import WindowedValue

from transforms.encode.blocks import chain_hashes, chain_seed, keyed_digest, token_bytes
from transforms.dead_letters import dead_letter
from transforms.errors import Rejected
from transforms.encode.hashed_batch import HashedBatch, HashedRequest
from transforms.read.records import Request
from transforms.encode.salt import SaltSource
from transforms.encode.tokenize import encode_texts, load_tokenizer, render_chat

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


Rendered = list[tuple[Request, "str | None"]]  # each request with its prompt text, if any


class EncodeRequests(beam.DoFn):
    """A batch of Requests in, one HashedBatch out (later steps work per batch); bad requests go
    to the dead-letter output one by one.

    Rust tokenization releases the GIL, so a background thread tokenizes batch N while this
    thread renders batch N+1: rendering and hashing hide behind tokenization instead of adding to
    it. Batch N's results are emitted by the next call, or by finish_bundle for the last batch.
    """

    def __init__(
        self, tokenizer_name: str, block_size: int, salt: SaltSource, template_kwargs: dict[str, Any]
    ):
        self._tokenizer_name = tokenizer_name
        self._block_size = block_size
        self._salt = salt  # where to fetch it: the salt itself never enters the pipeline graph
        self._template_kwargs = dict(template_kwargs)

    def setup(self) -> None:
        self._tokenizer = load_tokenizer(self._tokenizer_name)
        self._seed = chain_seed(self._salt.load())
        self._progress = _Progress()
        self._tokenizing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")

    def teardown(self) -> None:
        self._tokenizing.shutdown()

    def start_bundle(self) -> None:
        self._pending: tuple[Rendered, Future, Any, Any] | None = None

    def process(
        self,
        batch: Iterable[Request],
        window=beam.DoFn.WindowParam,
        timestamp=beam.DoFn.TimestampParam,
    ) -> Iterator[Any]:
        rendered: Rendered = []
        for request in batch:
            try:
                rendered.append((request, self._prompt(request)))
            except Rejected as err:
                yield dead_letter(request.source, request.line, err.reason, err.message)
        tokenized = self._tokenizing.submit(self._tokenize, rendered)
        if self._pending is not None:
            yield from self._hash(*self._pending[:2])
        self._pending = (rendered, tokenized, window, timestamp)

    def finish_bundle(self) -> Iterator[Any]:
        if self._pending is None:
            return
        rendered, tokenized, window, timestamp = self._pending
        self._pending = None
        for output in self._hash(rendered, tokenized):
            if isinstance(output, beam.pvalue.TaggedOutput):
                yield beam.pvalue.TaggedOutput(
                    output.tag, WindowedValue(output.value, timestamp, [window])
                )
            else:
                yield WindowedValue(output, timestamp, [window])

    def _prompt(self, request: Request) -> str | None:
        """The text to tokenize, or None when the request came as token ids."""
        if request.kind == "chat":
            return render_chat(
                self._tokenizer, request.messages, request.tools, self._template_kwargs
            )
        return request.prompt

    def _tokenize(self, rendered: Rendered) -> tuple[list[list[int]], list[int]]:
        """(prompt token ids, output lengths), from one batched call for both."""
        prompts = [p for _, p in rendered if p is not None]
        outputs = [r.output_text for r, _ in rendered if r.output_text is not None]
        ids = encode_texts(self._tokenizer, prompts + outputs)
        return ids[: len(prompts)], [len(o) for o in ids[len(prompts) :]]

    def _hash(self, rendered: Rendered, tokenized: Future) -> Iterator[Any]:
        prompt_ids, output_lengths = tokenized.result()
        token_lists, lengths = iter(prompt_ids), iter(output_lengths)
        hashed = []
        for request, prompt in rendered:
            token_ids = request.input_ids if prompt is None else next(token_lists)
            if request.output_text is not None:
                output_length = next(lengths)
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
