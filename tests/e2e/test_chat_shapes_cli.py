"""Each chat shape (OpenAI tool calling, Responses API, Anthropic Messages) parsed and rendered
through real tokenizers and real chat templates from ../shared, as vLLM's server renders them.

The whole CLI runs; the unit tests are in tests/transforms/read/test_chat_shapes.py."""

from __future__ import annotations

import json


def test_a_developer_message_qwen3_leaves_out_is_counted_and_reported(
    qwen3_tokenizer, tmp_path, capsys
):
    from helpers import write_jsonl
    from kvtrace.cli import main

    records = [
        {
            "timestamp": 1_700_000_000_000 + i,
            "messages": [
                {"role": "developer", "content": "Answer in French."},
                {"role": "user", "content": f"question {i}"},
            ],
        }
        for i in range(3)
    ]
    src = write_jsonl(tmp_path / "in.jsonl", records)
    assert (
        main(
            [
                "anonymize",
                "--input",
                str(src),
                "--output",
                str(tmp_path / "out"),
                "--tokenizer",
                qwen3_tokenizer,
                "--block-size",
                "16",
            ]
        )
        == 0
    )
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["records"] == {"exported": 3}  # the count of such requests stays private
    assert (
        "in 3 request(s) the chat template left out a system or developer message"
        in capsys.readouterr().err
    )
