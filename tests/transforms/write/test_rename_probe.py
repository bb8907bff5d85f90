"""The plan's rename probe (publish.prove_folder_rename) is the folder's, not an output's: a
killed plan's probe is cleared by the next plan that proves in that folder, whatever output it
was for, and its names are no output."""

from __future__ import annotations

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
