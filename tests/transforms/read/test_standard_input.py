"""Standard input spooled to a private file without a name, read as the form it is, bounded by its
file system's free space, gone when the run ends (however it ends: the kernel frees it)."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import multiprocessing
import os
import shutil
import struct
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtrace.transforms.errors import ConfigError
from kvtrace.transforms.read import decompress, paths
from kvtrace.transforms.read.decompress import spooled_standard_input
from kvtrace.transforms.read.parquet_frame import framed_as_parquet

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

LOG = b'{"timestamp": 1, "prompt": "hi"}\n' * 1000
# A zstd skippable frame, as pzstd and seekable-format writers put before their frames.
SKIPPABLE = struct.pack("<II", 0x184D2A5F, 4) + b"meta"
COMPRESSED = [
    (".jsonl.gz", gzip.compress),
    (".jsonl.bz2", bz2.compress),
    (".jsonl.xz", lzma.compress),
    (".jsonl.zst", zstd.compress),
    (".jsonl.zst", lambda data: SKIPPABLE + zstd.compress(data)),
]


def parquet_bytes() -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table({"prompt": ["hi"], "timestamp": [1]}), sink)
    return sink.getvalue()


@pytest.mark.parametrize(
    "data, name",
    [
        (LOG, "stdin.jsonl"),
        (b"\xef\xbb\xbf" + LOG, "stdin.jsonl"),
        (gzip.compress(LOG), "stdin.jsonl.gz"),
        (bz2.compress(LOG), "stdin.jsonl.bz2"),
        (lzma.compress(LOG), "stdin.jsonl.xz"),
        (zstd.compress(LOG), "stdin.jsonl.zst"),
        (SKIPPABLE + zstd.compress(LOG), "stdin.jsonl.zst"),
        (zstd.compress(b""), "stdin.jsonl.zst"),
        (parquet_bytes(), "stdin.parquet"),
        (b"", "stdin.jsonl"),
        # Damaged first lines that start like a magic number are lines, as in their file.
        (b"BZh91AY&SY log start\n" + LOG, "stdin.jsonl"),
        (b"PAR1 log start\n" + LOG + b"PAR1", "stdin.jsonl"),
        # Framed as Parquet: its footer is its reader's to parse (a damaged_file letter).
        (b"PAR1 not thrift" + (11).to_bytes(4, "little") + b"PAR1", "stdin.parquet"),
        (b"\x1f\x8b\x08\x00 damaged\n" + LOG, "stdin.jsonl"),
        (b"\xfd7zXZ\x00 damaged\n" + LOG, "stdin.jsonl"),
        (b"\x28\xb5\x2f\xfd damaged\n" + LOG, "stdin.jsonl"),
    ],
    ids=[
        "plain",
        "bom",
        "gzip",
        "bz2",
        "xz",
        "zstd",
        "zstd-skippable",
        "zstd-empty",
        "parquet",
        "empty",
        "bz2-like-line",
        "parquet-like-lines",
        "parquet-framed-damaged",
        "gzip-like-line",
        "xz-like-line",
        "zstd-like-line",
    ],
)
def test_the_spooled_copy_holds_the_bytes_read_as_their_form(data, name, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    with spooled_standard_input(io.BytesIO(data)) as path:
        assert decompress.form_name(path) == name
        with open(path, "rb") as spooled:
            assert spooled.read() == data
        assert os.stat(path).st_mode & 0o777 == 0o600  # this user's alone
        assert os.stat(path).st_nlink == 0  # no name: nothing of it outlives the process
        assert list(tmp_path.iterdir()) == []
        spool = (os.stat(path).st_dev, os.stat(path).st_ino)
    # Closed: its /proc/PID/fd name is gone, or names another file another thread opened since
    # (a descriptor's number is reused at once).
    assert not os.path.exists(path) or (os.stat(path).st_dev, os.stat(path).st_ino) != spool


def test_input_beyond_the_free_space_is_a_one_line_error_and_leaves_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    free = shutil.disk_usage(tmp_path).free
    monkeypatch.setattr(decompress, "SPOOL_RESERVE_BYTES", free - 3 * decompress.SPOOL_STEP_BYTES)

    class Endless(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def readinto(self, buffer) -> int:
            buffer[:] = b"x" * len(buffer)
            return len(buffer)

    endless = io.BufferedReader(Endless())
    with pytest.raises(ConfigError, match="standard input is over .* give --input a file"):
        with spooled_standard_input(endless):
            pass
    assert list(tmp_path.iterdir()) == []


def shown_name_in_a_new_process(path: str) -> str:
    """input_name as a worker started afresh (spawned, as the local engine's are from a forkserver)
    sees it: nothing of the spooling process's memory, only what it inherits."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(decompress.input_name, (path,))


def test_the_spooled_copy_is_named_dash_in_every_process_and_only_while_spooled():
    with spooled_standard_input(io.BytesIO(LOG)) as path:
        assert decompress.input_name(path) == "-"
        assert shown_name_in_a_new_process(path) == "-"
        assert decompress.input_name(path + ".other") == path + ".other"
    assert decompress.input_name(path) == path
    assert decompress.SPOOLED_STDIN_ENV not in os.environ


def read_in_a_new_process(path: str) -> tuple[str | None, bytes]:
    """The codec and decoded bytes a worker started afresh reads at the spool's path."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_read_as_its_form, (path,))


def _read_as_its_form(path: str) -> tuple[str | None, bytes]:
    with paths.open_stream(path) as stream:
        return paths.compression_of(path), stream.read()


def test_a_new_process_reads_the_spooled_copy_as_its_form():
    """The copy has no name: every process of the run (Beam's spawned workers, the local
    engine's clean ones) reads it at this one's descriptor, as the form it was found to be."""
    with spooled_standard_input(io.BytesIO(gzip.compress(LOG))) as path:
        assert read_in_a_new_process(path) == ("gzip", LOG)


def _spooled_form(data: bytes) -> tuple[str, bytes | None]:
    """The suffix standard input's data is spooled under, and what the file reader of that name
    reads from it: the decoded bytes up to any damage (None if damaged before its first byte),
    the Parquet rows, or the plain bytes."""
    with spooled_standard_input(io.BytesIO(data)) as path:
        suffix = decompress.form_name(path).removeprefix("stdin")
        if paths.is_parquet(path):
            try:
                with paths.parquet_file(path, 1 << 20) as (_, parquet):
                    return suffix, str(parquet.read().to_pylist()).encode()
            except (ValueError, pa.ArrowException):
                return suffix, None  # the reader's damaged_file letter
        with paths.open_stream(path) as stream:
            read = stream.read()
            return suffix, None if paths.broken_off(stream) and not read else read


_MAGICS = [b"\x1f\x8b", b"\x1f\x8b\x08", b"BZh9", b"BZh91AY&SY", b"\xfd7zXZ\x00", b"PAR1"]
_MAGICS += [b"\x28\xb5\x2f\xfd", SKIPPABLE[:4], SKIPPABLE]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([b"", *_MAGICS]), st.binary(max_size=200))
def test_any_input_is_spooled_as_a_form_its_reader_takes_or_as_jsonl(magic, rest):
    """For any bytes, most of them opening like a magic number: the form standard input is
    spooled as is one whose reader takes it (bytes decoded, or a clean end, before any damage),
    Parquet by its frame alone (its footer parsed by its reader, within its bound), or it is
    plain JSONL (bad lines then dead letters, as in the file)."""
    data = magic + rest
    suffix, read = _spooled_form(data)
    framed = framed_as_parquet(io.BytesIO(data))
    assert (suffix == ".parquet") == framed
    assert suffix in (".jsonl", ".parquet") or read is not None


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(range(len(COMPRESSED))), st.binary(max_size=2000))
def test_any_compressed_log_is_spooled_as_its_form_and_reads_whole(which, payload):
    suffix, compress = COMPRESSED[which]
    assert _spooled_form(compress(payload)) == (suffix, payload)


@given(
    st.sampled_from(["", "BZh9", "BZh91AY&SY", "PAR1", "P*M\x18"]),  # magic numbers in text
    st.text(max_size=80).filter(lambda line: "\n" not in line),
)
def test_a_damaged_first_line_before_json_lines_is_plain_jsonl(opening, rest):
    """Whatever a first line says, JSON lines after it make the input a log: no decoder reads
    them, so no form but JSONL takes the input (a lone magic number once took it)."""
    line = opening + rest
    data = line.encode() + b"\n" + LOG
    assert _spooled_form(data) == (".jsonl", data)
