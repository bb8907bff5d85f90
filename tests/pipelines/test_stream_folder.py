"""make_stream_folder: a stream's folder kvtrace makes inherits nothing of its parent; one the
user made is theirs, checked and never changed but for the stream's output mark, which keeps
every other command out of it; claim_window: the stream replaces only its own windows."""

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


@pytest.mark.beam
def test_the_folder_is_the_streams_output_to_every_other_commands_plan(tmp_path):
    from kvtrace.pipelines.anonymize_streaming import make_stream_folder
    from kvtrace.transforms.write.publish import FOLDER, Location, check_written, folder_writer

    output = tmp_path / "stream"
    make_stream_folder(str(output))
    assert folder_writer(str(output)) == "anonymize --streaming"
    inside = Location("--output", str(output / "window-000000"), FOLDER, writer="anonymize")
    with pytest.raises(OutputRefused, match="lies inside") as err:
        check_written(inside)
    assert "\n" not in str(err.value)


@pytest.mark.beam
def test_a_folder_the_stream_did_not_write_at_its_next_windows_name_is_never_replaced(tmp_path):
    from kvtrace.pipelines.anonymize_streaming import claim_window, make_stream_folder

    output = tmp_path / "stream"
    make_stream_folder(str(output))
    claim_window(str(output), "window-000000")
    (output / "window-000000").mkdir()  # the stream's own, published after its claim
    claim_window(str(output), "window-000000")  # a retried attempt replaces its own
    night = output / "window-000001"
    night.mkdir()
    (night / "manifest.json").write_text("{}")
    with pytest.raises(OutputRefused, match="did not write") as err:
        claim_window(str(output), "window-000001")
    assert "\n" not in str(err.value)
    assert (night / "manifest.json").read_text() == "{}"
    with pytest.raises(OutputRefused, match="did not write"):  # its claim never moved on
        claim_window(str(output), "window-000001")


@pytest.mark.beam
def test_a_mark_claiming_windows_far_ahead_makes_no_folder_the_streams(tmp_path):
    """Someone else's mark claiming window 9 while windows 0-1 stand: the folder at window 2's
    name is still not the stream's (a claim counts at most one past the windows standing)."""
    from kvtrace.pipelines.anonymize_streaming import claim_window, make_stream_folder
    from kvtrace.transforms.write.publish import STREAM_WRITER, mark_output

    output = tmp_path / "stream"
    make_stream_folder(str(output))
    for name in ("window-000000", "window-000001"):
        claim_window(str(output), name)
        (output / name).mkdir()
    assert mark_output(str(output), STREAM_WRITER, claimed="window-000009")
    planted = output / "window-000002"
    planted.mkdir()
    with pytest.raises(OutputRefused, match="did not write"):
        claim_window(str(output), "window-000002")
    assert planted.is_dir()
