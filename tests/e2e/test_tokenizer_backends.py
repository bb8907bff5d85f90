"""Whole runs with each tokenizer backend (transforms/encode/fast_backend.py): the same bytes
with tokenizers and with fastokens, and a difference found mid-run still giving a tokenizers
run's bytes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import ROOT, SALT, assert_same_output, read_jsonl, write_jsonl
from kvtrace.cli import main
from kvtrace.transforms.encode.fast_backend import AUTO, FASTOKENS, TOKENIZERS, is_sampled

pytest.importorskip("fastokens")
EXAMPLES = sorted((ROOT / "examples").glob("*/*.jsonl"))


def test_a_run_is_the_same_bytes_with_either_backend(tmp_path, qwen3_tokenizer, monkeypatch):
    """The examples anonymized with tokenizers and with fastokens: the same trace, stats,
    manifest and dead letters, byte for byte."""
    monkeypatch.setenv("KVTRACE_SALT", SALT)
    inputs = [str(p) for p in EXAMPLES]
    for backend in (TOKENIZERS, FASTOKENS):
        args = ["anonymize", "--output", str(tmp_path / backend), "--tokenizer", qwen3_tokenizer]
        args += ["--block-size", "8", "--tokenizer-backend", backend, "--processes", "1"]
        args += ["--max-rejected-fraction", "1"]
        for path in inputs:
            args += ["--input", path]
        assert main(args) == 0
    assert read_jsonl(next((tmp_path / FASTOKENS).glob("trace-*.jsonl")))
    assert_same_output(tmp_path / TOKENIZERS, tmp_path / FASTOKENS)


# Run in a process of its own, where the wrong backend reaches the workers it forks (a test
# process running other threads starts them clean, from the real modules).
_WRONG_RUN = '''
import sys
import numpy as np
from kvtrace.cli import main
from kvtrace.transforms.encode import fast_backend

class WrongOnMarker:
    """A real fastokens tokenizer giving other ids for texts holding the marker: it passes
    every probe at load and differs only on the run's own texts."""

    def __init__(self, fast):
        self._fast = fast

    def encode_batch_flat(self, texts, add_special_tokens=False):
        data, offsets = self._fast.encode_batch_flat(texts, add_special_tokens=add_special_tokens)
        ids = np.frombuffer(data, dtype="<u4").copy()
        for text, start in zip(texts, np.frombuffer(offsets, dtype="<u8")):
            if "Helsinki" in text:
                ids[int(start)] += 1
        return ids.tobytes(), offsets

loaded = fast_backend._loaded
fast_backend._loaded = lambda data, reference: (
    fast_backend.VerifiedBackend(WrongOnMarker(loaded(data, reference)[0]._fast), reference),
    None,
)
sys.exit(main(sys.argv[1:]))
'''


@pytest.mark.slow  # two whole runs, each loading both backends (~20 s of a loaded machine)
def test_a_difference_mid_run_gives_a_tokenizers_run_byte_for_byte(tmp_path, qwen3_tokenizer):
    """Texts encoded before the difference was seen held the fast ids: the local engine encodes
    the input again with tokenizers, so the output is the tokenizers run's, with 2 workers."""
    prompts = [f"Tell me about Helsinki, fact {i}." for i in range(400)]
    assert 0 < sum(map(is_sampled, prompts)) < len(prompts)  # some checked, most not
    records = [{"timestamp": i, "prompt": p, "output_length": 3} for i, p in enumerate(prompts)]
    log = write_jsonl(tmp_path / "log.jsonl", records)
    environment = {**os.environ, "KVTRACE_SALT": SALT, "PYTHONPATH": str(ROOT)}
    for backend in (TOKENIZERS, AUTO):
        args = ["anonymize", "--output", str(tmp_path / backend), "--input", str(log)]
        args += ["--tokenizer", qwen3_tokenizer, "--block-size", "4", "--processes", "2"]
        run = subprocess.run(
            [sys.executable, "-c", _WRONG_RUN, *args, "--tokenizer-backend", backend],
            capture_output=True,
            text=True,
            env=environment,
            cwd=ROOT,
        )
        assert run.returncode == 0, run.stderr[-2000:]
    assert "tokenized differently from tokenizers" in run.stderr
    assert "encoding the input again with tokenizers alone" in run.stderr
    assert_same_output(tmp_path / TOKENIZERS, tmp_path / AUTO)
