"""A derived trace (synthesize, convert) carries its block size and provenance in a manifest, so
every command downstream reads it at its own block size, and the audit refuses it in one line."""

from __future__ import annotations

import json

import pytest

from helpers import write_jsonl
from kvtrace.cli import main

# A 16-token trace: two turns of one conversation and a request of its own.
ROWS = [
    {"timestamp": 0, "input_length": 40, "output_length": 4, "hash_ids": [0, 1, 2]},
    {"timestamp": 500, "input_length": 70, "output_length": 4, "hash_ids": [0, 1, 2, 3, 4]},
    {"timestamp": 900, "input_length": 10, "output_length": 2, "hash_ids": [5]},
]


@pytest.mark.beam  # analyze loads Beam
def test_export_names_the_synthesized_traces_block_size(tmp_path, capsys):
    source = write_jsonl(tmp_path / "trace.jsonl", ROWS)
    out = tmp_path / "synth"
    args = ["synthesize", str(source), "--block-size", "16", "--speedup-ratio", "2"]
    assert main([*args, "-o", str(out)]) == 0
    assert "block size 16 and provenance in its manifest.json" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["block_size"] == 16 and manifest["records"] == {"exported": 3}
    assert manifest["derived_from"]["command"] == "synthesize"
    assert manifest["derived_from"]["settings"]["speedup_ratio"] == "2.0"
    # No --block-size downstream: each command takes 16 from the manifest.
    assert main(["export", str(out), "--to", "vllm", "-o", str(tmp_path / "v.jsonl")]) == 0
    printed = capsys.readouterr().out
    assert "--timed-trace-chunk-hash-size 16" in printed and "512" not in printed
    assert main(["analyze", str(out), "--json", str(tmp_path / "a.json")]) == 0
    assert json.loads((tmp_path / "a.json").read_text())["block_size"] == 16
    assert main([*args, "-o", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "manifest.json").read_bytes() == (
        out / "manifest.json"
    ).read_bytes()


def test_a_bare_jsonl_at_another_block_size_is_refused_before_any_work(tmp_path, capsys):
    source = write_jsonl(tmp_path / "trace.jsonl", ROWS)
    out = tmp_path / "s.jsonl"
    assert main(["synthesize", str(source), "--block-size", "16", "-o", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "block size 512" in error and "-o DIR" in error
    assert not out.exists()
    assert main(["synthesize", str(source), "-o", str(out)]) == 0  # 512: every reader's default
    assert "block size 512, every reader's default" in capsys.readouterr().out


def test_the_audit_refuses_a_derived_trace_in_one_line(tmp_path, capsys):
    source = write_jsonl(tmp_path / "trace.jsonl", ROWS)
    out = tmp_path / "synth"
    assert main(["synthesize", str(source), "--block-size", "16", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["audit", str(out)]) == 1
    flags = [line for line in capsys.readouterr().out.splitlines() if "FLAG manifest.json" in line]
    assert len(flags) == 1 and "derived by kvtrace synthesize, not an anonymize output" in flags[0]


def test_a_derived_folder_is_replaced_only_by_its_own_command(tmp_path, capsys):
    source = write_jsonl(tmp_path / "trace.jsonl", ROWS)
    bailian = write_jsonl(
        tmp_path / "bailian.jsonl",
        [
            {
                "chat_id": 1,
                "parent_chat_id": -1,
                "timestamp": 1.5,
                "input_length": 20,
                "output_length": 3,
                "hash_ids": [7, 8],
                "turn": 1,
                "type": "text",
            }
        ],
    )
    out = tmp_path / "synth"
    assert main(["synthesize", str(source), "--block-size", "16", "-o", str(out)]) == 0
    assert main(["convert", str(bailian), "-o", str(out)]) == 2
    assert "an output of kvtrace synthesize" in capsys.readouterr().err
    assert json.loads((out / "manifest.json").read_text())["derived_from"]["command"] == (
        "synthesize"
    )
    assert main(["convert", str(bailian), "-o", str(tmp_path / "conv")]) == 0
    converted = json.loads((tmp_path / "conv" / "manifest.json").read_text())
    assert converted["block_size"] == 16
    assert converted["derived_from"]["source_format"] == "bailian"
