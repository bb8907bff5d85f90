"""Red team round 9, hostile input: reproducers of the holes found past the round-1..8 fixes
(test_redteam_input*.py). Each asserts the promised behaviour (bad input: a one-line error that
names what is wrong, never an unanticipated exception) and fails today (2026-11-27)."""

from __future__ import annotations

import json
import shutil

import pytest

from helpers import kvtrace_child, write_jsonl

pytestmark = pytest.mark.slow

# Deeper than CPython's JSON parser survives (it raises RecursionError past ~1000 levels).
DEEP = 5000


def _one_chat(tmp_path) -> str:
    return str(
        write_jsonl(
            tmp_path / "logs.jsonl",
            [{"timestamp": 1_700_000_000, "messages": [{"role": "user", "content": "hi"}]}],
        )
    )


@pytest.mark.xfail(strict=True, reason="red team round 9")
def test_a_deeply_nested_tokenizer_config_is_named_in_one_line(tiny_tokenizer, tmp_path):
    """fast_tokenizer._json_object catches json.JSONDecodeError only: a 10 KB
    tokenizer_config.json of 5,000 nested lists raises RecursionError, which the CLI's
    catch-all reports as "the job failed: RecursionError: maximum recursion depth exceeded
    ... (run with --verbose for the traceback)", naming neither the file nor its fault (exit
    1, as for a failed job, not 2 for bad input); anonymize, audit and render alike, on both
    engines. A shallow damaged config is "error: tokenizer_config.json: not JSON (...)"."""
    folder = tmp_path / "tokenizer"
    shutil.copytree(tiny_tokenizer, folder)
    (folder / "tokenizer_config.json").write_text("[" * DEEP + "]" * DEEP)
    done = kvtrace_child(
        "anonymize",
        "--input",
        _one_chat(tmp_path),
        "--output",
        str(tmp_path / "out"),
        "--tokenizer",
        str(folder),
        "--quiet",
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "tokenizer_config.json" in done.stderr, done.stderr
    assert "RecursionError" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.xfail(strict=True, reason="red team round 9")
def test_deeply_nested_chat_template_kwargs_are_refused_naming_the_flag(tiny_tokenizer, tmp_path):
    """anonymize.py reads --chat-template-kwargs with a bare json.loads (as do `check` and
    `replay`): a 10 KB value nested 5,000 deep is "the job failed: RecursionError ...", exit
    1, where every other bad value of the flag is a usage error naming it (exit 2)."""
    kwargs = json.dumps({"enable_thinking": False})[:-1] + ', "x": ' + "[" * DEEP + "]" * DEEP
    done = kvtrace_child(
        "anonymize",
        "--input",
        _one_chat(tmp_path),
        "--output",
        str(tmp_path / "out"),
        "--tokenizer",
        tiny_tokenizer,
        "--quiet",
        "--chat-template-kwargs",
        kwargs + "}",
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "--chat-template-kwargs" in done.stderr, done.stderr
    assert "RecursionError" not in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()
