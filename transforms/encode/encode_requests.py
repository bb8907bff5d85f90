"""Render, tokenize and chain-hash batches of requests: the one step that ever sees text.

What leaves this step is a HashedBatch: timestamps, lengths and keyed hashes only. Pure:
encode/steps.py runs it on Beam workers, pipelines/anonymize_local.py in local processes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from kvtrace.transforms.dead_letters import DeadLetter
from kvtrace.transforms.encode.blocks import (
    DIGEST_SIZE,
    TOKEN_DTYPE,
    cache_salt_bytes,
    chain_seed,
    keyed_digest,
    request_chain_seed,
    token_bytes,
)
from kvtrace.transforms.encode.captures import BLOCK_SIZE_MISMATCH, hash_capture
from kvtrace.transforms.encode.fallible_tokenizer import TokenizerFailure
from kvtrace.transforms.encode.fast_backend import DEFAULT_BACKEND
from kvtrace.transforms.encode.fingerprint import fingerprint as request_fingerprint
from kvtrace.transforms.encode.hashed_batch import (
    HashedBatch,
    HashedRequest,
    link_keys,
    links_digest,
)
from kvtrace.transforms.encode.output_turn import Turn, generated_length, render_turn
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.encode.schemes import HashScheme
from kvtrace.transforms.encode.segment_cache import (
    DEFAULT_BUDGET_BYTES,
    CacheCounts,
    SegmentCache,
    SegmentEncoder,
)
from kvtrace.transforms.encode.tokenize import (
    SpecialTokens,
    check_rendered,
    checked_tokenizer,
    render_chat,
    special_tokens,
)
from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.measured import NOT_MEASURED
from kvtrace.transforms.read.records import DEFAULT_MAX_RECORD_BYTES, Request
from kvtrace.transforms.trace_format import DEFAULT_BLOCK_SIZE, MAX_ROW_IDS, NO_RESPONSE_MS

# Roles whose messages a template may leave out; only these are checked, so the check stays off
# the long user and assistant turns.
DROPPABLE_ROLES = frozenset({"system", "developer"})
MESSAGE_NOT_RENDERED = "message_not_rendered"
TOKENIZER_ERROR = "tokenizer_error"  # the dead letter of a text the tokenizer failed on

# Batches big enough for the fast tokenizer to use every core, small enough to bound memory: the
# tokenizer's Encoding objects cost ~100 bytes per token, so 8 MB of records (~2M tokens) keep a
# batch near 200 MB; 256 requests bound batches of short chats. A record over the byte bound is
# a batch of its own. (Measured on long prompts: 2 MB costs 5% more time, 16 MB twice the peak.)
TOKENIZE_BATCH_REQUESTS = 256
TOKENIZE_BATCH_BYTES = 8 << 20


def hash_request(
    request: Request,
    data: bytes,
    output_length: int,
    block_size: int,
    seed: bytes,
    scheme: HashScheme = HashScheme(),
    output_data: bytes | None = None,
) -> HashedRequest:
    """data: the prompt's token_bytes. output_data (with --emit-output-hashes): the generated
    tokens' bytes, whose full blocks after the prompt's are hashed on from the prompt's last full
    block."""
    session = request.session
    input_length = len(data) // TOKEN_DTYPE.itemsize
    # Hashed answers are ids of the row: the fingerprint covers them, so requests it leaves
    # tied hold the same ids and the one order (row_order.py) numbers and sorts alike. An
    # empty answer hashes into no ids: as none. A cache salt keys the ids: covered too.
    salt = cache_salt_bytes(request.cache_salt)
    fingerprint = request_fingerprint(
        None,
        block_size,
        (data,) if salt is None else (data, salt),
        None,
        input_length,
        output_length,
        session,
        output_data or None,
    )
    parent_key, named_by = link_keys(session, request.continues, request.links, seed)
    chain = request_chain_seed(seed, salt)  # block hashes only: ids, not sessions
    return HashedRequest(
        timestamp_ms=request.timestamp_ms,
        fingerprint=fingerprint,
        input_length=input_length,
        output_length=output_length,
        block_hashes=scheme.block_keys(data, block_size, chain),
        session_key=None if session is None else keyed_digest(session, seed),
        defaulted=request.defaulted,
        response_ms=NO_RESPONSE_MS if request.response_ms is None else request.response_ms,
        # No engine caches more than the prompt: a count above it is the whole prompt (so the
        # aggregate never exceeds the inputs the gate bounds it by).
        cached_tokens=NOT_MEASURED
        if request.cached_tokens is None
        else min(request.cached_tokens, input_length),
        output_block_hashes=b""
        if not output_data
        else _output_block_hashes(data, output_data, block_size, chain, scheme),
        parent_key=parent_key,
        link_keys=named_by,
        links_digest=links_digest(request.continues, request.links),
    )


def served_tokens(request: Request, content: bytes, specials: SpecialTokens | None) -> bytes:
    """The prompt's token_bytes as the engine tokenized it: its content's (content), within the
    special tokens the tokenizer adds where the request's add_special_tokens is true, cut to
    truncate_tokens as the tokenizer truncates: the special tokens kept, the content cut to
    the rest (none, if they fill it), from truncation_side ("left": its last tokens kept).
    Raises Rejected where the tokenizer's special tokens are not known exactly, or are more
    than truncate_tokens."""
    prefix = suffix = b""
    if request.add_special_tokens:
        if specials is None:
            raise Rejected(
                "unsupported_request",
                "add_special_tokens true: the tokenizer's special tokens for one sequence are "
                "not known exactly",
            )
        prefix, suffix = specials.prefix, specials.suffix
    if request.truncate_tokens is not None:
        room = request.truncate_tokens * TOKEN_DTYPE.itemsize - len(prefix) - len(suffix)
        if room < 0:  # fewer than the special tokens: what the tokenizer does is not known
            raise Rejected(
                "unsupported_request",
                f"truncate_prompt_tokens {request.truncate_tokens}: fewer than the special "
                "tokens the tokenizer adds",
            )
        keep = min(room, len(content))
        content = (
            content[len(content) - keep :] if request.truncation_side == "left" else content[:keep]
        )
    return prefix + content + suffix


def in_vocabulary(ids: list[int], max_token_id: int) -> None:
    """Raises Rejected for token ids past the largest the engine takes, as the engine refuses
    them ("out of vocabulary", a 400: the request never prefilled). Reading held each to 0 and
    uint32 already (records._token_ids)."""
    largest = max(ids, default=0)
    if largest > max_token_id:
        raise Rejected(
            "invalid_request",
            f"token id {largest} is out of the vocabulary (ids 0 to {max_token_id})",
        )


def row_ids(hashed: HashedRequest) -> int:
    """The ids its row will hold: a block id per block hashed, prompt and output."""
    return (len(hashed.block_hashes) + len(hashed.output_block_hashes)) // DIGEST_SIZE


def _output_block_hashes(
    prompt: bytes, output: bytes, block_size: int, seed: bytes, scheme: HashScheme
) -> bytes:
    """The full blocks of prompt + output that the prompt's full blocks do not already cover,
    as the engine caches them after decoding: the prompt's partial last block completed by
    generated tokens, and the blocks after it (a last partial block of output is not cached)."""
    step = block_size * TOKEN_DTYPE.itemsize
    full_prompt = len(prompt) // step
    whole = prompt + output
    cached = len(whole) // step
    if cached <= full_prompt:
        return b""
    keys = scheme.block_keys(whole[: cached * step], block_size, seed)
    return keys[full_prompt * DIGEST_SIZE :]


@dataclass(frozen=True)
class EncodeOptions:
    """How requests become hashes: the encoder's twin of read.records.ParseOptions, built once
    from a run's config and passed whole wherever an encoder is made. It names the tokenizer and
    where the salt is, never the salt: it travels in Beam's pipeline graph to the workers, which
    load both (open_encoder), each checked against the run's (tokenizer_sha256, the salt
    source's pinned fingerprint)."""

    tokenizer: str  # a local folder or a known name (tokenize.load_tokenizer); "" for --capture
    salt: SaltSource
    block_size: int = DEFAULT_BLOCK_SIZE
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    hash_scheme: HashScheme = field(default_factory=HashScheme)
    emit_output_hashes: bool = False  # also hash the blocks the engine caches after decoding
    segment_cache_bytes: int = DEFAULT_BUDGET_BYTES  # per worker; 0 tokenizes every text whole
    tokenizer_backend: str = DEFAULT_BACKEND  # fast_backend.BACKENDS: the same ids with each
    tokenizer_sha256: Mapping[str, str] = field(default_factory=dict)  # the run's files, if known
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES  # bounds a rendered prompt (check_rendered)


