"""Every word on the command line is read by some option, or the command is refused with one
line: an unquoted glob the shell expanded into several words is several inputs, and a word no
option takes is never dropped silently (exit 2, nothing written)."""

from __future__ import annotations

import json

import pytest

from helpers import chat, write_jsonl
from kvtrace.cli import main
from kvtrace.commands.anonymize import option_kinds


def _inputs(tmp_path, count: int = 3) -> list[str]:
    return [
        str(write_jsonl(tmp_path / f"in-{i}.jsonl", [chat(i, i), chat(i + 5, i + 5)]))
        for i in range(count)
    ]


def test_several_words_after_input_are_several_inputs(tiny_tokenizer, tmp_path):
    files = _inputs(tmp_path)
    out = tmp_path / "out"
    # As the shell passes `--input in-*.jsonl`, plus a repeated --input: all four files read.
    extra = str(write_jsonl(tmp_path / "extra.jsonl", [chat(9, 9)]))
    assert (
        main(
            [
                "anonymize",
                "--input",
                *files,
                "--output",
                str(out),
                "--tokenizer",
                tiny_tokenizer,
                "--input",
                extra,
            ]
        )
        == 0
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["records"]["exported"] == 7


def test_an_input_word_that_matches_nothing_is_one_line(tiny_tokenizer, tmp_path, capsys):
    files = _inputs(tmp_path, 1)
    code = main(
        [
            "anonymize",
            "--input",
            *files,
            str(tmp_path / "gone-*.jsonl"),
            "--output",
            str(tmp_path / "out"),
            "--tokenizer",
            tiny_tokenizer,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "gone-*.jsonl' matches no file" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "words",
    [
        # a one-value option given two words
        pytest.param(["--output", "{out}", "{stray}"], id="after-output"),
        pytest.param(["--output", "{out}", "--block-size", "4", "{stray}"], id="after-block-size"),
        # after a Beam option's value, and one with no value: Beam's options parser reads them
        pytest.param(
            ["--output", "{out}", "--runner", "DirectRunner", "{stray}"],
            id="after-beam-value",
            marks=pytest.mark.beam,
        ),
        pytest.param(
            ["--output", "{out}", "--save_main_session", "{stray}"],
            id="after-beam-switch",
            marks=pytest.mark.beam,
        ),
    ],
)
def test_a_word_no_option_takes_is_refused(tiny_tokenizer, tmp_path, capsys, words):
    files = _inputs(tmp_path, 2)
    out = tmp_path / "out"
    argv = [w.format(out=out, stray=files[1]) for w in words]
    code = main(["anonymize", "--input", files[0], "--tokenizer", tiny_tokenizer, *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and f"unexpected argument(s) {files[1]}" in err
    assert not out.exists()


def test_a_trace_command_refuses_a_stray_word_between_options(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        json.dumps({"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [0]}) + "\n"
    )
    assert main(["analyze", str(trace), "--block-size", "4", str(trace)]) == 2
    assert "unexpected argument(s)" in capsys.readouterr().err


def test_presets_still_take_a_list_of_inputs():
    assert option_kinds()["input"] == "strs"
    assert option_kinds()["config"] == "strs"
