"""Compressed logs decoded as a stream that never loses what it has decoded.

A decoder library that raises when its input breaks off drops whatever it had decoded but not yet
returned (pyarrow's streams: up to a MiB of complete records). Here each compressed chunk is
decoded as it is read, so every byte before the break reaches the reader; the break itself is
recorded (`broken`) and the stream then simply ends. Concatenated members (gzip, bzip2) and
frames (zstd) are read one after another, as the command-line tools do.

Damage is found where the format can find it: bzip2 checks each block before releasing it, zstd
frames carry a checksum when written with one, gzip checks its CRC at each member's end, so bytes
decoded from a damaged gzip member may pass before the damage is known (they are parsed like any
record: garbage becomes an invalid_json dead letter).
"""

from __future__ import annotations

import bz2
import io
import zlib
from typing import IO, Any

import zstandard

# Compressed bytes decoded per step: small enough that a highly compressible chunk (a bomb)
# decodes to a bounded burst, large enough that per-call overhead vanishes.
COMPRESSED_CHUNK_BYTES = 64 << 10
_GZIP_WBITS = 31  # zlib reads the gzip header and trailer


def _decoder(codec: str) -> Any:
    if codec == "gzip":
        return zlib.decompressobj(_GZIP_WBITS)
    if codec == "bz2":
        return bz2.BZ2Decompressor()
    if codec == "zstd":
        return zstandard.ZstdDecompressor().decompressobj()
    raise ValueError(f"unknown codec {codec!r}")


class DecodedStream(io.RawIOBase):
    """The decompressed bytes of a compressed file, up to where it breaks off or is corrupt.

    `broken` is None for a complete file, else why decoding stopped."""

    def __init__(self, raw: IO[bytes], codec: str):
        super().__init__()
        self._raw = raw
        self._codec = codec
        self._decoder = _decoder(codec)
        self._member_started = False  # input went into the current member/frame
        self._pending = b""
        self._done = False
        self.broken: str | None = None
        self.ends_with_newline = True

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending and not self._done:
            self._decode_more()
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        if size:
            self.ends_with_newline = self._pending[size - 1:size] == b"\n"
        self._pending = self._pending[size:]
        return size

    def _decode_more(self) -> None:
        data = self._raw.read(COMPRESSED_CHUNK_BYTES)
        if not data:
            self._done = True
            if self._member_started and not self._decoder.eof:
                self.broken = "the compressed stream ends before its end marker (truncated)"
            return
        decoded: list[bytes] = []
        try:
            self._feed(data, decoded)
        except (zlib.error, OSError, EOFError, ValueError, zstandard.ZstdError) as err:
            self._done = True
            self.broken = f"corrupt compressed data: {err}"
        self._pending = b"".join(decoded)  # what decoded before any damage is kept

    def _feed(self, data: bytes, decoded: list[bytes]) -> None:
        while data:
            self._member_started = True
            decoded.append(self._decoder.decompress(data))
            if not self._decoder.eof:
                return
            data = self._decoder.unused_data  # the next member or frame
            self._decoder = _decoder(self._codec)
            self._member_started = False

    def close(self) -> None:
        self._raw.close()
        super().close()
