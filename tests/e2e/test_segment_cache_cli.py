"""Segment cache: cut where the tokenizer cuts, only where that is safe, bounded, and the same ids
as tokenizing whole (tested on the tiny tokenizer and on the shipped ones where present).

The whole CLI runs; the unit tests are in tests/transforms/encode/test_segment_cache.py."""

from __future__ import annotations

import json
import logging

from helpers import anonymize, assert_same_output, chat, write_jsonl


def test_the_output_is_the_same_with_the_cache_on_and_off(tiny_tokenizer, tmp_path, caplog):
    records = [chat(i, 1000 * i, session=f"s{i % 3}") for i in range(60)]
    for i, record in enumerate(records):  # each turn re-sends its session's history
        system, user = record["messages"]
        history = [
            m
            for earlier in records[i % 3 : i : 3]
            for m in (earlier["messages"][-1], {"role": "assistant", "content": "Paris ."})
        ]
        record["messages"] = [system, *history, user]
    source = write_jsonl(tmp_path / "chats.jsonl", records)
    with caplog.at_level(logging.INFO, logger="kvtrace"):
        assert anonymize(tiny_tokenizer, [source], tmp_path / "on") == 0
    assert anonymize(tiny_tokenizer, [source], tmp_path / "off", "--segment-cache-mb", "0") == 0
    assert_same_output(tmp_path / "on", tmp_path / "off")
    hits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("segment cache:")]
    assert hits and not hits[0].startswith("segment cache: 0.0%")
    manifest = json.loads((tmp_path / "on" / "manifest.json").read_text())
    assert "segment" not in json.dumps(manifest)  # run figures stay out of the output
