"""OpenAI Batch files as the API leaves them: an input file and an output file given to one run
are joined by custom_id on every engine, to the same bytes, and every line is accounted for."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from helpers import anonymize, assert_same_output, chat, published_letters, read_jsonl, write_jsonl

DAY0_S = 1_763_703_600  # 2025-11-21T05:40:00Z


def request_line(custom_id: str, i: int) -> dict:
    body = {"model": "m", "messages": chat(i, 0)["messages"]}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def answer_line(custom_id: str, i: int) -> dict:
    body = {
        "created": DAY0_S + i,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "the fox"}}],
        "usage": {"completion_tokens": 3 + i},
    }
    response = {"status_code": 200, "request_id": f"r{i}", "body": body}
    return {"id": f"batch_req_{i}", "custom_id": custom_id, "response": response, "error": None}


def batch_night(folder: Path) -> list[Path]:
    """Twelve requests answered (the output file in another order, compressed), a request never
    answered, an answer to no request given, a custom_id on two requests, a request the batch
    never ran (an error line), and two log lines of another shape."""
    requests = [request_line(f"req-{i}", i) for i in range(12)]
    requests += [
        request_line("unanswered", 12),
        request_line("twice", 13),
        request_line("twice", 14),
    ]
    requests.append(request_line("expired", 15))
    answers = [answer_line(f"req-{i}", i) for i in reversed(range(12))]
    answers += [answer_line("stray", 16), answer_line("twice", 13)]
    expired = {"id": "batch_req_x", "custom_id": "expired", "response": None}
    answers.append({**expired, "error": {"code": "batch_expired", "message": "expired"}})
    output = folder / "output.jsonl.gz"
    output.write_bytes(gzip.compress(b"".join(json.dumps(a).encode() + b"\n" for a in answers)))
    logs = [chat(i, (DAY0_S + 100 + i) * 1000) for i in range(2)]
    return [
        write_jsonl(folder / "input.jsonl", requests),
        output,
        write_jsonl(folder / "logs.jsonl", logs),
    ]


def summary_counts(out: str) -> tuple[int, int, int]:
    read, exported, rejected = re.search(
        r"(\d+) read = (\d+) exported \+ (\d+) rejected", out
    ).groups()
    return int(read), int(exported), int(rejected)


@pytest.mark.slow  # four whole runs, one on Beam
@pytest.mark.beam
def test_an_input_file_and_its_output_file_are_joined_alike_on_every_engine(
    tiny_tokenizer, tmp_path, capsys, monkeypatch
):
    from kvtrace.pipelines import local_workers

    inputs = batch_night(tmp_path)
    flags = ("--block-size", "4", "--max-rejected-fraction", "0.5")
    runs = {
        "local": ("--engine", "local"),
        "two-workers": ("--engine", "local", "--processes", "2"),
        "clean-workers": ("--engine", "local", "--processes", "3"),
        "beam": ("--engine", "beam"),
    }
    letters = {}
    for name, engine in runs.items():
        if name == "clean-workers":  # started clean, where a fork is unsafe: the work pickled
            monkeypatch.setattr(local_workers, "can_fork", lambda: False)
        out = tmp_path / name
        assert anonymize(tiny_tokenizer, inputs, out, *flags, *engine) == 0
        # 12 pairs and 2 log lines exported; the 3 lines of `twice`, `unanswered` and `stray`
        # rejected, and the expired pair (one record) a failed_request: 14 + 6 of 20 read.
        assert summary_counts(capsys.readouterr().out) == (20, 14, 6)
        letters[name] = published_letters(Path(f"{out}-rejected")).read_bytes()
    for name in runs:
        assert_same_output(tmp_path / "local", tmp_path / name)
        assert letters[name] == letters["local"]

    rows = [
        row
        for path in sorted((tmp_path / "local").glob("trace-*.jsonl"))
        for row in read_jsonl(path)
    ]
    lengths = Counter(row["output_length"] for row in rows)
    assert len(rows) == 14 and not Counter(3 + i for i in range(12)) - lengths  # usage's counts
    rejected = [json.loads(line) for line in letters["local"].splitlines()]
    reasons = sorted(letter["error"] for letter in rejected)
    assert reasons == ["duplicate_custom_id"] * 3 + ["failed_request"] + ["unjoined_batch"] * 2
    failed = next(letter for letter in rejected if letter["error"] == "failed_request")
    assert json.loads(failed["line"])["body"]["messages"]  # one record of both lines: the request
