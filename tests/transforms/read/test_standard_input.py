"""Standard input spooled to a file named for its form, bounded by its file system's free space,
gone when the run ends."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import multiprocessing
import os
import shutil
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvtrace.transforms.errors import ConfigError
from kvtrace.transforms.read import decompress
from kvtrace.transforms.read.decompress import spooled_standard_input

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

LOG = b'{"timestamp": 1, "prompt": "hi"}\n' * 1000


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
        (parquet_bytes(), "stdin.parquet"),
        (b"", "stdin.jsonl"),
    ],
    ids=["plain", "bom", "gzip", "bz2", "xz", "zstd", "parquet", "empty"],
)
def test_the_spooled_copy_holds_the_bytes_under_the_name_of_their_form(data, name):
    with spooled_standard_input(io.BytesIO(data)) as path:
        assert os.path.basename(path) == name
        with open(path, "rb") as spooled:
            assert spooled.read() == data
        assert os.stat(os.path.dirname(path)).st_mode & 0o077 == 0  # this user's alone
    assert not os.path.exists(os.path.dirname(path))


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
    """input_name as a worker started afresh (spawned, as Beam's multi_processing ones are)
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
