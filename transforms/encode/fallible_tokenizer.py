"""Every call into the Rust tokenizer, fallible by construction.

The tokenizer can fail on a text instead of encoding it: a pre-tokenizer regex over Oniguruma's
retry limit (Qwen3's and DeepSeek-R1's `\\s*[\\r\\n]+` on 12 M spaces, a folder's own `(a|a)+b`
on 41 characters) makes the Rust side panic, and pyo3 raises PanicException, a BaseException
that no `except Exception` catches, so one record ended the whole run with a traceback. Here a
failed call is retried text by text, so that only the texts it fails on fail: each becomes a
TokenizerFailure with its reason (a `tokenizer_error` dead letter), the others keep their ids.
Whether the tokenizer tokenizes at all is decided once, at load, on kvtrace's own probe text
(tokenize.load_tokenizer), never by which texts a worker happens to be given first; after that
every failure is its text's own, and a run where every record fails is refused by
`--max-rejected-fraction`, judged over the whole input. Rust's own report of the panic, written
to the process's stderr before Python sees it, is the native stderr's (native_stderr.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from kvtrace.transforms.encode.blocks import TOKEN_DTYPE, token_bytes
from kvtrace.transforms.encode.native_stderr import capture_native_stderr

MAX_REASON_CHARS = 300


@dataclasses.dataclass(frozen=True)
class TokenizerFailure:
    """A text the tokenizer failed on, and why (the tokenizer's own words)."""

    reason: str


class FallibleTokenizer:
    """A Rust tokenizer (tokenizers.Tokenizer) through which every encode goes: texts in, each
    text's token bytes (uint32 little-endian ids, blocks.token_bytes) or its failure out."""

    def __init__(self, backend: Any):
        self._encode_batch = getattr(backend, "encode_batch_fast", backend.encode_batch)
        capture_native_stderr()

    def encode(self, texts: list[str]) -> list[bytes | TokenizerFailure]:
        """Each text's token bytes, no special tokens added, in one batched call; where that
        call fails, each text on its own."""
        if not texts:
            return []
        try:
            return self._call(texts)  # type: ignore[return-value]
        except _Failed:
            return [self._one(text) for text in texts]

    def encode_or_raise(self, texts: list[str]) -> list[bytes]:
        """encode, for texts kvtrace wrote itself (probes, vocabulary): a failure is the
        tokenizer's, said in one line (ValueError)."""
        encoded = self.encode(texts)
        for result in encoded:
            if isinstance(result, TokenizerFailure):
                raise ValueError(f"the tokenizer fails on kvtrace's own text: {result.reason}")
        return encoded  # type: ignore[return-value]

    def _one(self, text: str) -> bytes | TokenizerFailure:
        try:
            return self._call([text])[0]
        except _Failed as failed:
            return TokenizerFailure(failed.reason)

    def _call(self, texts: list[str]) -> list[bytes]:
        try:
            encodings = self._encode_batch(texts, add_special_tokens=False)
        except BaseException as err:  # a Rust panic is a BaseException (pyo3's PanicException)
            if not (isinstance(err, Exception) or _is_panic(err)):
                raise  # a stop (KeyboardInterrupt, a render overrun): not the text's
            raise _Failed(f"{type(err).__name__}: {str(err)[:MAX_REASON_CHARS]}") from None
        return [token_bytes(encoding.ids) for encoding in encodings]


def token_ids(data: bytes) -> np.ndarray:
    """The ids in token bytes."""
    return np.frombuffer(data, dtype=TOKEN_DTYPE)


class _Failed(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _is_panic(err: BaseException) -> bool:
    """pyo3's PanicException, which pyo3 makes at run time (no module to import it from)."""
    kind = type(err)
    return kind.__name__ == "PanicException" and kind.__module__ == "pyo3_runtime"