# each request with its prompt text, if any, and its generated turn's texts (output_turn.py)
Rendered = list[tuple[Request, "str | None", "Turn | None"]]
# prompt token bytes, output token bytes, turn token bytes (Turn.texts' in order): each, or the
# tokenizer's failure on it
Tokenized = tuple[
    list["bytes | TokenizerFailure"],
    list["bytes | TokenizerFailure"],
    list["bytes | TokenizerFailure"],
]


class RequestEncoder:
    """Batches of Requests in, one HashedBatch (or None) and dead letters out, in three steps
    that callers may overlap: render (Python), tokenize (Rust, releases the GIL), hash."""

    def __init__(
        self,
        tokenizer: Any,
        seed: bytes,
        options: EncodeOptions,
        segment_cache: SegmentCache | None = None,
    ):
        """tokenizer and seed: the options' tokenizer loaded and their salt's chain seed
        (open_encoder makes both; tests may pass an in-memory tokenizer). No tokenizer: a run of
        engine captures, whose requests hold no text (--capture)."""
        self._tokenizer = tokenizer
        self._template_kwargs = dict(options.chat_template_kwargs)
        self._segments = (
            None
            if tokenizer is None
            else SegmentEncoder(
                tokenizer.backend_tokenizer, options.segment_cache_bytes, segment_cache
            )
        )
        self._scheme = options.hash_scheme
        self._emit_output_hashes = options.emit_output_hashes
        self._block_size = options.block_size
        self._max_record_bytes = options.max_record_bytes
        self._seed = seed
        # What the tokenizer adds with add_special_tokens, probed once (a capture run: nothing)
        self._specials = None if tokenizer is None else special_tokens(tokenizer)
        # The largest token id the engine takes, learned as the tokenizer loaded
        self._max_token_id = None if tokenizer is None else tokenizer.max_token_id

    def encode(self, batch: Iterable[Request]) -> tuple[HashedBatch | None, list[DeadLetter]]:
        rendered, rejected = self.render(batch)
        hashed, empty = self.hash(rendered, self.tokenize(rendered))
        return hashed, rejected + empty

    def render(self, batch: Iterable[Request]) -> tuple[Rendered, list[DeadLetter]]:
        rendered: Rendered = []
        rejected = []
        for request in batch:
            try:
                prompt = self._prompt(request)
                turn = None
                if prompt is not None and request.output_turn is not None:
                    turn = render_turn(
                        self._tokenizer, request, self._template_kwargs, self._max_record_bytes
                    )
                rendered.append((unrendered(request, prompt), prompt, turn))
            except Rejected as err:
                rejected.append(request.letter(err.reason, err.message))
        return rendered, rejected

    def tokenize(self, rendered: Rendered) -> Tokenized:
        """(prompt, output and turn token bytes), through one segment-cached call for all: a
        turn's conversation repeats its prompt, whose segments the cache holds."""
        prompts = [p for _, p, _ in rendered if p is not None]
        outputs = [r.output_text for r, _, _ in rendered if r.output_text is not None]
        turns = [text for _, _, turn in rendered if turn is not None for text in turn.texts()]
        if self._segments is None:  # a capture run: its requests hold no text
            return [], [], []
        data = self._segments.encode(prompts + outputs + turns)
        split = len(prompts) + len(outputs)
        return data[: len(prompts)], data[len(prompts) : split], data[split:]

    def take_cache_counts(self) -> CacheCounts:
        """What the segment cache did since the last take."""
        return CacheCounts() if self._segments is None else self._segments.take_counts()

    @property
    def cache_mismatch(self) -> str | None:
        """Why the segment cache is refused for the run, if a sampled text showed it must be."""
        return None if self._segments is None else self._segments.mismatch

    @property
    def backend_fallback(self) -> str | None:
        """Why the fast tokenizer backend gave way to tokenizers, if it did (fast_backend.py)."""
        return getattr(getattr(self._tokenizer, "backend_tokenizer", None), "fallback", None)

    def hash(
        self, rendered: Rendered, tokenized: Tokenized
    ) -> tuple[HashedBatch | None, list[DeadLetter]]:
        prompt_ids, output_ids, turn_ids = tokenized
        token_lists, outputs, turns = iter(prompt_ids), iter(output_ids), iter(turn_ids)
        hashed, rejected = [], []
        for request, prompt, turn in rendered:
            if request.capture is not None:  # an engine's hashes: no tokens to wait for
                if request.capture.block_size != self._block_size:
                    # Never re-cut: an engine block's tokens are not in the capture.
                    rejected.append(
                        request.letter(
                            BLOCK_SIZE_MISMATCH,
                            f"captured at block size {request.capture.block_size}, "
                            f"not --block-size {self._block_size}",
                        )
                    )
                else:
                    self._keep(hash_capture(request, self._seed), request, hashed, rejected)
                continue
            data = token_bytes(request.input_ids) if prompt is None else next(token_lists)
            generated = next(outputs) if request.output_text is not None else None
            turn_data = None if turn is None else [next(turns) for _ in turn.texts()]
            failed = next(
                (
                    r
                    for r in (data, generated, *(turn_data or ()))
                    if isinstance(r, TokenizerFailure)
                ),
                None,
            )
            if failed is not None:
                rejected.append(
                    request.letter(TOKENIZER_ERROR, f"the tokenizer failed on it: {failed.reason}")
                )
                continue
            if request.cache_salt is not None and not self._scheme.keyed:
                rejected.append(
                    request.letter(
                        "unsupported_request",
                        f"cache_salt under --hash-scheme {self._scheme.name}: the engine's "
                        "hashes of a salted request are not its tokens' alone",
                    )
                )
                continue
            if generated is not None:  # counted against the prompt as rendered, before serving
                output_length, generated = generated_length(
                    data, generated, request.output_stopped, turn_data
                )
            try:
                data = served_tokens(request, data, self._specials)
            except Rejected as err:
                rejected.append(request.letter(err.reason, err.message))
                continue
            if generated is None:
                output_length = request.output_length or 0
            if not data:
                rejected.append(request.letter("no_input", "renders to no tokens"))
                continue
            row = hash_request(
                request,
                data,
                output_length,
                self._block_size,
                self._seed,
                self._scheme,
                generated if self._emit_output_hashes else None,
            )
            self._keep(row, request, hashed, rejected)
        return (HashedBatch.pack(hashed) if hashed else None), rejected

    @staticmethod
    def _keep(
        row: HashedRequest,
        request: Request,
        hashed: list[HashedRequest],
        rejected: list[DeadLetter],
    ) -> None:
        """The row kept, or a too_large letter for a row its own readers would refuse."""
        if (ids := row_ids(row)) > MAX_ROW_IDS:
            rejected.append(
                request.letter(
                    "too_large",
                    f"{ids} blocks, over the {MAX_ROW_IDS} a trace row "
                    f"holds: a larger --block-size takes it",
                )
            )
            return
        hashed.append(row)

    def _prompt(self, request: Request) -> str | None:
        """The text to tokenize, or None when the request came as token ids (within the
        vocabulary: in_vocabulary)."""
        if request.input_ids is not None and self._max_token_id is not None:
            in_vocabulary(request.input_ids, self._max_token_id)
        if request.kind == "chat":
            prompt = render_chat(
                self._tokenizer,
                request.messages,
                request.tools,
                self._template_kwargs,
                request.timestamp_ms,
                request.template_kwargs,
            )
            return check_rendered(prompt, len(request.line), self._max_record_bytes)
        return request.prompt


