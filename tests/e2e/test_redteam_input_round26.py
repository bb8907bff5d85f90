"""Red team round 26, hostile input (everything but the Parquet readers): reproducers of the holes
found past the round-1..25 fixes. Each feeds input an attacker or a careless operator could give
through the real CLI and asserts the promised behaviour (bad input: a one-line error or a dead
letter saying why, never a crash, a hang or memory that grows without bound; values checked as
the serving engine checks them, never a made-up length; nothing lost: read = exported +
rejected). Each failed on 2026-11-28."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers import KVTRACE, ROOT, SALT, chat, qwen3_run, read_jsonl, under_rlimit, write_jsonl

pytestmark = pytest.mark.slow

T0 = 1763700000000  # 2025-11-21T04:40:00Z, epoch ms


def test_a_prompt_of_token_ids_past_any_vocabulary_is_a_letter(tmp_path):
    """Values checked as the serving engine checks them; never a made-up length. A Completions
    request may send its prompt as token ids (`prompt: [ids]`, read as a token-ids record is);
    records._token_ids holds each id to uint32 (MAX_TOKEN_ID, the dtype kvtrace stores) and
    nothing else. The engine refuses a prompt holding an id past both its tokenizer's
    vocabulary and its model's (`Token id N is out of vocabulary`, a 400: the request was never
    prefilled), so a log of ids from another model's tokenizer, or a client's bug, is exported
    as a request of that length the engine served. 10^9 is past every model's vocabulary
    (Qwen3's tokenizer ends at 151,668, its model at 151,935). Promised: a letter."""
    prompt = {"model": "m", "prompt": [1_000_000_000, 5, 6]}
    records = [
        {"timestamp": T0, "request": {"model": "m", "prompt": "good one"}, "output_length": 2},
        {"timestamp": T0 + 1, "request": prompt, "output_length": 3},
    ]
    code, rows, dead = qwen3_run(tmp_path, records, "--max-rejected-fraction", "1")
    assert code == 0
    assert len(rows) + len(dead) == 2
    assert [row["input_length"] for row in rows] == [2], "a prompt the engine refused exported"
    assert len(dead) == 1


def _backtracking_tokenizer(tiny_tokenizer: str, folder: Path) -> Path:
    """The tiny tokenizer with a pre-tokenizer regex that backtracks, as an operator's (or a
    downloaded model's) tokenizer.json may: `(a|a)+b` costs 2^n steps at each start in a run of
    n `a`s not followed by `b`, under Oniguruma's retry limit (10^7 a match) up to n = 23."""
    folder.mkdir()
    for path in Path(tiny_tokenizer).iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    spec = json.loads((folder / "tokenizer.json").read_text())
    split = {"type": "Split", "pattern": {"Regex": "(a|a)+b"}, "behavior": "Isolated"}
    steps = [{**split, "invert": False}]
    if spec.get("pre_tokenizer") is not None:
        steps.append(spec["pre_tokenizer"])
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": steps}
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return folder


@pytest.mark.xfail(
    strict=True,
    reason="accepted residual: a tokenizer folder's own regex runs unbounded (docs/BOUNDS.md)",
)
def test_a_tokenizer_regex_that_backtracks_under_its_retry_limit_costs_bounded_cpu(
    tiny_tokenizer, tmp_path
):
    """Bounded CPU for any input; never a hang. A tokenizer's pre-tokenizer regex is code from
    its folder, as its chat template is, but only the template has a budget (render_budget.py:
    5 CPU-s a render). Rounds 1 and 11 made a regex that gives up (over Oniguruma's retry limit:
    a panic) a `tokenizer_error` letter; one that stays just under the limit is never stopped:
    `(a|a)+b` over runs of 21 `a`s costs ~2^22 steps a run, ~2.5 CPU-ms a byte of prompt,
    linear in the record (measured: a 4.4 KB record, 11.6 CPU-s in `anonymize --processes 1`
    with Qwen3's tokenizer under this regex; a 1 MB record ~40 CPU-min; one at the 16 MiB bound
    ~11 CPU-h), in one Rust call no watchdog, Ctrl-C or SIGTERM interrupts. Here a 44 KB
    record (~100 CPU-s) beside a good chat, each process of the run held to 8 CPU-s (SIGXCPU
    kills a worker past it: today "error: a worker process died by SIGKILL", exit 1; unbounded,
    the run takes its ~100 CPU-s). Promised: the record a letter (its tokenization over a budget),
    the chat published, within the bound."""
    tokenizer = _backtracking_tokenizer(tiny_tokenizer, tmp_path / "tok")
    slow = {"timestamp": 1001, "prompt": ("a" * 21 + " ") * 2000, "output_length": 1}
    log = write_jsonl(tmp_path / "in.jsonl", [chat(0, 1000), slow])
    (tmp_path / "salt").write_text(SALT)
    out = tmp_path / "out"
    command = [*KVTRACE, "anonymize", "--input", str(log), "--tokenizer", str(tokenizer)]
    command += ["--output", str(out), "--salt-file", str(tmp_path / "salt"), "--block-size", "4"]
    command += ["--max-rejected-fraction", "1", "--processes", "1", "--quiet"]
    done = subprocess.run(
        under_rlimit(command, "RLIMIT_CPU", 8),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [row for path in sorted(out.glob("trace-*.jsonl")) for row in read_jsonl(path)]
    letters = [x for p in Path(f"{out}-rejected").glob("*.jsonl") for x in read_jsonl(p)]
    assert (len(rows), len(letters)) == (1, 1)


def test_a_chat_request_with_a_tool_its_api_refuses_is_a_letter(tmp_path):
    """Values checked as the serving engine checks them; never a made-up length. The engine's
    Chat Completions request takes `tools` as a list of its tool model (`type` "function", the
    only one; `function` required: an object with a string `name`) and refuses any other with a
    400: the request was never prefilled. kvtrace checks tools with one shape for every API
    (shapes.TOOL: Chat's, Responses' flat form and Anthropic's fields at once) and
    chat.served_tools hands a tool that is no function tool to the template as it was sent, so
    a Chat Completions request carrying the Responses API's flat form (`{"type": "function",
    "name": ..., "parameters": ...}`, a client's easy mistake) is exported with the template's
    rendering of it (135 tokens with Qwen3's, against 11 for the question alone), and so is a
    built-in tool (`{"type": "web_search"}`: 100). Promised: a letter, as the engine answered."""
    flat = {"type": "function", "name": "get_tide", "description": "The day's high tide"}
    flat["parameters"] = {"type": "object", "properties": {"place": {"type": "string"}}}
    question = [{"role": "user", "content": "When is high tide in Kyoto?"}]
    records = [
        {"timestamp": T0, "request": {"model": "m", "messages": question}, "output_length": 2},
        {
            "timestamp": T0 + 1,
            "request": {"model": "m", "messages": question, "tools": [flat]},
            "output_length": 3,
        },
    ]
    code, rows, dead = qwen3_run(tmp_path, records, "--max-rejected-fraction", "1")
    assert code == 0
    assert len(rows) + len(dead) == 2
    assert len(rows) == 1, "a request the engine refused exported with its tool rendered"
    assert len(dead) == 1
