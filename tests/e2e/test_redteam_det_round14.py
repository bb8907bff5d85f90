"""Red team round 14, determinism: reproducers of output that depends on the tokenizer backend
for the same input and configuration. Each test asserts the promised behaviour and fails today
(issue 33)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import SALT, kvtrace_child, shared_path, trace, write_jsonl

pytestmark = pytest.mark.slow

DAY0_S = 1_700_000_000
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def _qwen3_splitting_on(tmp_path: Path, regex: str) -> str:
    """Qwen3's tokenizer with its Split pre-tokenizer's regex replaced ({qwen3} in regex: the
    one it had), as an operator's own tokenizer.json: fastokens' closed list takes any regex
    of an Isolated Split, and only the probe texts stand between the two regex engines."""
    qwen3 = shared_path("tokenizers", "qwen3")
    folder = tmp_path / "tok"
    folder.mkdir()
    for path in qwen3.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    spec = json.loads((folder / "tokenizer.json").read_text())
    pattern = spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]
    pattern["Regex"] = regex.replace("{qwen3}", pattern["Regex"])
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return str(folder)


@pytest.mark.parametrize(
    ("regex", "line"),
    [
        # Oniguruma (tokenizers, Ruby syntax): `$` ends every line; fastokens: only the text
        (" +$|{qwen3}", "the end of line {i}  \nand the next"),
        # GPT-2's pattern: U+180E (whitespace until Unicode 6.3) is `\s` to fastokens alone
        (GPT2_REGEX, "item {i}  \u180e done"),
    ],
    ids=["dollar", "gpt2-mongolian-vowel-separator"],
)
def test_auto_publishes_the_ids_tokenizers_gives(tmp_path, regex, line):
    """Promise (docs/TOKENIZER_BACKENDS.md): 'a backend is used only where it gives exactly the
    ids of tokenizers'; the same input and configuration give byte-identical output whatever
    the backend. The gate is a closed list of components (a Split of any regex passes), the
    probe texts, and one text in 64 checked in the run. The two regex engines read some
    syntax (`$`: the end of a line or of the text) and some characters (U+180E: `\\s` or not)
    differently, and the probes never meet a text where that shows: a tokenizer whose Split
    regex holds `$`, or is GPT-2's, passes every probe, so `auto` picks fastokens, which
    pre-tokenizes 'x  \\ny' (or '  \\u180e') otherwise than tokenizers. The run's texts that
    differ are not among those sampled (chosen by their content), so `auto` publishes other
    hash ids than `tokenizers` for the same log, with no warning; the id map's fingerprint,
    a probe of `tokenizers`' alone, lets such nights extend a map made with the other."""
    tokenizer = _qwen3_splitting_on(tmp_path, regex)
    prompts = [
        {"timestamp": DAY0_S + i, "prompt": line.format(i=i) + " and some more words"}
        for i in range(6)
    ]
    log = write_jsonl(tmp_path / "log.jsonl", prompts)
    (tmp_path / "salt").write_text(SALT)
    for backend in ("tokenizers", "auto"):
        done = kvtrace_child(
            "anonymize", "--input", str(log), "--output", str(tmp_path / backend),
            "--tokenizer", tokenizer, "--block-size", "4",
            "--salt-file", str(tmp_path / "salt"), "--tokenizer-backend", backend, "--quiet",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert trace(tmp_path / "auto") == trace(tmp_path / "tokenizers")
