"""The salt a run's workers load is the run's: a source pinned by the launcher refuses another
salt wherever it is loaded again (salt.SaltSource.load), as a worker refuses tokenizer files
that are not the run's."""

from __future__ import annotations

import os

import pytest

from kvtrace.transforms.encode.blocks import salt_fingerprint
from kvtrace.transforms.encode.encode_requests import EncodeOptions, open_encoder
from kvtrace.transforms.encode.salt import SALT_ENV, SaltSource, salt_source
from kvtrace.transforms.errors import JobStopped

RUNS = b"s" * 32
ROTATED = b"r" * 32


def test_an_encoder_opened_on_another_salt_than_the_runs_is_refused(tiny_tokenizer, tmp_path):
    """The file rotated after the launcher pinned it (a Secret updated under a running
    stream): a worker's encoder refuses it before it keys a hash; the run's salt back is
    taken again (what is compared is the salt, not the file)."""
    path = tmp_path / "salt"
    path.write_bytes(RUNS)
    options = EncodeOptions(tiny_tokenizer, SaltSource("file", str(path)).pinned(), block_size=4)
    open_encoder(options)
    path.write_bytes(ROTATED)
    with pytest.raises(JobStopped, match=f"--salt-file {path} is not the one this run began"):
        open_encoder(options)
    path.write_bytes(RUNS)
    open_encoder(options)


def test_a_worker_with_another_salt_in_its_environment_is_refused(monkeypatch):
    """$KVTRACE_SALT on a worker pool's machine other than the launcher's."""
    monkeypatch.setenv(SALT_ENV, RUNS.decode())
    source = SaltSource("env", SALT_ENV).pinned()
    assert source.load() == RUNS
    monkeypatch.setenv(SALT_ENV, ROTATED.decode())
    with pytest.raises(JobStopped, match=rf"\${SALT_ENV} is not the one this run began with"):
        source.load()


def test_a_pinned_source_carries_the_public_fingerprint_never_the_salt(tmp_path):
    path = tmp_path / "salt"
    path.write_bytes(RUNS)
    unpinned = SaltSource("file", str(path))
    pinned = unpinned.pinned()
    assert pinned.fingerprint == salt_fingerprint(RUNS)
    assert RUNS.decode() not in repr(pinned) and pinned.inline == b""
    path.write_bytes(ROTATED)
    assert unpinned.load() == ROTATED  # unpinned (audit, id-map): whatever the source holds


@pytest.mark.parametrize("raw", [RUNS, RUNS + b"\n", b" " + RUNS + b"\r\n"])
def test_one_secret_is_one_salt_as_a_file_and_as_the_environment(monkeypatch, tmp_path, raw):
    """The same bytes given as a file and as $KVTRACE_SALT (a Secret made from the file) are
    the same salt, the newline a file ends in dropped by both."""
    path = tmp_path / "salt"
    path.write_bytes(raw)
    monkeypatch.setenv(SALT_ENV, raw.decode())
    assert SaltSource("file", str(path)).load() == SaltSource("env", SALT_ENV).load() == RUNS


def test_a_salt_of_random_bytes_in_the_environment_is_its_bytes(monkeypatch, tmp_path):
    """Bytes that are not UTF-8 (a Secret of `head -c 32 /dev/urandom`) are read as they are,
    as a file's are: no codec error."""
    raw = bytes(range(128, 160))
    path = tmp_path / "salt"
    path.write_bytes(raw)
    monkeypatch.setenv(SALT_ENV, os.fsdecode(raw))
    assert salt_source().load() == SaltSource("file", str(path)).load() == raw