def open_encoder(
    options: EncodeOptions, segment_cache: SegmentCache | None = None
) -> RequestEncoder:
    """The encoder where it runs (a Beam worker, a local worker process): the tokenizer loaded
    and checked against the files the run began with, the salt fetched, checked against the
    fingerprint the run began with (SaltSource.load), and chained."""
    return RequestEncoder(
        checked_tokenizer(options.tokenizer, options.tokenizer_sha256, options.tokenizer_backend)
        if options.tokenizer
        else None,
        chain_seed(options.salt.load()),
        options,
        segment_cache,
    )


def unrendered(request: Request, prompt: str | None) -> Request:
    """The request, marked when its template left out a system or developer message's text
    (some templates render no developer role): counted in the manifest, since the engine's
    prompt then lacks what the log holds."""
    if prompt is None or request.kind != "chat":
        return request
    dropped = not _all_printed(
        [
            m["content"]
            for m in request.messages
            if m["role"] in DROPPABLE_ROLES and m.get("content")
        ],
        prompt,
    )
    return (
        replace(request, defaulted=(*request.defaulted, MESSAGE_NOT_RENDERED))
        if dropped
        else request
    )


def _all_printed(contents: list[str], prompt: str) -> bool:
    """Whether each of contents is in prompt (anywhere: the meaning of `content in prompt`),
    with the prompt scanned about once in all, not once per content: templates print messages
    in their order, so each is looked for after the previous one's match first (the previous
    content's own print ends before this one's begins, so an in-order print is always found
    so), and in the whole prompt only where that fails: a content the template printed out of
    order (one full scan each) or left out (one full scan, and the answer is known)."""
    at = 0
    for content in contents:
        found = prompt.find(content, at)
        if found >= 0:
            at = found + len(content)
        elif content not in prompt:
            return False
    return True


