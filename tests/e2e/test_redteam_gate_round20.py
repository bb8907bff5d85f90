"""Red team round 20, the gate's publishing side (nothing private published; the audit fails
closed, and passes what kvtrace itself writes): reproducers of what anonymize still publishes
against the operator's settings. Each asserts the promised behaviour, so each fails until it is
fixed."""

from __future__ import annotations

import json

import pytest

from helpers import chat, write_jsonl
from kvtrace.cli import main

pytestmark = pytest.mark.slow


def test_an_option_given_twice_in_two_spellings_in_a_config_is_refused(
    tiny_tokenizer, tmp_path, capsys
):
    """Round 19 made a YAML config refuse a key given twice (config._BoundedLoader), but it
    compares the keys as written, and load_presets then folds `length-granularity` into
    `length_granularity` (key.replace("-", "_")) in a dict comprehension that keeps the last
    silently. A config whose first line asks for output lengths rounded to 16 and whose later
    line, spelled with an underscore, says 1 runs without a word and publishes every exact
    length (manifest granularity 1): the rounding the operator reads at the top of the file is
    dropped, and `kvtrace audit` (which takes no --config) passes the folder unless it is given
    the rounding the operator meant. Promised: the option given twice is refused in one line
    (exit 2), nothing published, as when both lines use one spelling."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1_000 * i) for i in range(4)])
    config = tmp_path / "night.yaml"
    config.write_text("length-granularity: 16\nblock_size: 16\nlength_granularity: 1\n")
    out = tmp_path / "out"
    code = main(
        ["anonymize", "--config", str(config), "--input", str(src), "--tokenizer", tiny_tokenizer]
        + ["--output", str(out), "--quiet"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert not out.exists()
    assert "length_granularity" in err and "twice" in err


def test_a_config_number_with_a_leading_zero_is_read_as_written_or_refused(
    tiny_tokenizer, tmp_path, capsys
):
    """The same cause, a value (round 18 closed its base-60 form, config._BoundedLoader): YAML
    1.1 reads a leading zero as octal, so `timestamp_granularity_ms: 0100` in a config is 64 ms.
    The night publishes times rounded to 64 ms, finer than the 100 the file says, and a round
    value (a power of two), so `kvtrace audit` given no option passes it. Promised: the number
    read as its decimal digits say (100 ms, as the same text after --timestamp-granularity-ms
    is), or refused in one line (exit 2) with nothing published."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1_000 * i + 37 * i) for i in range(4)])
    config = tmp_path / "night.yaml"
    config.write_text("timestamp_granularity_ms: 0100\n")
    out = tmp_path / "out"
    code = main(
        ["anonymize", "--config", str(config), "--input", str(src), "--tokenizer", tiny_tokenizer]
        + ["--output", str(out), "--quiet"]
    )
    capsys.readouterr()
    if code == 0:
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["granularity"]["timestamp_ms"] == 100
    else:
        assert code == 2 and not out.exists()
