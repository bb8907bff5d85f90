"""The built wheel, installed (not editable) into a clean environment, runs a job from a copy of
the source tree laid out as the worker image lays it out (deploy/docker/Dockerfile): the source
folders in the working directory, the installed package in site-packages, Beam workers in
separate processes. An editable install would hide a package mapping that only it resolves."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from helpers import ROOT, chat, write_jsonl

SOURCE_FOLDERS = ("kvtrace", "transforms", "pipelines", "configs")


@pytest.fixture(scope="module")
def clean_python(tmp_path_factory) -> Path:
    """A venv holding only the kvtrace wheel; the dependencies come from this interpreter's
    site-packages as a plain path entry, so its .pth files (the editable install) never run."""
    base = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools leaves build/ behind, whose stale files later wheels reuse.
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info"))
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(base / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (base / "dist").glob("kvtrace-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base / "venv")], check=True)
    python = base / "venv" / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", site, str(wheel)],
        capture_output=True,
        text=True,
    )
    assert installed.returncode == 0, installed.stderr
    dependencies = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site, "dependencies.pth").write_text("\n".join(sorted(dependencies)) + "\n")
    return python


def _run(python: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_wheel_imports_from_site_packages_not_from_the_checkout(clean_python, tmp_path):
    shown = _run(
        clean_python,
        tmp_path,
        "-c",
        "import kvtrace.cli, kvtrace.transforms.encode.tokenize, "
        "kvtrace.pipelines.anonymize_beam as p; print(p.__file__)",
    )
    assert shown.returncode == 0, shown.stderr
    assert "site-packages" in shown.stdout and str(ROOT) not in shown.stdout


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_job_runs_from_a_copy_of_the_source_tree_with_two_workers(
    clean_python, tiny_tokenizer, tmp_path
):
    image = tmp_path / "opt" / "kvtrace"  # the Dockerfile's WORKDIR, with the source copied in
    for folder in SOURCE_FOLDERS:
        shutil.copytree(ROOT / folder, image / folder)
    logs = write_jsonl(tmp_path / "logs.jsonl", [chat(i, 1000 + i) for i in range(12)])
    result = _run(
        clean_python,
        image,
        "-m",
        "kvtrace.nightly",
        f"--input={logs}",
        f"--output={tmp_path / 'out'}",
        f"--tokenizer={tiny_tokenizer}",
        "--block_size=4",
        "--direct_num_workers=2",
        "--direct_running_mode=multi_threading",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["records"]["exported"] == 12


@pytest.mark.slow  # a wheel build and every module imported: ~8 s, .ci/run runs the slow set
def test_every_module_of_the_tree_is_in_the_wheel(clean_python, tmp_path):
    """A folder without __init__.py imports from a checkout but is left out of the wheel."""
    modules = sorted(
        ".".join((prefix, *path.relative_to(ROOT / folder).with_suffix("").parts)).removesuffix(
            ".__init__"
        )
        for folder, prefix in (
            ("kvtrace", "kvtrace"),
            ("transforms", "kvtrace.transforms"),
            ("pipelines", "kvtrace.pipelines"),
        )
        for path in (ROOT / folder).rglob("*.py")
    )
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    module = importlib.import_module(name)\n"
        "    assert 'site-packages' in module.__file__, (name, module.__file__)\n"
    )
    shown = _run(clean_python, tmp_path, "-c", script)
    assert shown.returncode == 0, shown.stderr[-2000:]


@pytest.mark.slow  # needs the wheel built: .ci/run runs the slow set
def test_the_wheel_claims_one_import_name(clean_python):
    """Installing kvtrace beside a distribution of its own named `transforms` or `pipelines`
    (both exist on the package index) breaks neither: the wheel adds `kvtrace` only."""
    site = Path(
        _run(
            clean_python,
            clean_python.parent,
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ).stdout.strip()
    )
    # bin/ holds the console script (pip --target installs it there), not an import name.
    top_level = {
        path.name
        for path in site.iterdir()
        if not path.name.endswith((".dist-info", ".pth")) and path.name != "bin"
    }
    assert top_level == {"kvtrace"}


@pytest.mark.slow  # needs the wheel built: .ci/run runs the slow set
def test_the_presets_the_cli_names_ship_in_the_wheel(clean_python, tmp_path):
    listed = _run(clean_python, tmp_path, "-m", "kvtrace.cli", "simulate", "--list-models")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "qwen3-8b" in listed.stdout and "KV bytes per token" in listed.stdout
    shown = _run(
        clean_python,
        tmp_path,
        "-c",
        "from kvtrace import presets; print(presets.folder()); "
        "print(presets.config_path('deepseek-r1'))",
    )
    assert (
        shown.returncode == 0 and "site-packages" in shown.stdout and str(ROOT) not in shown.stdout
    )
