"""Published files and folders carry mtimes derived from their content (write/manifest.py)."""

from __future__ import annotations

import hashlib
import os
import shutil

from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms.write.manifest import (
    CONTENT_TIME_BASE,
    content_time,
    folder_content_time,
    set_content_times,
)
from kvtrace.transforms.write.publish import publish_folder, staging_folder


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
