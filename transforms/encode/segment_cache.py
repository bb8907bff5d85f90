"""Each distinct text segment tokenized once.

A fast tokenizer first cuts its input at added tokens matched on the raw text (those with
`normalized: false`), then normalizes, pre-tokenizes and tokenizes each piece on its own. So the
text between two such tokens gets the same ids wherever it appears, and chat traffic repeats
those pieces endlessly: system prompts, tool definitions, every earlier turn of a session. A
prompt is cut where the tokenizer cuts it; known pieces take their cached ids, new ones are
tokenized in one batch.

Safe only where the tokenizer provably cuts there and nothing looks across the cut, decided from
its own configuration (`splitter_for`), checked at load on probe texts (`SegmentEncoder.verify`)
and during the run on a sample of the cut texts chosen by a keyed hash of their content, never by
their order. A text's cut ids are its content's alone (each segment's ids are the tokenizer's for
that segment, cached or not), so whether a sampled text differs is the input's alone, and a
difference refuses the cache for the whole run: the local engine encodes the input again without
it, a Beam job fails before it publishes (`SegmentEncoder.mismatch`). Texts cut before the
difference was seen keep no say in the output, whatever the order.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import xxhash

from kvtrace.transforms.encode.blocks import TOKEN_DTYPE, token_bytes
from kvtrace.transforms.encode.fallible_tokenizer import FallibleTokenizer, TokenizerFailure
from kvtrace.transforms.encode.fast_backend import is_sampled

_LOG = logging.getLogger("kvtrace")
TOKEN_BYTES = TOKEN_DTYPE.itemsize
# Added-token flags under which the tokenizer's cut depends on the text around the token.
CONTEXT_FLAGS = ("lstrip", "rstrip", "single_word")
# Python objects per cached segment beyond its text and ids (dict slot, key, bytes headers).
ENTRY_OVERHEAD_BYTES = 200
DEFAULT_BUDGET_BYTES = 256 << 20  # a worker's share of memory; what a run evicts is logged
# One cut text in CHECK_ONE_IN, by a hash of its content keyed by CHECK_KEY, is also tokenized
# whole and compared: a tripwire at ~1% extra cost, on the same texts in every run and worker.
CHECK_ONE_IN = 128
CHECK_KEY = xxhash.xxh3_64_intdigest(b"kvtrace-segment-cache-check")
# Texts that reach the edges of a cut: whitespace, combining marks and digits beside added
# tokens, tokens back to back, at the start and the end.
PROBE_PIECES = (
    " ",
    "  ",
    "\n",
    "\n\n",
    "\u0301",
    "e\u0301",
    "123",
    "a",
    " a ",
    "\t",
    "🙂",
    "def f(x):\n    return x",
    "",
)


@dataclasses.dataclass
class CacheCounts:
    """What the cache did, summed over workers: logged at the end of a local run, Beam metrics
    (`segment_cache_*`) on a runner. Not in the manifest: the figures depend on worker count and
    record order, and the output must not."""

    segments: int = 0
    hit_segments: int = 0
    tokens: int = 0
    hit_tokens: int = 0
    evicted: int = 0
    checked: int = 0
    mismatches: int = 0
    disabled: str | None = None  # why the cache was off (from the start or from a mismatch on)

    def add(self, other: CacheCounts) -> CacheCounts:
        summed = {
            f.name: getattr(self, f.name) + getattr(other, f.name)
            for f in dataclasses.fields(self)
            if f.name != "disabled"
        }
        return CacheCounts(**summed, disabled=self.disabled or other.disabled)


# What is summed over workers (Beam metrics `segment_cache_NAME`).
COUNTED = tuple(f.name for f in dataclasses.fields(CacheCounts) if f.name != "disabled")


def log_counts(counts: CacheCounts) -> None:
    """The run's cache figures, for the operator: they depend on worker count and record order,
    so they stay out of the output, which must not."""
    if counts.disabled:
        _LOG.info("segment cache off: %s", counts.disabled)
    if counts.mismatches:
        _LOG.warning(
            "segment cache: %d sampled texts tokenized differently when cut; the cache is "
            "refused for the run",
            counts.mismatches,
        )
    if counts.tokens and not counts.disabled:  # an off cache's figures are its probe's
        _LOG.info(
            "segment cache: %.1f%% of %d tokens and %d of %d segments from the cache, "
            "%d evicted, %d texts checked whole",
            100 * counts.hit_tokens / counts.tokens,
            counts.tokens,
            counts.hit_segments,
            counts.segments,
            counts.evicted,
            counts.checked,
        )


@dataclasses.dataclass(frozen=True)
class Splitter:
    """Where the tokenizer cuts raw text: its non-normalized added tokens, longest first (the
    tokenizer matches leftmost-longest), and the id of each."""

    pattern: re.Pattern
    ids: dict[str, bytes]

    def split(self, text: str) -> list[str]:
        """Pieces in order; odd positions are added tokens."""
        return self.pattern.split(text)


def splitter_for(config: dict[str, Any]) -> Splitter | str:
    """The cut points of a tokenizer.json's configuration, or why cutting there is unsafe."""
    cuts = [token for token in config.get("added_tokens", []) if not token.get("normalized")]
    if not cuts:
        return "the tokenizer has no added tokens matched on raw text"
    for token in cuts:
        flags = [flag for flag in CONTEXT_FLAGS if token.get(flag)]
        if flags:
            return f"added token {token['content']!r} has {', '.join(flags)}: its cut reads the text around it"
    position = _position_dependent(config.get("pre_tokenizer"))
    if position:
        return position
    pattern = re.compile("(" + _longest_first(token["content"] for token in cuts) + ")")
    return Splitter(pattern, {token["content"]: token_bytes([token["id"]]) for token in cuts})


