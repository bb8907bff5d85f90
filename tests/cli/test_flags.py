"""The flags every command shares keep one spelling: -o/--output wherever one output is written,
and sizes in bytes read by the one size parser."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvtrace.cli import _parser, main
from kvtrace.commands.anonymize import _merged, option_kinds
from kvtrace.commands.common import json_flag
from kvtrace.config import load_presets
from kvtrace.transforms.errors import ConfigError
from kvtrace.transforms.read.records import DEFAULT_MAX_RECORD_BYTES


def subcommands() -> dict:
    return next(a for a in _parser()._actions if a.dest == "command").choices


def test_every_command_that_takes_output_takes_o_too():
    spelled = {
        name: next(a.option_strings for a in parser._actions if "--output" in a.option_strings)
        for name, parser in subcommands().items()
        if any("--output" in a.option_strings for a in parser._actions)
    }
    assert {"anonymize", "analyze", "reuse", "report", "synthesize"} <= set(spelled)
    assert {name for name, flags in spelled.items() if flags != ["-o", "--output"]} == set()


def anonymize_options(tmp_path: Path, preset: str, *flags: str) -> dict:
    """anonymize's options as a run reads them: the preset under the flags, defaults below."""
    (tmp_path / "site.yaml").write_text(preset)
    argv = ["anonymize", "--input", "x", "-o", "y", "--tokenizer", "t", *flags]
    args, _ = _parser().parse_known_args(argv)
    presets, _ = load_presets([str(tmp_path / "site.yaml")], option_kinds())
    return _merged(args, presets)


def test_sizes_take_units_as_flags_and_as_preset_keys_and_bare_numbers_read_as_before(tmp_path):
    defaults = anonymize_options(tmp_path, "{}\n")
    assert defaults["max_record_bytes"] == DEFAULT_MAX_RECORD_BYTES
    assert defaults["segment_cache_mb"] == 256 * 2**20
    flags = anonymize_options(
        tmp_path, "{}\n", "--max-record-bytes", "1MB", "--segment-cache-mb", "1GB"
    )
    assert (flags["max_record_bytes"], flags["segment_cache_mb"]) == (10**6, 10**9)
    preset = anonymize_options(tmp_path, "max-record-bytes: 2MiB\nsegment-cache-mb: 512\n")
    assert (preset["max_record_bytes"], preset["segment_cache_mb"]) == (2 * 2**20, 512 * 2**20)
    bare = anonymize_options(tmp_path, "max-record-bytes: 4096\n", "--segment-cache-mb", "0")
    assert (bare["max_record_bytes"], bare["segment_cache_mb"]) == (4096, 0)


@pytest.mark.parametrize(
    ("preset", "flags", "said"),
    [
        ("{}\n", ("--max-record-bytes", "1M"), "--max-record-bytes: size '1M': write bytes"),
        ("segment-cache-mb: 2TiB\n", (), "--segment-cache-mb must be from 0 to"),
        ("max-record-bytes: 100\n", (), "--max-record-bytes must be from 1,024 to"),
        ("max-record-bytes: true\n", (), "max-record-bytes must be a size"),
    ],
)
def test_a_size_out_of_bounds_or_unit_is_refused_in_one_line(tmp_path, preset, flags, said):
    with pytest.raises(ConfigError, match=re.escape(said)) as refused:
        anonymize_options(tmp_path, preset, *flags)
    assert "\n" not in str(refused.value)


def test_kv_bytes_per_token_takes_a_size(tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}\n')
    argv = ["simulate", str(trace), "--block-size", "4", "--capacity", "1MiB", "--json"]
    assert main([*argv, str(tmp_path / "kib.json"), "--kv-bytes-per-token", "128KiB"]) == 0
    assert main([*argv, str(tmp_path / "bytes.json"), "--kv-bytes-per-token", "131072"]) == 0
    kib, plain = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("kib", "bytes"))
    assert kib == plain
    assert main([*argv, str(tmp_path / "k.json"), "--kv-bytes-per-token", "128K"]) == 2
    assert "--kv-bytes-per-token: size '128K'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[" * 5000 + "]" * 5000, "nested deeper than 32 levels"),  # past the parser's stack
        ('{"a": 1, "a": 2}', "an object repeats a key"),
        ('{"a": NaN}', "NaN is not JSON"),
        ("{", "not JSON"),
    ],
)
def test_a_json_flag_the_parse_refuses_is_a_usage_error_naming_the_flag(text, said):
    with pytest.raises(ConfigError, match=f"^--chat-template-kwargs: {said}"):
        json_flag("--chat-template-kwargs", text)
    assert json_flag("--chat-template-kwargs", '{"enable_thinking": false}') == {
        "enable_thinking": False
    }
