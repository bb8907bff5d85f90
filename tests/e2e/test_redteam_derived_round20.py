"""Red team round 20, hostile input (everything but the Parquet readers): reproducers of the holes
found past the round-1..19 fixes. Each asserts the promised behaviour (bounded resources for any
input: a record stays within docs/BOUNDS.md's ceilings, here a render's 1 GiB of process growth)
and fails today (2026-11-28)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import KVTRACE, ROOT, SALT, peak_rss_mb, shared_path, under_rlimit, write_jsonl

pytestmark = pytest.mark.slow

# A template that prints the tokenizer's eos_token after each assistant turn as an output of its
# own (not concatenated to the content): each such `{{ }}` yields the same string object.
EOS_PRINTED_PER_TURN = (
    "{{ bos_token }}{% for message in messages %}{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
)


def _tokenizer(tmp_path: Path, template: str) -> Path:
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    qwen3 = shared_path("tokenizers", "qwen3")
    shutil.copy(qwen3 / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((qwen3 / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_a_render_of_one_string_printed_per_turn_stays_within_the_render_budget(tmp_path):
    """Bounded memory. bounded_sandbox.BoundedEnvironment.concat joins a render's pieces and
    only then checks the output's length (its docstring: "joining them at most doubles" what
    the pieces hold). But pieces may all be one object: a request's own chat_template_kwargs
    eos_token of 1 MB, printed after each of 2,000 empty assistant turns, is 2,000 references
    (16 KB) for the watchdog, and one C call the watchdog cannot stop joins them into 2 GB.
    A 1 MB record (bound 2 MiB) peaks at ~2.1 GB (2,500 turns: 2.6 GB; with the default
    16 MiB bound any product up to the machine's memory is allocated and touched, so a
    handful of such records OOM-kills the workers; past it, malloc fails: a MemoryError
    letter). BOUNDS.md's ceiling for a render is 1 GiB of process growth (render_budget),
    and ~150 x the record for the encode stage. Promised: the record is a dead letter within
    that budget; asserted on the process's peak RSS."""
    turns = [{"role": "assistant", "content": ""}] * 2_000
    record = {
        "timestamp": 0,
        "messages": [{"role": "user", "content": "q"}, *turns, {"role": "user", "content": "x"}],
        "output_length": 1,
        "chat_template_kwargs": {"eos_token": "x" * 1_000_000},
    }
    clean = {"timestamp": 1, "messages": [{"role": "user", "content": "hi"}], "output_length": 1}
    source = write_jsonl(tmp_path / "in.jsonl", [record, clean])
    (tmp_path / "salt").write_text(SALT)
    code, peak, stderr = peak_rss_mb(
        [
            *KVTRACE,
            "anonymize",
            "--input",
            str(source),
            "--tokenizer",
            str(_tokenizer(tmp_path, EOS_PRINTED_PER_TURN)),
            "--block-size",
            "16",
            "--salt-file",
            str(tmp_path / "salt"),
            "--max-record-bytes",
            "2097152",
            "--processes",
            "1",
            "--output",
            str(tmp_path / "out"),
        ]
    )
    # exit 1 is right: the record is all but the night's bytes (the gate refuses it)
    assert code in (0, 1) and "Traceback" not in stderr, stderr[-2000:]
    assert peak < 1024 + 300, peak


# Round 19's template: the tokenizer's eos_token after every assistant turn (Llama-2/Mistral).
EOS_PER_TURN = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)


