"""make_stream_folder: a stream's folder kvtrace makes inherits nothing of its parent; one the
user made is theirs, checked and never changed."""

from __future__ import annotations

import os

import pytest

from kvtrace.transforms.write.publish import OutputRefused


@pytest.mark.beam
def test_an_existing_output_is_checked_never_changed(tmp_path):
    from kvtrace.pipelines.anonymize_streaming import make_stream_folder

    mine = tmp_path / "mine"
    mine.mkdir()
    os.chmod(mine, 0o2770)
    try:
        os.setxattr(mine, "user.note", b"1")
    except OSError:
        pytest.skip("no user extended attributes on this file system")
    with pytest.raises(OutputRefused, match="extended attributes kvtrace does not set") as err:
        make_stream_folder(str(mine))
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(f"{mine} passes on to what is made in it")
    assert os.stat(mine).st_mode & 0o7777 == 0o2770
    assert os.listxattr(mine) == ["user.note"]


@pytest.mark.beam
def test_an_existing_fit_output_keeps_its_mode(tmp_path):
    from kvtrace.pipelines.anonymize_streaming import make_stream_folder

    mine = tmp_path / "mine"
    mine.mkdir()
    os.chmod(mine, 0o700)
    make_stream_folder(str(mine))
    assert os.stat(mine).st_mode & 0o7777 == 0o700


@pytest.mark.beam
def test_a_folder_it_makes_inherits_nothing(tmp_path):
    from kvtrace.pipelines.anonymize_streaming import make_stream_folder

    parent = tmp_path / "shared"
    parent.mkdir()
    os.chmod(parent, 0o2777)
    make_stream_folder(str(parent / "out"))
    assert os.stat(parent / "out").st_mode & 0o7777 == 0o755


@pytest.mark.beam
def test_an_output_given_as_a_link_is_refused_and_what_it_points_to_left(tmp_path):
    from kvtrace.pipelines.anonymize_streaming import make_stream_folder

    target = tmp_path / "target"
    target.mkdir()
    os.chmod(target, 0o700)
    (tmp_path / "out").symlink_to(target)
    with pytest.raises(OutputRefused, match="out: a link, not a file or folder of its own"):
        make_stream_folder(str(tmp_path / "out"))
    assert os.stat(target).st_mode & 0o7777 == 0o700
