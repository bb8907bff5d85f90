"""Hostile options and presets: wrong YAML types, alias bombs, salts and inputs that are not
regular files. Each gets a one-line error (exit 2) before any work, never a hang or a traceback;
a dangling link among the inputs is a dead letter, like an unreadable file."""

from __future__ import annotations

import json
import os
import string

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import chat, read_jsonl, write_jsonl
from kvtrace.cli import main


def _run(tokenizer, tmp_path, preset: str | None = None, *extra: str) -> int:
    src = tmp_path / "in.jsonl"
    if not src.exists():
        write_jsonl(src, [chat(0, 0)])
    args = [
        "anonymize",
        "--input",
        str(src),
        "--output",
        str(tmp_path / "out"),
        "--tokenizer",
        tokenizer,
        *extra,
    ]
    if preset is not None:
        (tmp_path / "preset.yaml").write_text(preset)
        args += ["--config", str(tmp_path / "preset.yaml")]
    return main(args)


@pytest.mark.parametrize(
    "preset, message",
    [
        ('drop-non-text-parts: "false"', "drop-non-text-parts must be true or false"),
        ("drop-non-text-parts: 'no'", "drop-non-text-parts must be true or false"),
        ('block-size: "16"', "block-size must be a whole number"),
        ("block-size: true", "block-size must be a whole number"),
        ("max-rejected-fraction: '0.5'", "max-rejected-fraction must be a number"),
        ("input: {a: 1}", "input must be a string or a list of strings"),
        ("input: [1, 2]", "input must be a string or a list of strings"),
        ("chat-template-kwargs: [1]", "chat-template-kwargs must be a mapping"),
        ("tokenizer: 5", "tokenizer must be a string"),
        ("- a list", "expected a mapping"),
        ("1: 2", "option names must be strings"),
        ("a: [unclosed", "not valid YAML"),
    ],
)
def test_a_preset_value_of_the_wrong_type_is_a_one_line_error(
    tiny_tokenizer, tmp_path, capsys, preset, message
):
    assert _run(tiny_tokenizer, tmp_path, preset) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_an_alias_bomb_is_refused_before_it_expands(tiny_tokenizer, tmp_path, capsys):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 9)]
    lines.append("chat-template-kwargs: {bomb: *a8}")
    assert _run(tiny_tokenizer, tmp_path, "\n".join(lines)) == 2
    assert "alias" in capsys.readouterr().err


def test_many_aliases_are_refused(tiny_tokenizer, tmp_path, capsys):
    preset = "x: &x 1\nchat-template-kwargs: {" + ", ".join(f"k{i}: *x" for i in range(100)) + "}"
    assert _run(tiny_tokenizer, tmp_path, preset) == 2
    assert "aliases" in capsys.readouterr().err


def test_a_salt_file_that_is_a_device_or_huge_is_refused(tiny_tokenizer, tmp_path, capsys):
    assert _run(tiny_tokenizer, tmp_path, None, "--salt-file", "/dev/zero") == 2
    assert "not a regular file" in capsys.readouterr().err
    big = tmp_path / "salt"
    big.write_bytes(b"s" * (1 << 20))
    assert _run(tiny_tokenizer, tmp_path, None, "--salt-file", str(big)) == 2
    assert "a salt is a short secret" in capsys.readouterr().err


def test_a_fifo_input_is_refused_not_read(tiny_tokenizer, tmp_path, capsys):
    fifo = tmp_path / "logs.jsonl"
    os.mkfifo(fifo)
    assert (
        main(
            [
                "anonymize",
                "--input",
                str(tmp_path / "*.jsonl"),
                "--output",
                str(tmp_path / "out"),
                "--tokenizer",
                tiny_tokenizer,
            ]
        )
        == 2
    )
    assert "not a regular file" in capsys.readouterr().err


