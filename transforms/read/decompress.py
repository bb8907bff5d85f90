"""Compressed logs decoded as a stream that never loses what it has decoded, in bounded steps.

A decoder library that raises when its input breaks off drops whatever it had decoded but not yet
returned (pyarrow's streams: up to a MiB of complete records). Here each compressed chunk is
decoded as it is read, so every byte before the break reaches the reader; the break itself is
recorded (`broken`) and the stream then simply ends. Concatenated members (gzip, bzip2, xz) and
frames (zstd) are read one after another, as the command-line tools do.

Every decoding step returns at most DECODED_CHUNK_BYTES, however compressible its input: a
517-byte bzip2 of a GiB line is a thousand bounded steps, never a GiB in memory. What a step
returned is handed out through a view, so nothing already held is copied again.

Damage is found where the format can find it: bzip2 checks each block before releasing it, zstd
frames carry a checksum when written with one, gzip checks its CRC at each member's end, so bytes
decoded from a damaged gzip member may pass before the damage is known (they are parsed like any
record: garbage becomes an invalid_json dead letter).
"""

from __future__ import annotations

import bz2
import contextlib
import io
import lzma
import os
import shutil
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterator
from typing import IO, Any

from kvtrace.transforms import storage
from kvtrace.transforms.errors import ConfigError
from kvtrace.transforms.read.parquet_frame import framed_as_parquet

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

# Compressed bytes read per step: large enough that per-call overhead vanishes.
COMPRESSED_CHUNK_BYTES = 64 << 10
# Decoded bytes per step: the output bound of every decoder, whatever the compression ratio.
DECODED_CHUNK_BYTES = 1 << 20
# The most a decoder's own state may take: xz's dictionary (64 MiB at `xz -9`) and zstd's
# window (libzstd's default limit) are sized by the file's header, which a hostile file sets
# at GiBs. A file asking for more is corrupt as far as reading goes: a damaged_file.
MAX_DECODER_STATE_BYTES = 128 << 20
_ZSTD_WINDOW_LOG_MAX = MAX_DECODER_STATE_BYTES.bit_length() - 1
_GZIP_WBITS = 31  # zlib reads the gzip header and trailer (its window: 32 KiB)
_BAD_PADDING = "corrupt compressed data: xz stream padding that is not a multiple of 4 bytes"
_CORRUPT = (zlib.error, OSError, EOFError, ValueError, lzma.LZMAError, zstd.ZstdError)


class _Gzip:
    """zlib's decoder with the interface bz2, lzma and zstd share: input held by the decoder,
    `needs_input` once it has none left to decode."""

    def __init__(self) -> None:
        self._decoder = zlib.decompressobj(_GZIP_WBITS)
        self.needs_input = True

    def decompress(self, data: bytes, max_length: int) -> bytes:
        out = self._decoder.decompress(self._decoder.unconsumed_tail + data, max_length)
        # A full output may leave decoded bytes inside zlib with no input left: ask again.
        self.needs_input = not self._decoder.unconsumed_tail and len(out) < max_length
        return out

    @property
    def eof(self) -> bool:
        return self._decoder.eof

    @property
    def unused_data(self) -> bytes:
        return self._decoder.unused_data


