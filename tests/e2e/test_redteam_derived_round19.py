"""Red team round 19, hostile input (everything but Parquet readers): reproducers of the holes
found past the round-1..18 fixes. Each asserts the promised behaviour (bounded resources for any
input: a record at --max-record-bytes stays within docs/BOUNDS.md's ceiling; a one-line error or
a dead letter, never unbounded memory) and fails today (2026-11-28)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import KVTRACE, SALT, peak_rss_mb, read_jsonl, shared_path, write_jsonl

pytestmark = pytest.mark.slow

# A template of the common Llama-2/Mistral form: the tokenizer's eos_token after every
# assistant turn. transformers hands a template the special tokens as variables, and a
# request's chat_template_kwargs are merged over them.
EOS_PER_TURN = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)


def _eos_per_turn_tokenizer(tmp_path: Path) -> Path:
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    qwen3 = shared_path("tokenizers", "qwen3")
    shutil.copy(qwen3 / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((qwen3 / "tokenizer_config.json").read_text())
    config["chat_template"] = EOS_PER_TURN
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_a_requests_own_special_token_cannot_multiply_its_render_past_the_bound(tmp_path):
    """Bounded resources. A request's chat_template_kwargs (read.chat.template_settings) may
    name any variable, so also eos_token: here 24 KB of words, which an eos-per-assistant-turn
    template repeats after each of 200 turns. A 44 KB record (bound 64 KiB) renders a prompt
    of ~4.8 MB, published as one row of 3.1 M input tokens, and the run peaks at 1.36 GB
    (3.0 GB for a 59 KB record of 500 turns; the same record without the kwarg: 214 MB), where
    BOUNDS.md's ceiling for the encode stage is ~150 x the record (here under 10 MB over the
    process's ~210 MB). Promised: the record is a too_large dead letter or renders within the
    bound; asserted on the process's peak RSS."""
    words = " ".join(f"w{i % 97}x" for i in range(4_000))
    messages = []
    for i in range(200):
        messages += [
            {"role": "user", "content": f"q{i}"},
            {"role": "assistant", "content": f"a{i}"},
        ]
    messages.append({"role": "user", "content": "last"})
    record = {
        "timestamp": 0,
        "messages": messages,
        "output_length": 1,
        "chat_template_kwargs": {"eos_token": words},
    }
    source = write_jsonl(tmp_path / "in.jsonl", [record])
    assert source.stat().st_size < 65_536
    (tmp_path / "salt").write_text(SALT)
    out = tmp_path / "out"
    code, peak, stderr = peak_rss_mb(
        [
            *KVTRACE,
            "anonymize",
            "--input",
            str(source),
            "--tokenizer",
            str(_eos_per_turn_tokenizer(tmp_path)),
            "--block-size",
            "16",
            "--salt-file",
            str(tmp_path / "salt"),
            "--max-record-bytes",
            "65536",
            "--processes",
            "1",
            "--output",
            str(out),
        ]
    )
    assert code in (0, 1), stderr[-2000:]
    rows = [row for path in sorted(out.glob("trace-*.jsonl")) for row in read_jsonl(path)]
    assert peak < 400, (peak, [row["input_length"] for row in rows])
