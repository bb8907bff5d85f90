"""The plan's rename probe (publish.prove_folder_rename) is the folder's, not an output's: a
killed plan's probe is cleared by the next plan that proves in that folder, whatever output it
was for, and its names are no output."""

from __future__ import annotations

import errno
import os

import pytest

from kvtrace.transforms.write.publish import FILE, FOLDER, Location, OutputRefused, plan_locations

PROBE = f".kvtrace-staging-probe-{os.geteuid()}"


@pytest.mark.parametrize("left", [PROBE, f"{PROBE}.renamed"])
def test_a_killed_plans_probe_goes_with_the_next_plan_in_its_folder(tmp_path, left):
    (tmp_path / left).mkdir()  # as a plan killed between its probe's steps leaves it
    deeper = Location("--output", str(tmp_path / "a" / "b" / "out"), FOLDER, writer="analyze")
    plan_locations([], [deeper])  # another output, proved in the same nearest existing folder
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", [PROBE, f"{PROBE}.renamed", ".kvtrace-staging-probe-7"])
@pytest.mark.parametrize("kind", [FILE, FOLDER])
def test_a_probes_name_is_never_an_output(tmp_path, name, kind):
    with pytest.raises(OutputRefused, match="a name kvtrace stages its outputs under"):
        plan_locations([], [Location("--output", str(tmp_path / name), kind)])


@pytest.mark.parametrize(
    ("failing", "code", "said"),
    [
        ("mkdir", errno.EACCES, "no folder can be made"),
        ("rename", errno.EXDEV, "no folder can be renamed"),
    ],
)
def test_the_probe_says_which_step_failed(tmp_path, monkeypatch, failing, code, said):
    """A folder that refuses the probe is refused in one line naming the step that failed and
    the system's reason."""

    def refused(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, failing, refused)
    out = Location("--output", str(tmp_path / "out"), FOLDER, writer="analyze")
    with pytest.raises(OutputRefused, match=f"{said} in .*{os.strerror(code)}"):
        plan_locations([], [out])
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("failing", ["mkdir", "rename"])
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO])
def test_a_probe_met_by_storage_running_out_is_no_refusal(tmp_path, monkeypatch, failing, code):
    """Only a folder unfit for good is "write elsewhere": a full disk (or an I/O error) meets
    the probe as the system's own error, which the CLI's storage rule makes a job that
    stopped, and nothing of the probe stays."""

    def failed(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, failing, failed)
    out = Location("--output", str(tmp_path / "out"), FOLDER, writer="analyze")
    with pytest.raises(OSError) as raised:
        plan_locations([], [out])
    monkeypatch.undo()
    assert raised.value.errno == code
    assert os.listdir(tmp_path) == []
