"""Text requests whose tokenization reproduces a trace's blocks exactly (`kvtrace render`).

Each block becomes a fixed run of words, each word one token of the target tokenizer that starts
with a space (" apple"): byte-level and metaspace pre-tokenizers split at those spaces, so words
never merge with their neighbours, in a block or across a block boundary. A block's words spell
its rank among the blocks that follow the same parent (base-V digits, least significant first,
then a filler), so siblings differ and a block reads the same in every row that has it: equal
id prefixes give equal token prefixes, and anonymize(render(trace)) gives the trace back up to
renumbering (tested, and checked on every rendering by `reproduces`). A partial last block of L
tokens keeps the first L words, so it differs from its siblings while L words can spell their
ranks (`merged` counts blocks where they cannot).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xxhash

from kvtrace.transforms.encode.blocks import token_bytes
from kvtrace.transforms.encode.fallible_tokenizer import FallibleTokenizer
from kvtrace.transforms.encode.tokenize import encode_texts, render_chat
from kvtrace.transforms.read.trace_io import Trace
from kvtrace.transforms.stats.trace_blocks import last_block_tokens, prefix_ids

# Words per vocabulary: 4,096 spell 16.7M siblings in two tokens; every tokenizer we ship has
# over 20,000 such words.
VOCABULARY_WORDS = 4096
_WORD = re.compile(r" [a-z]{3,10}")
_FILLER_STEP = 2654435761  # Knuth's multiplicative step: consecutive positions spread apart
SPELLED_BLOCKS_KEPT = 4096  # ~4096 x a block's text (3.5 KB at 512 tokens): ~15 MB


@dataclass(frozen=True)
class Rendered:
    """Per block of the trace (file order), which distinct block it is, and how each distinct
    block is spelled; texts are built when asked (a trace's texts together outgrow memory)."""

    block_text: np.ndarray  # per block: index into spelling
    spelling: np.ndarray  # per distinct (prefix, length) block: rank, tokens, first digit's place
    digits: int  # words spelling a rank
    words: list[str]
    offsets: np.ndarray  # the trace's: row r's blocks are block_text[offsets[r]:offsets[r + 1]]
    merged: int  # blocks whose words equal a sibling's (too short to spell their rank)

    def __post_init__(self) -> None:
        # Shared prefixes recur row after row: their blocks are spelled once while they recur.
        spell = functools.lru_cache(maxsize=SPELLED_BLOCKS_KEPT)(
            lambda rank, tokens, start: _spelled(rank, tokens, self.digits, start, self.words)
        )
        object.__setattr__(self, "_spell", spell)

    def text(self, block: int) -> str:
        return self._spell(*self.spelling[block].tolist())

    def row(self, r: int, skip_head: int = 0, skip_tail: int = 0) -> str:
        """Row r's text, built when asked (a trace's texts together can outgrow memory); the
        first skip_head and last skip_tail words are left out, for a chat template's own
        tokens before and after the content."""
        index = self.block_text[self.offsets[r] : self.offsets[r + 1]].tolist()
        parts = [self.text(i) for i in index]
        if (skip_head or skip_tail) and parts:
            kept = "".join(parts).split(" ")[1:]  # every word starts with its space
            parts = [" " + w for w in kept[skip_head : len(kept) - skip_tail]]
        return "".join(parts)


def vocabulary(tokenizer, size: int = VOCABULARY_WORDS) -> list[str]:
    """Words (" apple") that the tokenizer encodes as one token each, in token id order: a
    byte-level BPE's space-led tokens, a word-level tokenizer's words."""
    backend = tokenizer.backend_tokenizer
    candidates = []
    for token_id in sorted(backend.get_vocab().values()):
        text = " " + backend.decode([token_id]).strip()
        if _WORD.fullmatch(text):
            candidates.append((token_id, text))
    encoded = FallibleTokenizer(backend).encode_or_raise([t for _, t in candidates])
    words = [
        text
        for (token_id, text), data in zip(candidates, encoded)
        if data == token_bytes([token_id])
    ]
    if len(words) < 2:
        raise ValueError("the tokenizer has too few single-token words to render with")
    return words[:size]


def render_blocks(trace: Trace, block_size: int, words: list[str], head: int = 0) -> Rendered:
    """Every block as words: input_length tokens per row, cut into the row's blocks. head: the
    tokens a chat template puts before the content, which replace the first words of every
    row's first block (its rank is spelled after them)."""
    prefix = prefix_ids(trace).astype(np.int64)
    parent = np.roll(prefix, 1)
    parent[trace.offsets[:-1][trace.lengths > 0]] = -1
    # A block's rank among the distinct blocks behind the same parent prefix.
    pairs = np.unique(np.stack([parent, prefix], axis=1), axis=0)
    rank_of_prefix = np.empty(int(prefix.max(initial=-1)) + 1, dtype=np.int64)
    rank_of_prefix[pairs[:, 1]] = np.arange(len(pairs)) - np.searchsorted(pairs[:, 0], pairs[:, 0])
    rank = rank_of_prefix[prefix]
    base = len(words)
    digits = 1
    while base**digits <= rank.max(initial=0):
        digits += 1
    if digits + head > block_size:
        raise ValueError(
            f"a prefix has {int(rank.max()) + 1:,} different next blocks: more than "
            f"{base:,}^{block_size} words can spell"
        )
    tokens = np.full(len(prefix), block_size, dtype=np.int64)
    has = trace.lengths > 0
    tokens[np.cumsum(trace.lengths)[has] - 1] = last_block_tokens(trace, block_size)[has]
    # Each distinct (prefix, tokens) block is spelled once.
    distinct, first, index = np.unique(
        prefix * (block_size + 1) + tokens, return_index=True, return_inverse=True
    )
    starts = np.zeros(len(prefix), dtype=np.int64)
    starts[trace.offsets[:-1][has]] = head
    spelling = np.stack([rank[first], tokens[first], starts[first]], axis=1)
    short = tokens[first] < digits + starts[first]
    merged = (
        int(short.sum())
        - len(
            np.unique(
                np.stack(
                    [
                        parent[first][short],
                        tokens[first][short],
                        rank[first][short] % base ** tokens[first][short],
                    ],
                    axis=1,
                ),
                axis=0,
            )
        )
        if short.any()
        else 0
    )
    return Rendered(index.reshape(-1), spelling, digits, words, trace.offsets, merged)


def _spelled(rank: int, tokens: int, digits: int, start: int, words: Sequence[str]) -> str:
    """tokens words: the rank's base-V digits from position start, filler elsewhere."""
    base = len(words)
    out = []
    for position in range(tokens):
        if start <= position < start + digits:
            out.append(words[rank // base ** (position - start) % base])
        else:
            out.append(words[(rank + position * _FILLER_STEP) % base])
    return "".join(out)


def block_keys(token_ids: list[list[int]], block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens per row, a 128-bit digest per block of every row): what `reproduces` compares,
    16 bytes a block instead of the token lists."""
    lengths = np.array([len(t) for t in token_ids], dtype=np.int64)
    digests = b"".join(
        xxhash.xxh3_128_digest(block.tobytes())
        for tokens in token_ids
        for block in np.array_split(
            np.asarray(tokens, dtype=np.uint32), range(block_size, len(tokens), block_size)
        )
        if len(block)
    )
    return lengths, np.frombuffer(digests, dtype="<u8").reshape(-1, 2)


def reproduces_blocks(
    trace: Trace, lengths: np.ndarray, keys: np.ndarray, block_size: int
) -> np.ndarray:
    """Per row, whether its tokens (lengths, block digests from block_keys) give the trace's
    blocks: the same number of tokens, and equal block prefixes exactly where the trace has
    equal id prefixes."""
    ok = (lengths == trace.input_length) & (-(-lengths // block_size) == trace.lengths)
    if not ok.all():
        return ok
    _, ids = np.unique(keys, axis=0, return_inverse=True)
    ours = prefix_ids(
        Trace(
            trace.timestamp,
            trace.input_length,
            trace.output_length,
            trace.offsets,
            ids.reshape(-1).astype(np.int64),
            None,
            trace.line,
            trace.file_index,
            trace.files,
        )
    )
    theirs = prefix_ids(trace)
    # The partitions agree where each prefix of one meets one prefix of the other.
    pairs = np.unique(np.stack([theirs, ours], axis=1).astype(np.int64), axis=0)
    per_theirs = np.bincount(pairs[:, 0], minlength=int(theirs.max(initial=-1)) + 1)
    per_ours = np.bincount(pairs[:, 1], minlength=int(ours.max(initial=-1)) + 1)
    bad = (per_theirs[theirs] > 1) | (per_ours[ours] > 1)
    row = np.repeat(np.arange(len(trace)), trace.lengths)
    return ok & (np.bincount(row[bad], minlength=len(trace)) == 0)


def template_overhead(tokenizer, words: list[str], template_kwargs: dict) -> tuple[int, int]:
    """(tokens before, tokens after) the content of a one-message chat as the model's template
    renders it, generation prompt included; fails when the template changes the content's own
    tokens (then no text can reproduce a trace through it)."""
    probe = "".join(words[:8])
    content = encode_texts(tokenizer, [probe])[0]
    rendered = render_chat(tokenizer, [{"role": "user", "content": probe}], None, template_kwargs)
    tokens = encode_texts(tokenizer, [rendered])[0]
    for start in range(len(tokens) - len(content) + 1):
        if tokens[start : start + len(content)] == content:
            return start, len(tokens) - start - len(content)
    raise ValueError(
        "the chat template changes the tokens of the message it wraps: render with --shape prompt"
    )
