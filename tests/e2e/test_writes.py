"""Every command that writes goes through the one write protocol (transforms/write/publish.py):
its location checked before any work, its output published whole, a run's dead letters named by
it and published with it. The crash-point harness (test_crash_points.py) kills each of these at
every durable step; these are the behaviours a user sees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import anonymize, chat, published_letters, write_jsonl
from kvtrace.cli import main

TRACE = [
    {
        "timestamp": 1000 * i,
        "input_length": 40 + i,
        "output_length": 5,
        "hash_ids": [1, 2, 10 + i],
        "session": i % 2,
    }
    for i in range(6)
]


@pytest.fixture
def trace(tmp_path) -> str:
    return str(write_jsonl(tmp_path / "trace.jsonl", TRACE))


def test_two_nights_keep_both_letters_and_a_failed_night_touches_neither(
    tiny_tokenizer, tmp_path, capsys
):
    dead = tmp_path / "dead"
    flags = ["--dead-letter", str(dead), "--block-size", "4"]
    for night in (1, 2):
        src = write_jsonl(tmp_path / f"night{night}.jsonl", [chat(night, 1000), b"{broken"])
        assert anonymize(tiny_tokenizer, [src], tmp_path / "out", *flags) == 0
    letters = sorted(dead.iterdir())
    assert [len(p.read_text().splitlines()) for p in letters] == [1, 1]  # one per night
    assert all(p.name.startswith("rejected-") and p.stat().st_mode & 0o077 == 0 for p in letters)
    published = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    bad = write_jsonl(tmp_path / "bad.jsonl", [chat(3, 1000), b"x", b"y"])
    assert (
        anonymize(tiny_tokenizer, [bad], tmp_path / "out", *flags, "--max-rejected-fraction", "0.1")
        == 1
    )
    assert "too much input rejected" in capsys.readouterr().err
    assert sorted(dead.iterdir()) == letters  # none of the failed run's, nothing hidden left
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == published


@pytest.mark.parametrize(
    "command",
    [
        ["export", "--to", "aiperf"],
        pytest.param(
            ["report", "--capacity", "8,64", "--policy", "lru"], marks=pytest.mark.slow
        ),  # plots: seconds
    ],
)
def test_export_and_report_replace_an_output_only_when_told(trace, tmp_path, capsys, command):
    out = tmp_path / "out"
    out.write_text("someone's")
    args = [command[0], trace, *command[1:], "-o", str(out), "--block-size", "4"]
    assert main(args) == 2
    assert capsys.readouterr().err == f"error: {out} exists; --overwrite replaces it\n"
    assert out.read_text() == "someone's"
    assert main([*args, "--overwrite"]) == 0
    assert out.read_text() != "someone's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "trace.jsonl"]


def test_an_unwritable_location_is_refused_before_any_work(trace, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    for command in (
        ["synthesize", trace],
        ["export", trace, "--to", "aiperf"],
        ["analyze", trace, "--output"],
        ["convert", trace],
    ):
        target = (
            str(blocker / "x.jsonl")
            if command[0] not in ("analyze", "convert")
            else str(blocker / "dir")
        )
        args = [*command, target] if command[-1] == "--output" else [*command, "-o", target]
        assert main(args) == 2, command
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert f"{blocker} is not a folder" in err, err


def test_convert_publishes_its_folder_whole_manifest_last(tmp_path, capsys):
    rows = [
        {
            "chat_id": i,
            "parent_chat_id": -1,
            "timestamp": float(i),
            "input_length": 16,
            "output_length": 5,
            "type": "text",
            "turn": 1,
            "hash_ids": [i],
        }
        for i in range(5)
    ]
    src = write_jsonl(tmp_path / "bailian.jsonl", rows)
    out = tmp_path / "converted"
    for _ in range(2):  # a rerun replaces its own earlier output
        assert main(["convert", str(src), "-o", str(out)]) == 0
        manifest = json.loads((out / "manifest.json").read_text())
        trace_rows = (out / manifest["files"][0]).read_text().splitlines()
        assert manifest["records"]["exported"] == len(trace_rows) == 5
    (out / "notes.txt").write_text("mine")
    assert main(["convert", str(src), "-o", str(out)]) == 2
    assert "notes.txt" in capsys.readouterr().err


def test_analyze_output_is_replaced_whole_and_a_foreign_folder_refused(trace, tmp_path, capsys):
    out = tmp_path / "analysis"
    for _ in range(2):
        assert main(["analyze", trace, "--output", str(out), "--block-size", "4"]) == 0
        assert sorted(p.name for p in out.iterdir()) == ["analysis.json", "analysis.txt"]
    capsys.readouterr()
    (out / "extra.csv").write_text("mine")
    assert main(["analyze", trace, "--output", str(out), "--block-size", "4"]) == 2
    assert "extra.csv" in capsys.readouterr().err
    assert (out / "extra.csv").read_text() == "mine"


def test_a_run_with_nothing_to_analyze_publishes_nothing(tmp_path):
    empty = write_jsonl(tmp_path / "empty.jsonl", [b"{broken"])
    assert (
        main(["analyze", str(empty), "--output", str(tmp_path / "analysis"), "--block-size", "4"])
        == 1
    )
    assert not (tmp_path / "analysis").exists()


def test_synthesize_and_render_leave_only_their_output(trace, tmp_path, tiny_tokenizer):
    assert main(["synthesize", trace, "-o", str(tmp_path / "s"), "--block-size", "4"]) == 0
    assert (
        main(
            [
                "render",
                trace,
                "-o",
                str(tmp_path / "r.jsonl"),
                "--block-size",
                "4",
                "--tokenizer",
                tiny_tokenizer,
                "--no-verify",
            ]
        )
        == 0
    )
    assert len((tmp_path / "s" / "trace-00000-of-00001.jsonl").read_text().splitlines()) == len(
        TRACE
    )
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == len(TRACE)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_published_letters_name_the_run(tiny_tokenizer, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0), b"{broken"])
    assert anonymize(tiny_tokenizer, [src], tmp_path / "out") == 0
    assert (
        json.loads(published_letters(tmp_path / "out-rejected").read_text())["error"]
        == "invalid_json"
    )
    assert Path(tmp_path / "out-rejected").stat().st_mode & 0o077 == 0
