"""Segment cache: cut where the tokenizer cuts, only where that is safe, bounded, and the same ids
as tokenizing whole (tested on the tiny tokenizer and on the shipped ones where present).

The whole CLI runs; the unit tests are in tests/transforms/encode/test_segment_cache.py."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

from helpers import ROOT, SALT, anonymize, assert_same_output, chat, write_jsonl
from kvtrace.transforms.encode.fast_backend import is_sampled
from kvtrace.transforms.encode.segment_cache import CHECK_KEY, CHECK_ONE_IN


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


# Run in a process of its own, where the unsafe cut reaches the workers it forks.
_UNSAFE_CUT_RUN = """
import re
import sys
from kvtrace.cli import main
from kvtrace.transforms.encode import segment_cache
from kvtrace.transforms.encode.blocks import token_bytes

safe = segment_cache.splitter_for

def unsafe(config):
    # also cuts at a word before a comma, as if it were an added token: a text holding it
    # differs when cut, and the probes at load never put a comma after it
    splitter = safe(config)
    return segment_cache.Splitter(
        re.compile("(Helsinki(?=,)|" + splitter.pattern.pattern[1:]),
        {**splitter.ids, "Helsinki": token_bytes([0])},
    )

segment_cache.splitter_for = unsafe
sys.exit(main(sys.argv[1:]))
"""


def test_a_cut_found_unsafe_mid_run_gives_a_cacheless_run_byte_for_byte(tiny_tokenizer, tmp_path):
    """Texts cut before a sampled one showed the cut unsafe hold the cut ids: the local engine
    encodes the input again without the cache, so the output is the cacheless run's, however
    the records were spread over the 2 workers and ordered."""
    prompts = [f"Tell me about Helsinki, fact {i}." for i in range(400)]
    sampled = [is_sampled(p, CHECK_ONE_IN, CHECK_KEY) for p in prompts]
    assert 0 < sum(sampled) < len(prompts)  # some checked, most not
    records = [{"timestamp": i, "prompt": p, "output_length": 3} for i, p in enumerate(prompts)]
    log = write_jsonl(tmp_path / "log.jsonl", records)
    environment = {**os.environ, "KVTRACE_SALT": SALT, "PYTHONPATH": str(ROOT)}
    for name, cache in (("off", "0"), ("on", "64")):
        args = ["anonymize", "--output", str(tmp_path / name), "--input", str(log)]
        args += ["--tokenizer", tiny_tokenizer, "--block-size", "4", "--processes", "2"]
        run = subprocess.run(
            [sys.executable, "-c", _UNSAFE_CUT_RUN, *args, "--segment-cache-mb", cache],
            capture_output=True,
            text=True,
            env=environment,
            cwd=ROOT,
        )
        assert run.returncode == 0, run.stderr[-2000:]
    assert "encoding the input again without the segment cache" in run.stderr
    assert "tokenized differently when cut" in run.stderr
    assert_same_output(tmp_path / "off", tmp_path / "on")
