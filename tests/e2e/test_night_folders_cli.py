"""A run's missing folders (its output's and its dead letters' parents): a night that
publishes nothing (refused by the rejected fraction, on either engine) leaves the operator's
folder as it was; one that publishes keeps them (storage.run_folders)."""

from __future__ import annotations

import pytest

from helpers import STOP_AS_THE_OUTPUT_IS_STAGED, kvtrace_child, night_args, write_jsonl

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "engine", ["local", pytest.param("beam", marks=pytest.mark.beam)], ids=["local", "beam"]
)
def test_a_refused_night_leaves_no_folder_it_made(tiny_tokenizer, tmp_path, engine):
    out, letters = tmp_path / "night" / "out", tmp_path / "letters" / "dead"
    night = night_args(tmp_path, tiny_tokenizer, out, "--dead-letter", str(letters))
    refused = kvtrace_child(*night, "--engine", engine, "--max-rejected-fraction", "0", timeout=300)
    assert refused.returncode == 1, refused.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "salt"]


@pytest.mark.beam
def test_a_stopped_beam_night_leaves_no_folder_it_made(tiny_tokenizer, tmp_path):
    out, letters = tmp_path / "night" / "out", tmp_path / "letters" / "dead"
    night = night_args(tmp_path, tiny_tokenizer, out, "--dead-letter", str(letters))
    stopped = kvtrace_child(
        *night, "--engine", "beam", prelude=STOP_AS_THE_OUTPUT_IS_STAGED, timeout=300
    )
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "salt"]


def test_a_published_night_keeps_the_folders_it_made(tiny_tokenizer, tmp_path):
    out, letters = tmp_path / "night" / "out", tmp_path / "letters" / "dead"
    night = night_args(tmp_path, tiny_tokenizer, out, "--dead-letter", str(letters))
    published = kvtrace_child(*night, timeout=300)
    assert published.returncode == 0, published.stderr[-2000:]
    assert (out / "manifest.json").is_file()
    assert [p.name.startswith("rejected-") for p in letters.iterdir()] == [True]


@pytest.mark.parametrize(
    ("command", "options", "name"),
    [("synthesize", [], "out"), ("export", ["--to", "dynamo"], "out.jsonl")],
    ids=["synthesize", "export"],
)
def test_any_command_stopped_leaves_no_folder_it_made(tmp_path, command, options, name):
    """The rule is the CLI's, not anonymize's: every command's run is inside run_folders."""
    rows = [
        {"timestamp": 100 * i, "input_length": 8, "output_length": 2, "hash_ids": [0, i]}
        for i in range(4)
    ]
    source = write_jsonl(tmp_path / "trace.jsonl", rows)
    out = tmp_path / "a" / "b" / name
    args = [command, str(source), "--block-size", "4", *options, "-o", str(out)]
    stopped = kvtrace_child(*args, prelude=STOP_AS_THE_OUTPUT_IS_STAGED, timeout=120)
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.jsonl"]
