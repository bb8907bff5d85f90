"""The forms replayers read (transforms/replay/forms.py, export.py) and `kvtrace export`.

vLLM (0.33.0, `vllm/benchmarks/datasets/datasets.py`, class TimedTrace) and SGLang (0.5.23,
`sglang/benchmark/datasets/mooncake.py`) do not install on these CPU-only machines: their
readers are described here as their source reads, and the exported files checked against that.

The whole CLI runs; the unit tests are in tests/transforms/replay/test_replay_forms.py."""

from __future__ import annotations

import json

import pytest

from kvtrace.cli import main


def row(ts, isl, osl, ids, session=None, response=None) -> dict:
    out = {"timestamp": ts, "input_length": isl, "output_length": osl, "hash_ids": ids}
    if session is not None:
        out["session"] = session
    if response is not None:
        out["response_ms"] = response
    return out


CHAT = [  # block size 4: turn 2 extends turn 1 by its answer (2 tokens) and 6 new tokens
    row(0, 8, 2, [0, 1], session=7, response=300),
    row(100, 5, 1, [2, 3]),
    row(1_000, 16, 3, [0, 1, 4, 5], session=7),
    row(5_000, 6, 1, [6, 7], session=7, response=50),  # shorter than before: cannot be a delta
]


def test_export_from_the_command_line(tmp_path, capsys):
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CHAT))
    out = tmp_path / "dynamo.jsonl"
    assert (
        main(
            [
                "export",
                str(tmp_path / "t.jsonl"),
                "--to",
                "dynamo",
                "-o",
                str(out),
                "--block-size",
                "4",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "trace_format='mooncake', trace_block_size=4" in printed
    assert "2 follow-up turns carry a delay; 1 of them had no response end" in printed
    assert len(out.read_text().splitlines()) == 4


def test_the_delta_export_names_the_common_cause_of_a_restart(tmp_path, capsys):
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CHAT))
    args = ["export", str(tmp_path / "t.jsonl"), "--to", "dynamo-delta", "--block-size", "4"]
    assert main([*args, "-o", str(tmp_path / "d.jsonl")]) == 0
    said = next(line for line in capsys.readouterr().out.splitlines() if "whole" in line)
    assert "opening a new session_id" in said
    assert "logged completion length (output_length) is longer than the answer" in said


@pytest.mark.parametrize(
    "args, message",
    [
        (["--to", "sglang", "--block-size", "100"], "neither a multiple nor a divisor of 128"),
        (["--to", "vllm", "--block-size", "0"], "--block-size must be >= 1"),
        (["--to", "vlm"], "invalid choice"),
    ],
)
def test_export_errors_are_one_line(tmp_path, capsys, args, message):
    (tmp_path / "t.jsonl").write_text(json.dumps(row(0, 8, 1, [0])) + "\n")
    with pytest.raises(SystemExit) if "invalid choice" in message else _nothing():
        code = main(["export", str(tmp_path / "t.jsonl"), "-o", str(tmp_path / "o.jsonl"), *args])
        assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_malformed_trace_is_refused_with_its_line(tmp_path, capsys):
    (tmp_path / "t.jsonl").write_text(json.dumps(row(0, 8, 1, [0, 1])) + "\n{oops\n")
    assert (
        main(
            ["export", str(tmp_path / "t.jsonl"), "--to", "aiperf", "-o", str(tmp_path / "o.jsonl")]
        )
        == 2
    )
    assert "line 2" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("consumer", ["aiperf", "dynamo-agentic", "weka", "libcachesim"])
def test_a_trace_with_no_row_publishes_nothing(tmp_path, capsys, consumer):
    """As every trace command (common.require_rows): an empty trace stops the run (exit 1), an
    earlier output and its report kept as they were."""
    (tmp_path / "t.jsonl").write_text(json.dumps(row(0, 8, 1, [0, 1])) + "\n")
    (tmp_path / "empty.jsonl").write_bytes(b"")
    out, report = tmp_path / "o", tmp_path / "r.json"
    args = ["--to", consumer, "-o", str(out), "--overwrite", "--json", str(report)]
    assert main(["export", str(tmp_path / "t.jsonl"), *args]) == 0
    earlier = out.read_bytes(), report.read_bytes()
    capsys.readouterr()
    assert main(["export", str(tmp_path / "empty.jsonl"), *args]) == 1
    assert "no trace rows could be read" in capsys.readouterr().err
    assert (out.read_bytes(), report.read_bytes()) == earlier


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
