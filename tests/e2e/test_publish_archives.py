"""What docs/AUDIT.md tells an operator to publish with: archives that carry no change time
(ctime, which no call sets and so no gate bounds) and no account names."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("tar") is None, reason="no tar here")
# A GNU header's atime and ctime fields, filled only by --incremental (ustar has none: only mtime)
GNU_TIMES = slice(345, 369)


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "manifest.json").write_text("{}\n")
    return folder


def _tar(tmp_path: Path, *options: str) -> Path:
    archive = tmp_path / "published.tar"
    subprocess.run(["tar", *options, "-cf", str(archive), "-C", str(tmp_path), "out"], check=True)
    return archive


def test_pax_archives_record_ctime_unless_told_to_drop_it(tmp_path):
    _folder(tmp_path)
    with tarfile.open(_tar(tmp_path, "--format=posix")) as tar:
        assert all("ctime" in member.pax_headers for member in tar)
    with tarfile.open(
        _tar(tmp_path, "--format=posix", "--pax-option=delete=ctime,delete=atime")
    ) as tar:
        assert not any({"ctime", "atime"} & set(member.pax_headers) for member in tar)


@pytest.mark.parametrize("form", ["gnu", "ustar"])
def test_gnu_and_ustar_archives_hold_no_ctime_and_no_names_when_told(tmp_path, form):
    _folder(tmp_path)
    archive = _tar(tmp_path, f"--format={form}", "--owner=0", "--group=0", "--numeric-owner")
    data = archive.read_bytes()
    headers = [
        data[at : at + 512]
        for at in range(0, len(data), 512)
        if data[at + 257 : at + 262] == b"ustar"
    ]
    assert len(headers) == 2
    if form == "gnu":
        assert all(not header[GNU_TIMES].strip(b"\0 ") for header in headers)
    with tarfile.open(archive) as tar:
        assert [(m.uname, m.gname, m.uid, m.gid) for m in tar] == [("", "", 0, 0)] * 2
