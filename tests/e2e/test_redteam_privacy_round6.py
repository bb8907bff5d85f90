"""Red team round 6: what a published folder (or another command's published output) gives away
past the fixes of round 5. Each test asserts the promised behaviour, so each fails today."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, chat, write_jsonl

pytestmark = pytest.mark.slow
ROUND6 = "red team round 6"


def _cli(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvtrace.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(ROOT),
        env={**os.environ, **(env or {})},
    )


@pytest.mark.xfail(strict=True, reason=ROUND6)
def test_a_private_template_under_a_published_tokenizer_name_is_published_as_a_digest(
    tiny_tokenizer, tmp_path
):
    """Round 5's fix: a tokenizer "kvtrace does not declare" publishes no digests, because a
    plain sha256 of a private template (a default system prompt naming a ward, a patient)
    confirms a guess of it. But whether the files are private is judged by the NAME alone
    (public_tokenizer_name/public_tokenizer_sha256): run with --tokenizer Qwen/Qwen3-8B whose
    hub cache snapshot holds the operator's edited template (the usual way to give a model a
    default system prompt), the manifest names Qwen/Qwen3-8B and publishes the plain sha256 of
    the edited template, and the gate checks the digests only against the same local files
    (_tokenizer_here), so it calls the folder publishable. Anyone hashes "the public template
    plus one guessed line" and compares. Nothing pins a declared name's digests to its
    public files."""
    revision = "0" * 40
    cache = tmp_path / "hub"
    snapshot = cache / "models--Qwen--Qwen3-8B" / "snapshots" / revision
    (cache / "models--Qwen--Qwen3-8B" / "refs").mkdir(parents=True)
    (cache / "models--Qwen--Qwen3-8B" / "refs" / "main").write_text(revision)
    shutil.copytree(tiny_tokenizer, snapshot)
    template = snapshot / "chat_template.jinja"
    secret = (
        "{% if messages[0].role != 'system' %}<|im_start|>system\nyou are the triage "
        "assistant of acme ward 7 for patient jane doe<|im_end|>\n{% endif %}"
    )
    template.write_text(secret + template.read_text())
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    log = write_jsonl(tmp_path / "night.jsonl", [chat(i, 997 * i) for i in range(4)])
    out = tmp_path / "out"
    run = _cli(
        ["anonymize", "--input", str(log), "--output", str(out), "--tokenizer", "Qwen/Qwen3-8B",
         "--block-size", "4"],
        env,
    )
    assert run.returncode == 0, run.stderr[-400:]
    audited = _cli(["audit", str(out), "--tokenizer", "Qwen/Qwen3-8B"], env)
    manifest = json.loads((out / "manifest.json").read_text())
    guess = hashlib.sha256(template.read_bytes()).hexdigest()  # what an outsider computes
    assert audited.returncode != 0 or guess not in manifest["tokenizer"]["sha256"].values(), (
        "the gate passes the plain digest of the operator's private template: "
        + audited.stdout[-300:]
    )