def _longest_first(words: Iterable[str]) -> str:
    """A regex matching any of words, the longest where several match (as the tokenizer does),
    written as a trie: a flat alternation of DeepSeek-R1's 800 tokens scans 5x slower."""
    trie: dict[str, dict] = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}  # a word ends here

    def pattern(node: dict[str, dict]) -> str:
        branches = [
            re.escape(char) + pattern(child) for char, child in sorted(node.items()) if char
        ]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body  # greedy: the longer word first

    return pattern(trie)


def tokenizer_config(backend: Any) -> dict[str, Any]:
    """The parts of a tokenizer's tokenizer.json that decide its cuts, read from the loaded
    tokenizer (serializing it whole takes ~0.1 s for a 150k vocabulary)."""
    added = [
        {
            "id": token_id,
            "content": token.content,
            "normalized": token.normalized,
            **{flag: getattr(token, flag) for flag in CONTEXT_FLAGS},
        }
        for token_id, token in backend.get_added_tokens_decoder().items()
    ]
    pre = backend.pre_tokenizer
    return {"added_tokens": added, "pre_tokenizer": json.loads(pre.__getstate__()) if pre else None}


def _position_dependent(pre_tokenizer: dict[str, Any] | None) -> str | None:
    """Why a pre-tokenizer treats the input's first piece unlike the others, if it does."""
    if not pre_tokenizer:
        return None
    if pre_tokenizer.get("type") == "Sequence":
        for inner in pre_tokenizer.get("pretokenizers", []):
            reason = _position_dependent(inner)
            if reason:
                return reason
        return None
    if pre_tokenizer.get("type") == "Metaspace" and pre_tokenizer.get("prepend_scheme") == "first":
        return "the Metaspace pre-tokenizer prepends to the input's first piece only"
    return None


class SegmentCache:
    """Token bytes of text segments, least recently used evicted past budget_bytes. Safe to share
    between threads (a Beam worker process shares one between its DoFn instances)."""

    def __init__(self, budget_bytes: int):
        self._budget = budget_bytes
        self._used = 0
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        return self._used

    def get(self, segment: str) -> bytes | None:
        with self._lock:
            ids = self._entries.get(segment)
            if ids is not None:
                self._entries.move_to_end(segment)
            return ids

    def put(self, segment: str, ids: bytes) -> int:
        """Cache a segment's ids; returns how many entries that evicted."""
        evicted = 0
        with self._lock:
            if segment in self._entries:
                return 0
            self._entries[segment] = ids
            self._used += _cost(segment, ids)
            while self._used > self._budget and self._entries:
                old, old_ids = self._entries.popitem(last=False)
                self._used -= _cost(old, old_ids)
                evicted += 1
        return evicted


def _joined(parts: list[bytes | TokenizerFailure]) -> bytes | TokenizerFailure:
    """A text's pieces as one, or the failure of the first piece that failed."""
    failed = next((part for part in parts if isinstance(part, TokenizerFailure)), None)
    return failed if failed is not None else b"".join(parts)  # type: ignore[arg-type]


def _cost(segment: str, ids: bytes) -> int:
    return len(segment) + len(ids) + ENTRY_OVERHEAD_BYTES


