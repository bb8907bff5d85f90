"""kvtrace audit, round 4's mechanisms from the operator's side: run settings no row shows are
published only when a consumer needs them and confirmed as the run was given them (hash scheme,
template kwargs), and the tokenizer's name comes from kvtrace's own vocabulary."""

from __future__ import annotations

import json

from helpers import anonymize, chat, write_jsonl
from kvtrace.cli import main
from kvtrace.transforms.trace_format import MANIFEST_SCHEMA


def _flags(folder, *options) -> tuple[int, list[str]]:
    code = main(["audit", str(folder), "--json", str(folder.parent / "flags.json"), *options])
    return code, json.loads((folder.parent / "flags.json").read_text())["flags"]


def test_a_dynamo_run_passes_only_with_its_scheme_given(tiny_tokenizer, tmp_path):
    """An unkeyed run's ids look like a keyed run's: the scheme is confirmed by the operator,
    and without --hash-scheme only the default keyed one passes."""
    rows = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(3)])
    out = tmp_path / "out"
    assert (
        anonymize(tiny_tokenizer, [rows], out, "--block-size", "4", "--hash-scheme", "dynamo") == 0
    )
    code, flags = _flags(out, "--tokenizer", tiny_tokenizer)
    assert code == 1 and flags == [flags[0]] and "pass --hash-scheme" in flags[0]
    assert _flags(out, "--tokenizer", tiny_tokenizer, "--hash-scheme", "dynamo") == (0, [])
    code, flags = _flags(out, "--tokenizer", tiny_tokenizer, "--hash-scheme", "kvtrace")
    assert code == 1 and flags[0].startswith("manifest.json: hash_scheme is not")


def test_template_kwargs_pass_unconfirmed_only_when_none(tiny_tokenizer, tmp_path):
    """Even a boolean switch is a setting no row shows: a run given one is confirmed by
    --chat-template-kwargs with its salt; without, the folder is flagged."""
    salt = tmp_path / "salt"
    salt.write_bytes(b"s" * 32)
    rows = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(3)])
    out = tmp_path / "out"
    kwargs = json.dumps({"enable_thinking": False})
    assert (
        anonymize(
            tiny_tokenizer,
            [rows],
            out,
            "--block-size",
            "4",
            "--salt-file",
            str(salt),
            "--chat-template-kwargs",
            kwargs,
        )
        == 0
    )
    code, flags = _flags(out, "--tokenizer", tiny_tokenizer)
    assert code == 1 and "--chat-template-kwargs" in flags[0]
    assert _flags(
        out,
        "--tokenizer",
        tiny_tokenizer,
        "--chat-template-kwargs",
        kwargs,
        "--salt-file",
        str(salt),
    ) == (0, [])


def test_the_manifest_publishes_only_what_a_consumer_reads(tiny_tokenizer, tmp_path):
    """How the logs were read (input format, timestamp unit) and whether engine hashes were
    written elsewhere are the operator's: no replayer, export or analysis reads them."""
    rows = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(2)])
    assert anonymize(tiny_tokenizer, [rows], tmp_path / "out", "--block-size", "4") == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert not {"input_format", "timestamp_unit", "block_hashes"} & set(manifest)
    assert set(manifest) == set(MANIFEST_SCHEMA["required"])
