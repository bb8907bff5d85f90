"""anonymize --model-name: published in the manifest, accepted by the gate, titling the report."""

from __future__ import annotations

import json

import pytest

from helpers import anonymize, chat, write_jsonl
from kvtrace.cli import main


@pytest.fixture(scope="module")
def named(tiny_tokenizer, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("named")
    src = write_jsonl(tmp / "in.jsonl", [chat(i, 1000 * i) for i in range(8)])
    out = tmp / "out"
    assert (
        anonymize(tiny_tokenizer, [src], out, "--block-size", "4", "--model-name", "Qwen/Qwen3-8B")
        == 0
    )
    return out


def test_the_model_name_is_published_beside_the_tokenizer_and_passes_the_gate(
    named, tiny_tokenizer, capsys
):
    manifest = json.loads((named / "manifest.json").read_text())
    assert manifest["model_name"] == "Qwen/Qwen3-8B"
    assert manifest["tokenizer"]["name"] is None  # a local folder: the pin rule stays
    audit = ["audit", str(named), "--tokenizer", tiny_tokenizer]
    assert main([*audit, "--model-name", "Qwen/Qwen3-8B"]) == 0, capsys.readouterr()


def test_the_gate_refuses_a_model_name_it_is_not_given_as_the_run_was(
    named, tiny_tokenizer, capsys
):
    """The name is the publisher's claim, which no row proves: without --model-name, or with
    another name, the manifest's model_name is refused in one line naming the flag."""
    audit = ["audit", str(named), "--tokenizer", tiny_tokenizer]
    assert main(audit) == 1
    assert "model_name is the run's --model-name" in capsys.readouterr().out
    assert main([*audit, "--model-name", "Qwen/Qwen3-32B"]) == 1
    assert "model_name is not the --model-name given (Qwen/Qwen3-32B)" in capsys.readouterr().out


def test_a_manifest_edited_to_hold_free_text_is_refused(named, tmp_path, tiny_tokenizer, capsys):
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in named.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["model_name"] = "patient J. Smith, ward 7"
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    assert main(["audit", str(copy), "--tokenizer", tiny_tokenizer]) != 0
    assert "model_name" in capsys.readouterr().out


def test_a_name_the_gate_would_refuse_is_refused_before_any_work(tiny_tokenizer, tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0)])
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, [src], out, "--model-name", "my model") == 2
    assert "--model-name 'my model' cannot be published" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow  # the report's plots: over a second
def test_the_report_is_titled_by_the_published_model(named, tmp_path):
    page = tmp_path / "r.html"
    assert main(["report", str(named), "-o", str(page), "--model", "qwen3-8b"]) == 0
    text = page.read_text()
    assert "<title>kvtrace report: Qwen/Qwen3-8B, undated</title>" in text
    assert "publishes times in ms from the first request and no date in its manifest" in text