EncodedBatch = tuple[HashedBatch | None, list[DeadLetter]]  # a batch hashed, and its dead letters


class OverlappedEncoder:
    """Batches of requests rendered, tokenized and hashed with tokenization in a background
    thread: Rust tokenization releases the GIL, so batch N tokenizes while this thread renders
    batch N+1, and rendering and hashing hide behind tokenization instead of adding to it. Both
    engines encode through it (the Beam DoFn per bundle, the local engine per file range)."""

    def __init__(self, encoder: RequestEncoder):
        self._encoder = encoder
        self._tokenizing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")
        self._pending: tuple[Rendered, Future] | None = None

    def push(self, batch: Iterable[Request]) -> tuple[list[DeadLetter], EncodedBatch | None]:
        """Start a batch: its render failures now, and the batch before it, finished."""
        rendered, failed = self._encoder.render(batch)
        tokenized = self._tokenizing.submit(self._encoder.tokenize, rendered)
        previous = self.flush()
        self._pending = (rendered, tokenized)
        return failed, previous

    def flush(self) -> EncodedBatch | None:
        """The batch in flight, finished (None when there is none)."""
        if self._pending is None:
            return None
        rendered, tokenized = self._pending
        self._pending = None
        return self._encoder.hash(rendered, tokenized.result())

    def take_cache_counts(self) -> CacheCounts:
        """What the segment cache did since the last take: only once no batch tokenizes."""
        return self._encoder.take_cache_counts()

    def close(self) -> None:
        """Without waiting: after a flush nothing is left to wait for, and a run stopped (Ctrl-C)
        or failed while a batch tokenizes must not wait for it: the Rust call, which releases
        the GIL, runs on in its thread while this one unwinds, and ends with the process."""
        self._tokenizing.shutdown(wait=False, cancel_futures=True)