def test_a_small_record_cannot_render_to_the_whole_bound_of_three_byte_characters(tmp_path):
    """Bounded memory. Round 19's fix (tokenize.check_rendered) holds a rendered prompt to
    4 x --max-record-bytes + 64 Ki characters: the bound's, not the record's, and counted in
    characters, where the tokenizer's cost goes by bytes (byte-level BPE: a private-use
    character is 3 tokens). A 52 KB record (bound 512 KiB) whose own eos_token is 4,200 such
    characters, written after each of 500 turns, renders to 2.1 M characters, under the check,
    and is published as one row of 6.27 M input tokens at a 1.36 GB peak, where BOUNDS.md's
    encode ceiling is ~150 x the record (0.49 GB for a record of 2 MiB); with the default 16 MiB
    bound a 1.7 MB record renders to 64 M characters (~200 M tokens). Promised: the record is a
    too_large dead letter or costs what BOUNDS.md states; asserted on the peak RSS."""
    messages = []
    for i in range(500):
        messages += [
            {"role": "user", "content": f"q{i}"},
            {"role": "assistant", "content": f"a{i}"},
        ]
    messages.append({"role": "user", "content": "last"})
    eos = "".join(chr(0xE000 + (i * 7919) % 4000) for i in range(4_200))
    record = {
        "timestamp": 0,
        "messages": messages,
        "output_length": 1,
        "chat_template_kwargs": {"eos_token": eos},
    }
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")
    assert source.stat().st_size < 60_000
    (tmp_path / "salt").write_text(SALT)
    code, peak, stderr = peak_rss_mb(
        [
            *KVTRACE,
            "anonymize",
            "--input",
            str(source),
            "--tokenizer",
            str(_tokenizer(tmp_path, EOS_PER_TURN)),
            "--block-size",
            "16",
            "--salt-file",
            str(tmp_path / "salt"),
            "--max-record-bytes",
            "524288",
            "--processes",
            "1",
            "--output",
            str(tmp_path / "out"),
        ]
    )
    assert code in (0, 1) and "Traceback" not in stderr, stderr[-2000:]
    assert peak < 450, peak


def test_a_records_system_messages_cost_no_cpu_past_the_records_size(tmp_path):
    """Bounded CPU. After a chat is rendered, encode_requests.unrendered looks for each system
    or developer message's content in the whole prompt (`m["content"] not in prompt`): one scan
    of the prompt per such message, outside the render's budget, so the cost is messages x
    prompt, which a record chooses. 20,000 short system messages after a 1 MB user message
    (Qwen3's own template renders them after it; a 1.9 MB record, bound 2 MiB) take 27 s of
    CPU where the same record with user roles takes 1.5 s; at the default 16 MiB bound 43,000
    of them (the 128 Ki item bound) behind 8 MB of text take about an hour, one record.
    Promised: bounded CPU for any input (a record's cost follows its size); asserted under
    RLIMIT_CPU, which kills a process that goes past it (the run then fails, exit 1)."""
    filler = "s1 " * 350_000  # text of the system contents' own form: each scan reads it all
    messages = [
        {"role": "user", "content": filler},
        *({"role": "system", "content": f"s{i}x"} for i in range(20_000)),
        {"role": "user", "content": "go"},
    ]
    source = write_jsonl(
        tmp_path / "in.jsonl", [{"timestamp": 0, "messages": messages, "output_length": 1}]
    )
    (tmp_path / "salt").write_text(SALT)
    command = [
        *KVTRACE,
        "anonymize",
        "--input",
        str(source),
        "--tokenizer",
        str(shared_path("tokenizers", "qwen3")),
        "--block-size",
        "16",
        "--salt-file",
        str(tmp_path / "salt"),
        "--max-record-bytes",
        "2097152",
        "--max-rejected-fraction",
        "1",
        "--processes",
        "1",
        "--output",
        str(tmp_path / "out"),
    ]
    done = subprocess.run(
        under_rlimit(command, "RLIMIT_CPU", 10),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
    )
    # exported or a dead letter, either way a run that ends (every rejected byte allowed)
    assert done.returncode == 0, (done.returncode, done.stderr[-1500:])


def test_a_config_key_given_twice_through_two_merge_keys_is_refused(tmp_path):
    """YAML configs refuse a key given twice. config._BoundedLoader.construct_mapping skips the
    merge key (<<) when it looks for keys given twice, so a mapping may hold `<<` twice, and a
    key both merges give (`block-size` 16, then 64) silently takes the last one's value: the
    night runs at block size 64, with no word. (PyYAML keeps every `<<` of a mapping; YAML
    1.1's merge takes one, whose keys a mapping's own override, as the loader allows.)
    Promised: a one-line usage error naming the key, exit 2, nothing published."""
    config = tmp_path / "night.yaml"
    config.write_text("<<: {block-size: 16}\n<<: {block-size: 64}\n")
    source = write_jsonl(
        tmp_path / "in.jsonl",
        [{"timestamp": 0, "messages": [{"role": "user", "content": "hi"}], "output_length": 1}],
    )
    (tmp_path / "salt").write_text(SALT)
    done = subprocess.run(
        [
            *KVTRACE,
            "anonymize",
            "--config",
            str(config),
            "--input",
            str(source),
            "--tokenizer",
            str(shared_path("tokenizers", "qwen3")),
            "--salt-file",
            str(tmp_path / "salt"),
            "--processes",
            "1",
            "--output",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, (done.returncode, done.stderr[-1000:])
    assert "twice" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()