def test_a_dangling_link_is_a_dead_letter_like_an_unreadable_file(tiny_tokenizer, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    write_jsonl(logs / "a.jsonl", [chat(i, i) for i in range(3)])
    (logs / "b.jsonl").symlink_to(tmp_path / "gone.jsonl")
    assert (
        main(
            [
                "anonymize",
                "--input",
                str(logs / "*.jsonl"),
                "--output",
                str(tmp_path / "out"),
                "--tokenizer",
                tiny_tokenizer,
            ]
        )
        == 0
    )
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["records"]["exported"] == 3
    letters = read_jsonl(next((tmp_path / "out-rejected").glob("*.jsonl")))
    assert [(letter["error"], letter["source"].endswith("b.jsonl")) for letter in letters] == [
        ("damaged_file", True)
    ]


def test_a_folder_given_as_input_says_how_to_name_its_files(tiny_tokenizer, tmp_path, capsys):
    (tmp_path / "logs").mkdir()
    assert (
        main(
            [
                "anonymize",
                "--input",
                str(tmp_path / "logs"),
                "--output",
                str(tmp_path / "out"),
                "--tokenizer",
                tiny_tokenizer,
            ]
        )
        == 2
    )
    assert "give a glob of its files" in capsys.readouterr().err


KEYS = [
    "block-size",
    "input-format",
    "timestamp-unit",
    "drop-non-text-parts",
    "max-record-bytes",
    "chat-template-kwargs",
    "max-rejected-fraction",
    "hash-shards",
    "hash-scheme",
    "timestamp-granularity-ms",
    "length-granularity",
    "engine",
    "processes",
    "beam",
    "nonsense",
]
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats()
    | st.text(string.printable, max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(string.ascii_letters, max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=4))
def test_any_preset_gives_a_run_or_a_one_line_error(tiny_tokenizer, tmp_path_factory, preset):
    tmp_path = tmp_path_factory.mktemp("preset")
    try:
        text = yaml.safe_dump(preset)
    except (yaml.YAMLError, ValueError):
        return
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = _run(tiny_tokenizer, tmp_path, text)
    assert code in (0, 1, 2)
    lines = [
        line for line in err.getvalue().splitlines() if line.startswith(("error", "Traceback"))
    ]
    assert code == 0 or (len(lines) == 1 and lines[0].startswith("error")), err.getvalue()


@pytest.mark.parametrize(
    "given, message",
    [
        ("{tok}/tokenizer.json", "is a file; give the folder that holds it"),
        ("{tmp}/missing/tokenizer", "no such folder"),
        ("{tmp}", "no tokenizer.json"),
    ],
)
def test_a_wrong_tokenizer_path_says_what_is_wrong_with_it(
    tiny_tokenizer, tmp_path, capsys, given, message
):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0)])
    name = given.format(tok=tiny_tokenizer, tmp=tmp_path)
    assert (
        main(
            [
                "anonymize",
                "--input",
                str(src),
                "--output",
                str(tmp_path / "out"),
                "--tokenizer",
                name,
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert message in err and "Repo id" not in err and len(err.strip().splitlines()) == 1


def test_a_config_named_without_a_path_is_a_shipped_preset(capsys):
    from kvtrace.presets import config_path, environments

    assert {"deepseek-r1", "qwen3", "dataflow", "flink", "local"} <= set(environments())
    assert config_path("deepseek-r1").endswith("deepseek-r1.yaml")
    with pytest.raises(FileNotFoundError, match="nor a preset kvtrace ships"):
        config_path("deepseek-r2")


@pytest.mark.parametrize("flag", ["--output", "--dead-letter", "--id-map"])
def test_a_file_where_a_folder_goes_is_named(tiny_tokenizer, tmp_path, capsys, flag):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0)])
    (tmp_path / "a-file").write_text("x")
    args = {"--output": str(tmp_path / "out"), flag: str(tmp_path / "a-file")}
    extra = ["--salt-file", str(tmp_path / "in.jsonl")] if flag == "--id-map" else []
    assert (
        main(
            [
                "anonymize",
                "--input",
                str(src),
                "--tokenizer",
                tiny_tokenizer,
                *extra,
                *[x for kv in args.items() for x in kv],
            ]
        )
        == 2
    )
    assert f"{flag} {tmp_path / 'a-file'} is a file" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command, typo, meant",
    [
        (["analyze", "t.jsonl"], "--blok-size", "--block-size"),
        (["validate", "t.jsonl"], "--jsn", "--json"),
        (["simulate", "t.jsonl", "--capacity", "1M"], "--polcy", "--policy"),
        (["synthesize", "t.jsonl", "-o", "x.jsonl"], "--speedup-ration", "--speedup-ratio"),
        (["audit", "t"], "--jsno", "--json"),
    ],
)
def test_every_command_suggests_the_option_a_typo_meant(capsys, command, typo, meant):
    assert main([*command, typo, "1"]) == 2
    assert f"unknown option {typo} (did you mean {meant}?)" in capsys.readouterr().err


@pytest.mark.beam  # the flags left to Beam are checked against Beam's own options
def test_another_commands_option_is_named_as_such_not_suggested_as_itself(tmp_path, capsys):
    """export's --overwrite given to anonymize: 'did you mean --overwrite?' would say nothing."""
    log = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0)])
    args = ["anonymize", "--input", str(log), "-o", str(tmp_path / "o"), "--overwrite"]
    assert main([*args, "--tokenizer", "t"]) == 2
    said = capsys.readouterr().err
    assert "--overwrite (not an option of this command)" in said
    assert "did you mean" not in said


def test_a_negative_value_reaches_its_option_and_is_named(tmp_path, capsys):
    trace = write_jsonl(
        tmp_path / "t.jsonl",
        [{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [0]}],
    )
    assert main(["simulate", str(trace), "--capacity", "-3M"]) == 2
    assert "capacity '-3M'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "prefix"),
    [
        (["anonymize", "in.jsonl", "-o", "out"], "--chat-template"),
        (["id-map", "upgrade", "MAP"], "--salt"),
    ],
)
def test_a_flag_is_taken_only_as_spelled_in_full(capsys, command, prefix):
    """A prefix of a flag is not the flag (argparse would take it so, binding the value to
    another option than the user named): every parser under kvtrace's refuses it."""
    assert main([*command, prefix, "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown option") and prefix in err and err.count("\n") == 1
