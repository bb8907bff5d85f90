"""Published files and folders carry mtimes derived from their content (write/manifest.py)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile

from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms.write.manifest import (
    CONTENT_TIME_BASE,
    content_time,
    folder_content_time,
    set_content_times,
)
from kvtrace.transforms.write.publish import file_output, publish_folder, staging_folder


@given(st.binary(max_size=64), st.binary(max_size=64))
def test_a_time_is_a_function_of_the_content_within_its_span(a, b):
    times = [content_time(hashlib.sha256(x).hexdigest()) for x in (a, b)]
    assert all(CONTENT_TIME_BASE <= t < CONTENT_TIME_BASE + (1 << 24) for t in times)
    assert (a == b) <= (times[0] == times[1])


def test_a_published_folder_carries_content_times_a_plain_copy_loses(tmp_path):
    staging = staging_folder(str(tmp_path / "out"), "run1")
    os.makedirs(staging)
    for name, data in (("a.json", b"{}\n"), ("b.jsonl", b"1\n")):
        with open(os.path.join(staging, name), "wb") as handle:
            handle.write(data)
    publish_folder(staging, str(tmp_path / "out"))
    out = tmp_path / "out"
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir()}
    for name, digest in digests.items():
        assert os.stat(out / name).st_mtime_ns == content_time(digest) * 10**9
    assert os.stat(out).st_mtime_ns == folder_content_time(digests) * 10**9
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, copy_function=shutil.copyfile)  # times not preserved
    assert os.stat(copy / "a.json").st_mtime_ns != os.stat(out / "a.json").st_mtime_ns
    set_content_times(str(copy))
    assert all(os.stat(copy / n).st_mtime_ns == os.stat(out / n).st_mtime_ns for n in digests)


@given(st.binary(max_size=64))
def test_a_published_file_and_its_report_carry_their_content_times(data):
    """The one write protocol stamps a command's single file (and the report published with it)
    as it stamps a folder's files: the mtime a copy keeps is the content's, not the run's."""
    with tempfile.TemporaryDirectory() as folder:
        out, side = os.path.join(folder, "out.jsonl"), os.path.join(folder, "out.json")
        with file_output(side) as report, file_output(out, report=report) as staged:
            staged.write(data)
            report.write(data + b"\n")
        for path in (out, side):
            with open(path, "rb") as handle:
                digest = hashlib.sha256(handle.read()).hexdigest()
            assert os.stat(path).st_mtime_ns == content_time(digest) * 10**9
