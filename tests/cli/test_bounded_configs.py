"""Presets and model presets are read only when they are regular files within their bound, parsed
within depth and alias bounds, and their sizes bounded: each refusal one line, never a hang or a
traceback."""

from __future__ import annotations

import os

import pytest

from helpers import chat, write_jsonl
from kvtrace.cli import main
from kvtrace.config import MAX_CONFIG_BYTES, MAX_DEPTH, MAX_NUMBER_CHARS, load_bounded_yaml
from kvtrace.presets import MODEL_SIZE_BOUNDS, load_model
from kvtrace.transforms.errors import ConfigError


def _anonymize_with_preset(tokenizer: str, tmp_path, preset: str) -> int:
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0)])
    return main(
        [
            "anonymize",
            "--input",
            str(src),
            "--output",
            str(tmp_path / "out"),
            "--tokenizer",
            tokenizer,
            "--config",
            preset,
        ]
    )


@pytest.mark.parametrize("make", ["fifo", "dev_zero", "huge"])
def test_a_preset_that_is_no_regular_file_or_too_large_is_one_line(
    tiny_tokenizer, tmp_path, capsys, make
):
    preset = tmp_path / "preset.yaml"
    if make == "fifo":
        os.mkfifo(preset)  # opened for reading, it would wait for a writer forever
    elif make == "dev_zero":
        preset.symlink_to("/dev/zero")
    else:
        with open(preset, "wb") as handle:  # sparse: refused by its size, not read
            handle.truncate(MAX_CONFIG_BYTES + 1)
    assert _anonymize_with_preset(tiny_tokenizer, tmp_path, str(preset)) == 2
    err = capsys.readouterr().err
    assert ("not a regular file" if make != "huge" else "bytes allowed") in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 5000])
def test_a_preset_nested_too_deep_is_one_line(tmp_path, depth):
    preset = tmp_path / "deep.yaml"
    preset.write_text("chat-template-kwargs: " + "[" * depth + "]" * depth + "\n")
    with pytest.raises(ConfigError, match="nested more than"):
        load_bounded_yaml(str(preset), "--config")


@pytest.mark.parametrize("value", ["2025-02-30", "2025-01-01 00:00:00 +25:00"])
def test_a_value_yaml_resolves_but_cannot_build_is_not_valid_yaml_naming_the_file(tmp_path, value):
    preset = tmp_path / "odd.yaml"
    preset.write_text(f"date: {value}\n")
    with pytest.raises(ConfigError, match="not valid YAML") as refused:
        load_bounded_yaml(str(preset), "--config")
    message = str(refused.value)
    assert message.startswith(f"--config {preset}: ") and len(message.splitlines()) == 1


@pytest.mark.parametrize(
    "text, key",
    [
        ("block-size: " + "9" * 5000, "block-size"),
        ("seed: 0x" + "f" * 100_000, "seed"),  # built in linear time, but no preset's number
        ("fraction: 0." + "5" * 100, "fraction"),
        ("window: !!int " + ":".join(["59"] * 1000), "window"),  # base 60 only by its tag
        ("beam:\n  workers: [1, " + "2" * 50 + "]", "workers"),
        ("? " + "7" * 50 + "\n: x", "the document"),  # a key is built too
    ],
)
def test_a_number_over_the_bound_is_refused_naming_the_file_and_key(tmp_path, text, key):
    preset = tmp_path / "long.yaml"
    preset.write_text(text + "\n")
    with pytest.raises(ConfigError, match="characters") as refused:
        load_bounded_yaml(str(preset), "--config")
    message = str(refused.value)
    assert message.startswith(f"--config {preset}: ") and len(message.splitlines()) == 1
    assert key in message and f"at most {MAX_NUMBER_CHARS}" in message


def test_base_60_is_read_as_yaml_1_2_does_and_other_numbers_as_before(tmp_path):
    preset = tmp_path / "numbers.yaml"
    longest = "1" * MAX_NUMBER_CHARS
    preset.write_text(
        f"a: 1:30\nb: 190:20:30.15\nc: 1_000\nd: 0x1F\ne: 1.5\nf: .inf\ng: -3\nh: {longest}\n"
    )
    loaded = load_bounded_yaml(str(preset), "--config")
    assert loaded == {
        "a": "1:30",
        "b": "190:20:30.15",
        "c": 1000,
        "d": 31,
        "e": 1.5,
        "f": float("inf"),
        "g": -3,
        "h": int(longest),
    }


@pytest.mark.parametrize(
    "text, key, lines",
    [
        ("block-size: 16\nprocesses: 2\nblock-size: 32\n", "block-size", (1, 3)),
        ("beam:\n  workers: 1\n  workers: 2\n", "workers", (2, 3)),
        ("chat-template-kwargs: {a: 1, a: 2}\n", "a", (1, 1)),
        ("1: x\n0x1: y\n", "1", (1, 2)),  # the same key once built
    ],
)
def test_a_key_given_twice_is_refused_naming_the_file_key_and_lines(tmp_path, text, key, lines):
    preset = tmp_path / "twice.yaml"
    preset.write_text(text)
    with pytest.raises(ConfigError, match="given twice") as refused:
        load_bounded_yaml(str(preset), "--config")
    message = str(refused.value)
    assert message.startswith(f"--config {preset}: ") and len(message.splitlines()) == 1
    assert f"key {key!r} given twice, at lines {lines[0]} and {lines[1]}" in message


def test_a_merge_key_still_overrides_what_it_brings(tmp_path):
    preset = tmp_path / "merge.yaml"
    preset.write_text("base: &b {x: 1, y: 2}\nnight:\n  <<: *b\n  x: 3\n")
    loaded = load_bounded_yaml(str(preset), "--config")
    assert loaded["night"] == {"x": 3, "y": 2}


def test_a_preset_nested_within_the_bound_loads(tmp_path):
    preset = tmp_path / "ok.yaml"
    depth = MAX_DEPTH - 2  # the document's mapping and its value take two levels
    preset.write_text("chat-template-kwargs: " + "[" * depth + "]" * depth + "\n")
    assert "chat-template-kwargs" in load_bounded_yaml(str(preset), "--config")


@pytest.mark.parametrize(
    "key, value",
    [
        ("layers", 0),
        ("layers", MODEL_SIZE_BOUNDS["layers"] + 1),
        ("head_dim", "128"),
        ("kv_heads", True),
        ("kv_lora_rank", 10**30),
    ],
)
def test_a_model_preset_size_out_of_bounds_is_refused(tmp_path, key, value):
    preset = tmp_path / "model.yaml"
    sizes = {"layers": 32, "kv_heads": 8, "head_dim": 128, key: value}  # each key once
    text = "".join(f"{name}: {size!r}\n" for name, size in sizes.items())
    preset.write_text("name: m\n" + text.replace("True", "true"))
    with pytest.raises(ValueError, match=f"{key} must be a whole number"):
        load_model(str(preset))


def test_the_shipped_model_presets_are_within_bounds():
    from kvtrace.presets import models

    for name in models():
        assert load_model(name)["name"] == name


@pytest.mark.parametrize(
    "text",
    ["<<: {block-size: 16}\n<<: {block-size: 64}\n", "<<: [{block-size: 16}, {block-size: 64}]\n"],
    ids=["two-merge-keys", "two-merged-mappings"],
)
def test_a_key_two_merges_give_is_refused(tmp_path, text):
    """A key given twice by merges is given twice: one line, whichever way it is merged."""
    config = tmp_path / "night.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError, match="given twice"):
        load_bounded_yaml(str(config), "--config")
