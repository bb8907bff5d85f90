"""kvtrace render: requests whose tokenization reproduces the trace; the round trip
anonymize(render(trace)) == trace up to renumbering."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import anonymize, read_jsonl, shared_path, write_jsonl
from helpers import trace as published
from kvtrace.cli import main
from kvtrace.transforms.encode.tokenize import encode_texts, load_tokenizer
from kvtrace.transforms.read.trace_io import read_trace
from kvtrace.transforms.replay.render import block_keys, reproduces_blocks
from kvtrace.transforms.stats.trace_blocks import prefix_ids

pytestmark = pytest.mark.smoke  # in the fast set: one whole run per command (conftest)

BLOCK = 4
# Shared prefixes, a partial last block shared by two rows (FAST'25), sessions, a one-block row.
ROWS = [
    {
        "timestamp": 0,
        "input_length": 10,
        "output_length": 2,
        "hash_ids": [0, 1, 2],
        "session_id": "a",
    },
    {
        "timestamp": 10,
        "input_length": 14,
        "output_length": 3,
        "hash_ids": [0, 1, 3, 4],
        "session_id": "a",
    },
    {"timestamp": 20, "input_length": 10, "output_length": 4, "hash_ids": [0, 1, 2]},
    {"timestamp": 30, "input_length": 7, "output_length": 5, "hash_ids": [5, 9]},
    {"timestamp": 40, "input_length": 16, "output_length": 6, "hash_ids": [0, 6, 7, 8]},
]
# For the chat shape every last block holds the tiny template's 3 closing tokens: a shorter one
# would push them into a block that other rows have as words (then no text reproduces both).
CHAT_ROWS = [
    dict(row, input_length=row["input_length"] + (1 if row["input_length"] % 4 == 2 else 0))
    for row in ROWS
]


def same_structure(a, b) -> bool:
    """Equal rows up to renumbering: lengths equal, and equal exact prefixes in the same places
    (the partitions of blocks by prefix agree both ways)."""
    if (
        a.input_length.tolist() != b.input_length.tolist()
        or a.output_length.tolist() != b.output_length.tolist()
    ):
        return False
    pairs = set(zip(prefix_ids(a).tolist(), prefix_ids(b).tolist()))
    return len(pairs) == len({p for p, _ in pairs}) == len({q for _, q in pairs})


def render_and_anonymize(tokenizer, trace_file: Path, tmp_path, shape: str, block: int):
    requests = tmp_path / f"{shape}.jsonl"
    assert (
        main(
            [
                "render",
                str(trace_file),
                "--tokenizer",
                tokenizer,
                "-o",
                str(requests),
                "--block-size",
                str(block),
                "--shape",
                shape,
            ]
        )
        == 0
    )
    out = tmp_path / f"out-{shape}"
    assert anonymize(tokenizer, [requests], out, "--block-size", str(block)) == 0
    return read_trace(sorted(str(p) for p in out.glob("trace-*.jsonl")))


def reproduces(trace, token_ids):
    return reproduces_blocks(trace, *block_keys(token_ids, BLOCK), BLOCK)


@pytest.mark.parametrize("shape", ["prompt", "chat"])
def test_round_trip_on_the_tiny_tokenizer(tiny_tokenizer, tmp_path, shape, capsys):
    source = write_jsonl(tmp_path / "trace.jsonl", ROWS if shape == "prompt" else CHAT_ROWS)
    back = render_and_anonymize(tiny_tokenizer, source, tmp_path, shape, BLOCK)
    assert same_structure(read_trace([str(source)]), back)
    sessions = [r.get("session") for r in published(tmp_path / f"out-{shape}")]
    assert sessions[0] == sessions[1] is not None and sessions[2] is None
    capsys.readouterr()


def test_requests_carry_no_ids_and_the_verification_catches_a_wrong_rendering(
    tiny_tokenizer, tmp_path, capsys
):
    source = write_jsonl(tmp_path / "trace.jsonl", ROWS)
    assert (
        main(
            [
                "render",
                str(source),
                "--tokenizer",
                tiny_tokenizer,
                "-o",
                str(tmp_path / "r.jsonl"),
                "--block-size",
                str(BLOCK),
            ]
        )
        == 0
    )
    requests = read_jsonl(tmp_path / "r.jsonl")
    assert set(requests[0]) == {"timestamp", "prompt", "max_tokens", "output_length", "session_id"}
    assert not {"hash_ids", "input_length"} & set(requests[3])
    trace = read_trace([str(source)])
    tokenizer = load_tokenizer(tiny_tokenizer)
    tokens = encode_texts(tokenizer, [r["prompt"] for r in requests])
    assert reproduces(trace, tokens).all()
    short = [t[:-1] if i == 3 else t for i, t in enumerate(tokens)]  # one token short
    assert reproduces(trace, short).tolist() == [True, True, True, False, True]
    merged = [tokens[0][:4] + t[4:] if i == 3 else t for i, t in enumerate(tokens)]
    assert not reproduces(trace, merged).any()  # block 5 reads as block 0: both wrong
    capsys.readouterr()


def shipped_rows(tmp_path) -> Path:
    rows = read_jsonl(shared_path("traces", "synthetic_trace.jsonl"))[:150]
    # The two traces number ids alike: keep their blocks apart.
    rows += [
        dict(row, hash_ids=[10**7 + i for i in row["hash_ids"]])
        for row in read_jsonl(shared_path("traces", "mooncake_trace_first20.jsonl"))
    ]
    for i, row in enumerate(rows):
        row["timestamp"] = i  # distinct: rows come back in the same order
    return write_jsonl(tmp_path / "shipped.jsonl", rows)


@pytest.mark.parametrize("tokenizer", ["deepseek-r1", "qwen3"])
@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_round_trip_on_the_shipped_traces(tokenizer, tmp_path, capsys):
    folder = str(shared_path("tokenizers", tokenizer))
    source = shipped_rows(tmp_path)
    back = render_and_anonymize(folder, source, tmp_path, "prompt", 512)
    assert same_structure(read_trace([str(source)]), back)
    capsys.readouterr()


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_chat_shape_reproduces_the_shipped_traces(tmp_path, capsys):
    source = shipped_rows(tmp_path)
    assert (
        main(
            [
                "render",
                str(source),
                "--tokenizer",
                str(shared_path("tokenizers", "qwen3")),
                "-o",
                str(tmp_path / "chat.jsonl"),
                "--shape",
                "chat",
                "--json",
                str(tmp_path / "r.json"),
            ]
        )
        == 0
    )
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["template_tokens"] == {"before": 3, "after": 5}
    assert report["verified"]["rows_reproduced"] == report["rows"] == 170
    capsys.readouterr()


def test_a_row_over_the_token_bound_is_left_out_before_its_text_is_built(
    tiny_tokenizer, tmp_path, caplog
):
    """A row may cost MAX_ROW_TOKENS tokens at most (a 73 KB trace line asked for 6 M): one past
    it is skipped, counted and placed; the other rows render, and still reproduce their blocks
    (the skipped row's blocks shared with them are no longer theirs to spell)."""
    from kvtrace.pipelines.render import MAX_ROW_TOKENS

    block, over = 512, MAX_ROW_TOKENS + 1
    rows = [
        {"timestamp": t, "input_length": 1000, "output_length": 1, "hash_ids": [0, t]}
        for t in (0, 10, 20, 30, 40)
    ]
    rows.insert(
        1,
        {
            "timestamp": 5,
            "input_length": over,
            "output_length": 1,
            "hash_ids": [0] + list(range(100, 100 + -(-over // block) - 1)),
        },
    )
    source = write_jsonl(tmp_path / "trace.jsonl", rows)
    report = tmp_path / "report.json"
    assert (
        main(
            [
                "render",
                str(source),
                "--tokenizer",
                tiny_tokenizer,
                "-o",
                str(tmp_path / "r.jsonl"),
                "--block-size",
                str(block),
                "--json",
                str(report),
            ]
        )
        == 0
    )
    said = json.loads(report.read_text())
    assert said["too_long"] == {
        "count": 1,
        "max_tokens": MAX_ROW_TOKENS,
        "examples": [{"file": str(source), "line": 2}],
    }
    assert said["rows"] == 6 and said["written"] == 5
    assert said["verified"]["rows_reproduced"] == 5
    assert [r["timestamp"] for r in read_jsonl(tmp_path / "r.jsonl")] == [0, 10, 20, 30, 40]
    assert "1 row(s) left out: over 1048576 tokens" in caplog.text