class SegmentEncoder:
    """Texts to token bytes (uint32 little-endian ids) through the cache, or whole when the
    tokenizer is not safe to cut (then it is exactly today's path)."""

    def __init__(
        self,
        backend: Any,
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
        cache: SegmentCache | None = None,
    ):
        """cache: one to share (its budget rules), else one of budget_bytes of its own."""
        self._tokenizer = FallibleTokenizer(backend)
        self._cache = cache if cache is not None else SegmentCache(budget_bytes)
        self.counts = CacheCounts()
        # Why a sampled text tokenized otherwise when cut, if one did: kept for the process,
        # the run then encodes without the cache (anonymize_local) or fails (steps.py).
        self.mismatch: str | None = None
        splitter = (
            splitter_for(tokenizer_config(backend))
            if budget_bytes > 0
            else "turned off (--segment-cache-mb 0)"
        )
        self._splitter = splitter if isinstance(splitter, Splitter) else None
        if self._splitter is None:
            self.counts.disabled = splitter
        else:
            self.verify()

    @property
    def enabled(self) -> bool:
        return self._splitter is not None

    def verify(self) -> None:
        """Probe texts around every kind of cut, whole against cut: any difference turns the
        cache off (the tokenizer's configuration missed something)."""
        tokens = sorted(self._splitter.ids)[:8]
        probes = [
            left + token + right
            for token in tokens
            for left in PROBE_PIECES
            for right in PROBE_PIECES
        ]
        probes.append("".join(tokens) + " tail")
        for text, whole, cut in zip(probes, self._whole(probes), self._cut(probes)[0]):
            if cut != whole:
                self._disable(f"probe {text!r} tokenizes differently when cut")
                return
        self.counts = CacheCounts()  # the probes are not the run's

    def encode(self, texts: list[str]) -> list[bytes | TokenizerFailure]:
        """Each text's token bytes, or its failure: a text fails where a segment of it does."""
        if not texts:
            return []
        if self._splitter is None:
            return self._whole(texts)
        out, cut = self._cut(texts)
        self._check(texts, out, cut)
        return out

    def _whole(self, texts: list[str]) -> list[bytes | TokenizerFailure]:
        return self._tokenizer.encode(texts)

    def _cut(self, texts: list[str]) -> tuple[list[bytes | TokenizerFailure], list[int]]:
        """Each text's pieces joined: added tokens by id, known segments from the cache, new
        ones tokenized together (each distinct one once); and which texts had a cut. A text
        without an added token is a whole prompt: tokenized with the rest, never cached (only
        an identical prompt could use it; single-turn logs would fill the cache for nothing)."""
        splitter, cache, counts = self._splitter, self._cache, self.counts
        pieces: list[list[bytes | str]] = []
        new: dict[str, int] = {}  # segment -> occurrences in these texts
        uncut: dict[str, None] = {}
        cut: list[int] = []
        for index, text in enumerate(texts):
            split = splitter.split(text)
            if len(split) == 1:
                uncut[text] = None
                pieces.append([text])
                continue
            cut.append(index)
            parts: list[bytes | str] = []
            for i, piece in enumerate(split):
                if i % 2:
                    parts.append(splitter.ids[piece])
                elif piece:
                    counts.segments += 1
                    ids = cache.get(piece)
                    if ids is None:
                        new[piece] = new.get(piece, 0) + 1
                        parts.append(piece)
                    else:
                        counts.hit_segments += 1
                        counts.hit_tokens += len(ids) // TOKEN_BYTES
                        parts.append(ids)
            pieces.append(parts)
        batch = list(new) + [text for text in uncut if text not in new]
        fresh = dict(zip(batch, self._whole(batch)))
        for segment, occurrences in new.items():
            ids = fresh[segment]
            if isinstance(ids, TokenizerFailure):
                continue  # not cached: each text holding it fails
            counts.evicted += cache.put(segment, ids)
            counts.hit_segments += occurrences - 1  # tokenized once for all its occurrences
            counts.hit_tokens += (occurrences - 1) * (len(ids) // TOKEN_BYTES)
        joined = [
            _joined([fresh[p] if isinstance(p, str) else p for p in parts]) for parts in pieces
        ]
        counts.tokens += sum(len(ids) for ids in joined if isinstance(ids, bytes)) // TOKEN_BYTES
        return joined, cut

    def _check(self, texts: list[str], out: list[bytes | TokenizerFailure], cut: list[int]) -> None:
        """The sampled texts that were cut also tokenized whole; a difference is the mismatch
        that refuses the cache for the run (and turns it off here; the text's whole ids
        replace its cut ones)."""
        sampled = [i for i in cut if is_sampled(texts[i], CHECK_ONE_IN, CHECK_KEY)]
        if not sampled:
            return
        whole = self._whole([texts[i] for i in sampled])
        self.counts.checked += len(sampled)
        for i, ids in zip(sampled, whole):
            if out[i] != ids:
                self.counts.mismatches += 1
                out[i] = ids
                self.mismatch = (
                    f"a sampled text of {len(texts[i])} characters tokenized differently when cut"
                )
                self._disable(self.mismatch)

    def take_counts(self) -> CacheCounts:
        """The counts since the last take (so that workers' counts can be summed)."""
        taken, self.counts = self.counts, CacheCounts(disabled=self.counts.disabled)
        return taken

    def _disable(self, reason: str) -> None:
        self._splitter = None
        self.counts.disabled = reason