def _decoder(codec: str) -> Any:
    if codec == "gzip":
        return _Gzip()
    if codec == "bz2":
        return bz2.BZ2Decompressor()
    if codec == "zstd":
        return zstd.ZstdDecompressor(
            options={zstd.DecompressionParameter.window_log_max: _ZSTD_WINDOW_LOG_MAX}
        )
    if codec == "xz":  # .xz and legacy .lzma alike
        return lzma.LZMADecompressor(memlimit=MAX_DECODER_STATE_BYTES)
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
        self._carried = b""  # input past the end of the last member: the next one's start
        self._members_ended = 0
        self._padding = 0  # xz Stream Padding since the last member's end (NUL bytes)
        self._pending = memoryview(b"")
        self._position = 0  # of the next byte of _pending to hand out
        self._done = False
        self.broken: str | None = None
        self.ends_with_newline = True
        self.decoded = 0  # bytes decoded so far, read ahead included (paths.stored_share)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._position == len(self._pending) and not self._done:
            self._decode_more()
        size = min(len(buffer), len(self._pending) - self._position)
        end = self._position + size
        buffer[:size] = self._pending[self._position : end]
        if size:
            self.ends_with_newline = self._pending[end - 1] == ord("\n")
        self._position = end
        return size

    def _decode_more(self) -> None:
        data = b""
        if self._decoder.needs_input:
            data, self._carried = self._carried or self._raw.read(COMPRESSED_CHUNK_BYTES), b""
            if not data:
                self._done = True
                if self._member_started and not self._decoder.eof:
                    self.broken = "the compressed stream ends before its end marker (truncated)"
                elif self._padding % 4:
                    self.broken = _BAD_PADDING
                return
            if not self._member_started and self._codec == "xz" and self._members_ended:
                data = self._skip_stream_padding(data)
                if not data:
                    return
        self._member_started = True
        try:
            decoded = self._decoder.decompress(data, DECODED_CHUNK_BYTES)
        except _CORRUPT as err:
            decoded = b""
            self._done = True
            self.broken = f"corrupt compressed data: {err}"
        self._pending, self._position = memoryview(decoded), 0
        self.decoded += len(decoded)
        if not self._done and self._decoder.eof:
            self._carried = self._decoder.unused_data  # the next member or frame
            self._decoder = _decoder(self._codec)
            self._member_started = False
            self._members_ended += 1
            self._padding = 0

    def _skip_stream_padding(self, data: bytes) -> bytes:
        """The .xz format lets NUL bytes, a multiple of 4, follow any stream (xz -dc reads past
        them): skip them; a count that is no multiple of 4 is damage, as xz says."""
        rest = data.lstrip(b"\0")
        self._padding += len(data) - len(rest)
        if rest and self._padding % 4:
            self._done = True
            self.broken = _BAD_PADDING
            return b""
        return rest

    def close(self) -> None:
        self._raw.close()
        super().close()


# ---- Standard input (`--input -`) -------------------------------------------------------------

STANDARD_INPUT = "-"
# Standard input has no name to tell its form by, nor has its spooled copy: its readers are told
# the suffix of the first form whose reader takes it (standard_input_form, form_name).
CODEC_SUFFIXES = {"gzip": ".jsonl.gz", "bz2": ".jsonl.bz2", "xz": ".jsonl.xz", "zstd": ".jsonl.zst"}
PARQUET_SUFFIX = ".parquet"
PLAIN_SUFFIX = ".jsonl"
SPOOL_STEP_BYTES = 1 << 20
# What the spool leaves free on its file system: a stream that never ends (or outgrows the
# disk) stops here with a one-line error, never by filling the disk under the run's own output.
SPOOL_RESERVE_BYTES = 1 << 30
# The spooled copy's path (/proc/PID/fd/N: the copy has no name) and form, kept in the
# environment so that every worker the run starts, forked or spawned (the local engine's, from
# a forkserver), inherits them: they read it as its form, and their letters name the input as the
# user gave it, `-`, never the path of the moment, so the same input gives the same letters on
# every engine. Set by spooled_standard_input alone, for the run's length.
SPOOLED_STDIN_ENV = "KVTRACE_SPOOLED_STDIN"
SPOOLED_STDIN_FORM_ENV = "KVTRACE_SPOOLED_STDIN_FORM"


def input_name(path: str) -> str:
    """The name the run shows for the input at path: `-` for standard input's spooled copy."""
    return STANDARD_INPUT if path == os.environ.get(SPOOLED_STDIN_ENV) else path


def form_name(path: str) -> str:
    """The name whose suffix tells a reader the file's form: its path, but for standard input's
    spooled copy, which has no name, `stdin` and the suffix of the form it was found to be."""
    if path != os.environ.get(SPOOLED_STDIN_ENV):
        return path
    return "stdin" + os.environ.get(SPOOLED_STDIN_FORM_ENV, PLAIN_SUFFIX)


def standard_input_form(path: str) -> str:
    """The suffix of the form the whole file at path is, as the readers check it (content_form)."""
    return content_form(lambda: open(path, "rb"))


