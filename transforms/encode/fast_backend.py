"""A faster tokenizer library for the same tokenizer.json, used only where its ids are those of
`tokenizers` (the reference, which stays loaded beside it).

fastokens reads a tokenizer.json and encodes 10-50x faster than `tokenizers`' encode_batch_fast
on these cores (docs/TOKENIZER_BACKENDS.md). Exactness is a gate, in three steps:

- at load, by the tokenizer's declared configuration: every component must be one of a closed
  list of kinds and settings (SUPPORTED_*), each one fastokens implements and the shipped
  tokenizers exercise, and the pre-tokenizer whole (its Split regexes) one of VERIFIED_PRE_TOKENIZERS;
  anything else, or a file fastokens refuses to load, keeps `tokenizers`, with the reason;
- at load, on probe texts (PROBES, RUNS and the tokenizer's own added tokens): one difference,
  or a probe the reference fails on, keeps `tokenizers`, with the text;
- during the run, on a sample of the texts themselves, chosen by a keyed hash of each text's
  content (one in CHECK_ONE_IN), never by order: a sampled text is encoded by both and takes the
  reference's ids whatever the fast ones were. A difference turns the fast library off for the
  rest of the process (logged, with the reason), and the batch that held it is encoded again by
  the reference before any of it is used.

A text the fast library fails on (a regex over its match limits) is encoded by the reference,
which decides: its ids, or the tokenizer_error the reference run would give. The converse, a
text the reference fails on (its regex engine gives up backtracking: Oniguruma's retry limit)
and the fast library encodes, is decided without running the reference's pre-tokenizer on every
text (measured dearer than the reference's whole encode, docs/TOKENIZER_BACKENDS.md): at load,
the reference must encode long runs of each character (RUNS) without failing, or fastokens is
refused (a pattern that backtracks past the limit on a run of a few dozen characters); during
the run, a text of over MAX_FAST_CHARS characters is encoded by the reference (a pattern whose
backtracking grows with the text, as Qwen3's `\\s*[\\r\\n]+`, reaches the limit only on millions
of characters).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from typing import Any

import numpy as np
import xxhash

from kvtrace.transforms.encode.blocks import TOKEN_DTYPE
from kvtrace.transforms.encode.fallible_tokenizer import (
    FallibleTokenizer,
    TokenizerFailure,
    _is_panic,
    token_ids,
)

_LOG = logging.getLogger("kvtrace")

TOKENIZERS, FASTOKENS, AUTO = "tokenizers", "fastokens", "auto"
BACKENDS = (AUTO, TOKENIZERS, FASTOKENS)
# tokenizers until fastokens repays its load (~1.3 CPU-s, ~140 MiB per process) on the inputs
# users run: measured faster on single-turn prompt logs (2.7x whole run), slower on agent logs
# (0.80x: the segment cache already spares ~90% of tokenizing) and the examples (0.77x).
DEFAULT_BACKEND = TOKENIZERS
# One text in this many (by a keyed hash of its content) is also encoded by the reference.
CHECK_ONE_IN = 64
# The hash's key: fixed, so a text is sampled in every run, on every worker, whatever its order.
CHECK_KEY = xxhash.xxh3_64_intdigest(b"kvtrace-tokenizer-backend-check")

# The closed list: each component kind with the settings it may have (a setting absent from the
# file takes `tokenizers`' default, listed first). Anything else keeps `tokenizers`.
SUPPORTED_NORMALIZERS = frozenset({"NFC"})  # and Sequence of these, and none
SUPPORTED_MODEL = {
    "type": ("BPE",),
    "dropout": (None,),
    "unk_token": (None,),
    "continuing_subword_prefix": (None, ""),
    "end_of_word_suffix": (None, ""),
    "fuse_unk": (False,),
    "byte_fallback": (False,),
    "ignore_merges": (False,),
}
SUPPORTED_SPLIT = {"behavior": ("Isolated",), "invert": (False,)}  # pattern: Regex or String
# The pre-tokenizers fastokens may run, whole, by pre_tokenizer_key. A Split regex does not mean
# the same in the two regex engines (Oniguruma's `$` ends every line, fastokens' only the text;
# U+180E is `\s` to fastokens alone, even in GPT-2's pattern), and fastokens runs the shipped
# pre-tokenizers by their exact configuration: DeepSeek-R1's third regex alone, or Qwen3's with
# one more alternative, splits '  \u180e' otherwise than Oniguruma. Probes cannot prove two
# engines agree, so only these are admitted, each swept through both engines code point by code
# point (tests/transforms/encode/test_fast_backend_patterns.py).
VERIFIED_PRE_TOKENIZERS = {
    "65fb2abd2e49b40a3b6f5c4a2e9a07dac5e3cc3d1c8221dd3148a305b7e075d1": "Qwen3's",
    "2771f8fdfaf19977397c7c774ebe024d0a75b607b49219796e45a1e16dc01144": "DeepSeek-R1's",
}
SUPPORTED_BYTE_LEVEL = {"add_prefix_space": (False,), "use_regex": (False,)}
# Post-processors add tokens only with add_special_tokens, which kvtrace never asks for; the
# decoder is never used to encode.
SUPPORTED_POST_PROCESSORS = frozenset({"ByteLevel", "TemplateProcessing"})
# Added tokens whose match reads the text around them are not in the list.
SUPPORTED_ADDED_FLAGS = {
    "lstrip": (False,),
    "rstrip": (False,),
    "single_word": (False,),
    "normalized": (True, False),
    "special": (True, False),
}
# Texts at the edges of every component: whitespace runs and line ends, digits (split in ones
# and threes), case and contractions, combining marks and composed forms (NFC), scripts the
# pre-tokenizers split apart, emoji with modifiers, long words, code, and unassigned code points.
PROBES = (
    "",
    " ",
    "    ",
    "\n",
    "\r\n\r\n",
    " \t \n  \n\n   x",
    "Hello, world! HELLO World's they're I'VE we'd",
    "1 12 123 1234 12345 3.14159 1,000,000 0x1F",
    "e\u0301 cafe\u0301 caf\u00e9 \u212b \u1e9b\u0323 \uac00\u11a8",
    "naïve café Straße Ελληνικά русский العربية עברית हिन्दी ไทย",
    "日本語のテキスト、カタカナ、ひらがな 中文文本 한국어",
    "🙂👍🏽👨‍👩‍👧 🇫🇷 \u200d\ufeff\u00a0\u3000",
    "Pneumonoultramicroscopicsilicovolcanoconiosis" * 3,
    "def f(x):\n\treturn x**2  # comment\n\n\n    if a != b: pass",
    '{"json": [1, 2, {"k": null}], "s": "a\\nb"} <html><b>x</b></html>',
    "\x00\x01\x7f \ue000 \U0010fffd \U000e0001",
    "a" * 5000,
    " " * 3000 + "x",
)
# Runs of each printable ASCII character and of a few others (accented, CJK, emoji, spaces that
# are not ASCII), each RUN_CHARS long: where the reference's regex backtracks past its retry
# limit (10^7 steps per match) on a run of this length, it fails on texts of the run's length,
# which fastokens would encode; fastokens is then refused. (Qwen3's and DeepSeek-R1's pass:
# 0.1 CPU-s for the 105 runs.)
RUN_CHARS = 4096
RUNS = tuple(
    chr(code) * RUN_CHARS
    for code in (
        *range(0x20, 0x7F),
        0x09,
        0x0A,
        0x0B,
        0x0C,
        0x0D,
        0xE9,
        0x4E2D,
        0x1F642,
        0xA0,
        0x3000,
    )
)
# A text longer than this is encoded by the reference: a pattern that passed RUNS backtracks
# past the retry limit, if at all, only on texts this long or longer (Qwen3's: ~10^7 spaces).
MAX_FAST_CHARS = 1 << 20


def fastokens_refusal(config: dict[str, Any]) -> str | None:
    """Why fastokens may not encode for a tokenizer.json's configuration, or None: every
    component must be in the closed list."""
    if config.get("truncation") is not None or config.get("padding") is not None:
        return "the tokenizer truncates or pads"
    reason = (
        _normalizer_refusal(config.get("normalizer"))
        or _pre_tokenizer_refusal(config.get("pre_tokenizer"))
        or _unverified_pre_tokenizer(config.get("pre_tokenizer"))
        or _settings_refusal("model", config.get("model"), SUPPORTED_MODEL)
        or _post_processor_refusal(config.get("post_processor"))
    )
    if reason:
        return reason
    for token in config.get("added_tokens") or []:
        reason = _settings_refusal(
            f"added token {str(token.get('content'))[:40]!r}",
            token,
            SUPPORTED_ADDED_FLAGS,
            ("id", "content"),
        )
        if reason:
            return reason
    return None


def _normalizer_refusal(normalizer: Any) -> str | None:
    if normalizer is None:
        return None
    if not isinstance(normalizer, dict):
        return "the normalizer is not an object"
    kind = normalizer.get("type")
    if kind == "Sequence":
        steps = normalizer.get("normalizers")
        if not isinstance(steps, list):
            return "a normalizer Sequence without its list"
        return next(filter(None, map(_normalizer_refusal, steps)), None)
    if kind not in SUPPORTED_NORMALIZERS or set(normalizer) != {"type"}:
        return f"the normalizer {str(kind)[:40]!r} is not one fastokens is used for"
    return None


def _pre_tokenizer_refusal(pre: Any) -> str | None:
    if pre is None:
        return None
    if not isinstance(pre, dict):
        return "the pre-tokenizer is not an object"
    kind = pre.get("type")
    if kind == "Sequence":
        steps = pre.get("pretokenizers")
        if not isinstance(steps, list):
            return "a pre-tokenizer Sequence without its list"
        return next(filter(None, map(_pre_tokenizer_refusal, steps)), None)
    if kind == "Split":
        pattern = pre.get("pattern")
        if not (
            isinstance(pattern, dict) and len(pattern) == 1 and set(pattern) <= {"Regex", "String"}
        ):
            return "a Split pre-tokenizer whose pattern is neither a Regex nor a String"
        return _settings_refusal(
            "the Split pre-tokenizer", pre, SUPPORTED_SPLIT, ("type", "pattern")
        )
    if kind == "ByteLevel":
        # trim_offsets moves offsets only, which kvtrace never reads
        return _settings_refusal(
            "the ByteLevel pre-tokenizer", pre, SUPPORTED_BYTE_LEVEL, ("type", "trim_offsets")
        )
    return f"the pre-tokenizer {str(kind)[:40]!r} is not one fastokens is used for"


def pre_tokenizer_key(pre: Any) -> str:
    """sha256 of a pre-tokenizer's configuration, keys sorted, without `trim_offsets` (it moves
    offsets only, which kvtrace never reads)."""

    def kept(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: kept(v) for k, v in value.items() if k != "trim_offsets"}
        if isinstance(value, list):
            return [kept(v) for v in value]
        return value

    text = json.dumps(kept(pre), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()


def _unverified_pre_tokenizer(pre: Any) -> str | None:
    if pre is None or pre_tokenizer_key(pre) in VERIFIED_PRE_TOKENIZERS:
        return None
    return (
        f"the pre-tokenizer (sha256 {pre_tokenizer_key(pre)[:16]}) is not one verified to split "
        "alike in fastokens' regex engine"
    )


def _post_processor_refusal(post: Any) -> str | None:
    if post is None:
        return None
    kind = post.get("type") if isinstance(post, dict) else None
    if kind not in SUPPORTED_POST_PROCESSORS:
        return f"the post-processor {str(kind)[:40]!r} is not one fastokens is used for"
    return None


def _settings_refusal(
    what: str, value: Any, allowed: dict[str, tuple], ignored: tuple[str, ...] = ("vocab", "merges")
) -> str | None:
    """Why value (a component's object) has a key or setting outside allowed, if it does."""
    if not isinstance(value, dict):
        return f"{what} is not an object"
    for key, setting in value.items():
        if key in ignored:
            continue
        if key not in allowed:
            return f"{what} has {key!r}, which fastokens is not used for"
        if not any(
            setting is choice or (type(setting) is type(choice) and setting == choice)
            for choice in allowed[key]
        ):
            return f"{what} has {key}={repr(setting)[:40]}, which fastokens is not used for"
    return None


class _Ids:
    """One text's ids, as FallibleTokenizer reads an encoding (its `ids`)."""

    __slots__ = ("ids",)

    def __init__(self, ids: np.ndarray):
        self.ids = ids


class VerifiedBackend:
    """fastokens where its ids are `tokenizers`' (reference), the reference elsewhere: what
    FallibleTokenizer and SegmentEncoder call (encode_batch_fast, and the reference's
    configuration for the segment cache's cuts)."""

    def __init__(self, fast: Any, reference: Any):
        self._fast = fast
        self._reference = reference
        self._lock = threading.Lock()
        self.fallback: str | None = None  # why the reference encodes from here on
        self.checked = 0  # sampled texts encoded by both

    @property
    def reference(self) -> Any:
        """The reference tokenizer itself: what a probe of its configuration encodes with."""
        return self._reference

    @property
    def pre_tokenizer(self) -> Any:
        return self._reference.pre_tokenizer

    def get_added_tokens_decoder(self) -> dict[int, Any]:
        return self._reference.get_added_tokens_decoder()

    def encode_batch_fast(self, texts: list[str], add_special_tokens: bool = False) -> list[Any]:
        """Each text's encoding (its ids); the reference's where a text is sampled, where the
        fast library fails and once it differed. The reference's errors are the call's."""
        if (
            self.fallback is not None
            or add_special_tokens
            or any(len(text) > MAX_FAST_CHARS for text in texts)
        ):
            return self._reference.encode_batch_fast(texts, add_special_tokens=add_special_tokens)
        try:
            fast = self._fast_batch(texts)
        except BaseException as err:  # a text over the regex's limits: the reference decides
            if not (isinstance(err, Exception) or _is_panic(err)):
                raise  # a stop (KeyboardInterrupt, a render overrun): not the texts'
            return self._reference.encode_batch_fast(texts, add_special_tokens=False)
        sampled = [i for i, text in enumerate(texts) if is_sampled(text)]
        if not sampled:
            return fast
        reference = self._reference.encode_batch_fast(
            [texts[i] for i in sampled], add_special_tokens=False
        )
        for i, encoding in zip(sampled, reference):
            if not np.array_equal(fast[i].ids, encoding.ids):
                self._fall_back(
                    f"a sampled text of {len(texts[i])} characters tokenized differently"
                )
                return self._reference.encode_batch_fast(texts, add_special_tokens=False)
            fast[i] = encoding
        with self._lock:
            self.checked += len(sampled)
        return fast

    encode_batch = encode_batch_fast  # the name FallibleTokenizer falls back on

    def _fast_batch(self, texts: list[str]) -> list[Any]:
        data, offsets = self._fast.encode_batch_flat(texts, add_special_tokens=False)
        ids = np.frombuffer(data, dtype=TOKEN_DTYPE)
        ends = np.frombuffer(offsets, dtype="<u8").tolist()
        return [_Ids(ids[start:end]) for start, end in zip(ends, ends[1:])]

    def _fall_back(self, reason: str) -> None:
        with self._lock:
            if self.fallback is None:
                self.fallback = reason
                _LOG.warning(
                    "tokenizer backend fastokens: %s from tokenizers; tokenizers encodes the "
                    "rest of this run",
                    reason,
                )


def is_sampled(text: str, one_in: int = CHECK_ONE_IN, key: int = CHECK_KEY) -> bool:
    """Whether a text is checked against the reference (one in one_in, by a hash keyed by key:
    the segment cache keys its own): decided by its content alone."""
    data = text.encode("utf-8", errors="surrogatepass")
    return xxhash.xxh3_64_intdigest(data, seed=key) % one_in == 0


def choose_backend(
    choice: str,
    tokenizer_json: bytes,
    config: dict[str, Any],
    reference: Any,
    extra_probes: list[str] = (),
) -> tuple[Any, str]:
    """(what encodes, why): the reference for `tokenizers`; for `auto` and `fastokens`, a
    VerifiedBackend where the configuration is in the closed list, fastokens loads it and every
    probe agrees, else the reference with the reason (`fastokens` chosen explicitly is refused
    in one line instead: ValueError)."""
    if choice not in BACKENDS:
        raise ValueError(f"tokenizer backend {choice!r}: one of {', '.join(BACKENDS)}")
    if choice == TOKENIZERS:
        return reference, "tokenizers, as chosen"
    reason = fastokens_refusal(config)
    backend = None
    if reason is None:
        backend, reason = _loaded(tokenizer_json, reference)
    if reason is None:
        reason = probe_difference(backend, reference, config, extra_probes)
    if reason is None:
        return backend, "fastokens, verified on its configuration and probe texts"
    if choice == FASTOKENS:
        raise ValueError(f"--tokenizer-backend fastokens: {reason}")
    return reference, f"tokenizers: fastokens refused ({reason})"


def _loaded(tokenizer_json: bytes, reference: Any) -> tuple[VerifiedBackend | None, str | None]:
    try:
        import fastokens
    except ImportError:
        return None, "fastokens is not installed"
    try:
        fast = fastokens.Tokenizer.from_json_str(tokenizer_json.decode("utf-8"))
    except Exception as err:  # its parser's refusal, whatever its type
        return None, f"fastokens does not load the file ({str(err)[:200]})"
    return VerifiedBackend(fast, reference), None


def probe_difference(
    backend: VerifiedBackend, reference: Any, config: dict[str, Any], extra: list[str] = ()
) -> str | None:
    """The first probe text the reference fails on, or whose ids differ between the two,
    described, or None: PROBES, RUNS, the tokenizer's added tokens alone, together and inside
    text, and extra (a rendered chat). The reference encodes through FallibleTokenizer: its
    failure is a reason, never a traceback."""
    added = [str(token.get("content")) for token in config.get("added_tokens") or []]
    probes = [*PROBES, *RUNS, *added, " ".join(added), f"x{''.join(added)}\n y", *extra]
    encoder, expected = FallibleTokenizer(reference), []
    for text in probes:  # one by one: the first failure decides, each costs ~0.3 s
        [want] = encoder.encode([text])
        expected.append(want)
        if isinstance(want, TokenizerFailure):
            return (
                f"tokenizers fails on the probe {text[:20]!r} ({len(text)} characters: "
                f"{want.reason[:120]}), which fastokens could encode"
            )
    try:
        fast = backend._fast_batch(probes)
    except BaseException as err:
        if not (isinstance(err, Exception) or _is_panic(err)):
            raise
        return f"fastokens fails on a probe text ({str(err)[:200]})"
    for text, got, want in zip(probes, fast, expected):
        if not np.array_equal(got.ids, token_ids(want)):
            return f"the probe {text[:60]!r} tokenizes differently"
    return None
