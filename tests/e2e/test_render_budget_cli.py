"""Chat templates render under a budget: a runaway template is a template_error dead letter
within the deadline and under a memory cap, and one that runs away on kvtrace's own probe
conversation stops the job in one line. Hostile templates from each family: nested loops, doubling strings, huge ranges,
recursion through macros, huge outputs, and single steps that build a huge value at once.

The whole CLI runs; the unit tests are in tests/transforms/encode/test_render_budget.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import anonymize, write_jsonl
from kvtrace.transforms.encode import tokenize

TIGHT_S = 0.1  # the budget's deadline in the fast tests


# Templates that run away through many steps: the watchdog stops them.
RUNAWAY = {
    "nested_loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
    "{% endfor %}",
    "huge_output": "{% for i in range(100000) %}{% for j in range(100000) %}"
    "{{ messages[0].content }}{% endfor %}{% endfor %}",
    "list_growth": "{% set ns = namespace(items=[]) %}{% for i in range(100000) %}"
    "{% for j in range(100000) %}{% set ns.items = ns.items + [j] %}"
    "{% endfor %}{% endfor %}",
}


@pytest.fixture
def tight_budget(monkeypatch):
    """The watchdog's budget cut to a tenth of a second."""
    monkeypatch.setattr(tokenize.RENDER_WATCHDOG, "seconds", TIGHT_S)
    monkeypatch.setattr(tokenize.RENDER_WATCHDOG, "memory_bytes", 256 << 20)


def _folder_with_template(tiny_tokenizer: str, tmp_path: Path, template: str) -> str:
    folder = tmp_path / "tok"
    shutil.copytree(tiny_tokenizer, folder)
    (folder / "chat_template.jinja").write_text(template)
    return str(folder)


def _chat(content: str, ts: int) -> dict:
    return {"timestamp": ts, "messages": [{"role": "user", "content": content}], "output_length": 1}


def test_the_cli_stops_in_one_line_on_a_template_that_never_renders(
    tight_budget, tiny_tokenizer, tmp_path, capsys
):
    folder = _folder_with_template(tiny_tokenizer, tmp_path, RUNAWAY["nested_loops"])
    src = write_jsonl(tmp_path / "in.jsonl", [_chat("hello world", i) for i in range(10)])
    assert anonymize(folder, [src], tmp_path / "out", "--processes", "1") == 1
    err = capsys.readouterr().err
    assert "does not render" in err and "Traceback" not in err
    assert not list((tmp_path / "out").glob("trace-*"))


def test_the_cli_dead_letters_the_requests_a_template_runs_away_on(
    tight_budget, tiny_tokenizer, tmp_path
):
    template = (
        "{% if messages[0].content == 'loop' %}"
        + RUNAWAY["nested_loops"]
        + "{% endif %}{{ messages[0].content }}"
    )
    folder = _folder_with_template(tiny_tokenizer, tmp_path, template)
    records = [_chat("hello world", 0), _chat("loop", 1), _chat("hello world this", 2)]
    src = write_jsonl(tmp_path / "in.jsonl", records)
    assert anonymize(folder, [src], tmp_path / "out", "--processes", "1", "--block-size", "2") == 0
    rows = [
        json.loads(line)
        for path in sorted((tmp_path / "out").glob("trace-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    letters = [
        json.loads(line)
        for path in sorted((tmp_path / "out-rejected").glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert len(rows) == 2
    assert [letter["error"] for letter in letters] == ["template_error"]