def content_form(open_stored: Callable[[], IO[bytes]]) -> str:
    """The suffix of the form a file's content is, told by its bytes alone (open_stored opens
    them, seekable, as stored, once a form): Parquet when framed as Parquet (its footer left
    to the reader's bounds); a compressed log when its codec's decoder returns bytes, or ends
    cleanly, before any damage (gzip and bzip2 check their headers, xz and zstd their stream
    and frame headers, zstd skippable frames included); else plain JSONL, whose bad lines are
    letters. A damaged first line that merely starts like a magic number is thus JSONL, as its
    file is; so is an empty file (every codec's decoder ends cleanly on nothing)."""
    with open_stored() as raw:
        if not raw.read(1):
            return PLAIN_SUFFIX
        if _is_parquet(raw):
            return PARQUET_SUFFIX
    for codec, suffix in CODEC_SUFFIXES.items():
        with DecodedStream(open_stored(), codec) as decoded:
            if decoded.read(1) or decoded.broken is None:
                return suffix
    return PLAIN_SUFFIX


def _is_parquet(raw: IO[bytes]) -> bool:
    """Whether the file is framed as Parquet (parquet_frame.framed_as_parquet: its magic at
    both ends, a footer length that fits). Its footer is left to the Parquet reader, which
    bounds it by --max-record-bytes before Arrow parses it: a damaged or oversized footer is
    that reader's dead letter, never parsed here unbounded in the CLI's process."""
    raw.seek(0)
    return framed_as_parquet(raw)


@contextlib.contextmanager
def spooled_standard_input(source: IO[bytes] | None = None) -> Iterator[str]:
    """Standard input copied, 1 MiB at a time, to a private file without a name on the
    temporary directory's file system ($TMPDIR), which the run reads like any other (in byte
    ranges, by every worker, its records in any order to the same output) at its descriptor's
    path. The kernel frees it once this process closes it, however the run ends (a SIGKILL
    included): no copy of the log is left behind. Refused in one line when it is a terminal (the
    run would wait for typing) or would leave its file system less than SPOOL_RESERVE_BYTES
    free."""
    stream = source if source is not None else sys.stdin.buffer
    if stream.isatty():
        raise ConfigError("--input - reads standard input, which is a terminal: pipe a log in")
    folder = tempfile.gettempdir()
    with _spooling_to(folder):
        spool = storage.create_unnamed(folder)  # owner-only from its first byte
    with spool:
        spooled = _spool(stream, spool, folder)
        os.environ[SPOOLED_STDIN_FORM_ENV] = standard_input_form(spooled)
        os.environ[SPOOLED_STDIN_ENV] = spooled
        try:
            yield spooled
        finally:
            os.environ.pop(SPOOLED_STDIN_ENV, None)
            os.environ.pop(SPOOLED_STDIN_FORM_ENV, None)


def _spool(stream: IO[bytes], spool: IO[bytes], folder: str) -> str:
    """stream copied to spool, on folder's file system; the path every process reads it at."""
    budget = shutil.disk_usage(folder).free - SPOOL_RESERVE_BYTES
    written = 0
    with _spooling_to(folder):
        while chunk := stream.read(SPOOL_STEP_BYTES):
            written += len(chunk)
            if written > budget:
                raise ConfigError(
                    f"standard input is over {max(budget, 0)} bytes, what {folder}'s file "
                    f"system holds less {SPOOL_RESERVE_BYTES >> 30} GiB: give --input a "
                    "file, or set TMPDIR to a larger disk"
                )
            spool.write(chunk)
        spool.flush()  # read back by path, past this file object's buffer
    return storage.descriptor_path(spool)


@contextlib.contextmanager
def _spooling_to(folder: str) -> Iterator[None]:
    """An OSError as a line naming the spool's folder, its number kept: storage running out is a
    job that stopped (the CLI's exit 1), an unwritable folder a refusal (2), as for every other
    output."""
    try:
        yield
    except OSError as err:
        raise OSError(
            err.errno, f"standard input could not be spooled to {folder}: {err.strerror}"
        ) from None
