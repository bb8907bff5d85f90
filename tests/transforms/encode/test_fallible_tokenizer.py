"""Every call into the Rust tokenizer is fallible: a text it panics on is that text's failure (a
`tokenizer_error` dead letter), the others keep their ids, whatever texts came first; a
tokenizer failing on kvtrace's own probe text is refused at load in one line; Rust's report of
the panic never reaches the user's stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from helpers import ROOT
from kvtrace.transforms.encode.blocks import chain_seed, token_bytes
from kvtrace.transforms.encode.encode_requests import TOKENIZER_ERROR, EncodeOptions, RequestEncoder
from kvtrace.transforms.encode.fallible_tokenizer import FallibleTokenizer, TokenizerFailure
from kvtrace.transforms.encode.fast_tokenizer import FastTokenizer
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.encode.tokenize import load_tokenizer
from kvtrace.transforms.read.records import parse_record

# Oniguruma gives up backtracking `(a|a)+b` over 40 a's (its retry limit): the Rust side panics.
GIVES_UP = "a" * 40 + "c"


@pytest.fixture
def backtracking(tiny_tokenizer, tmp_path) -> Path:
    """The tiny tokenizer (its added tokens kept: the segment cache cuts at them) with a
    pre-tokenizer regex that backtracks."""
    return _splitting_on(tiny_tokenizer, tmp_path / "tok", "(a|a)+b")


def _splitting_on(tiny_tokenizer: str, folder: Path, regex: str) -> Path:
    folder.mkdir()
    for path in Path(tiny_tokenizer).iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
            {"type": "WhitespaceSplit"},
        ],
    }
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return folder


def _backend(folder: Path) -> Tokenizer:
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def test_a_text_the_tokenizer_panics_on_fails_alone(backtracking):
    backend = _backend(backtracking)
    texts = ["hello world", GIVES_UP, "the quick brown fox"]
    encoded = FallibleTokenizer(backend).encode(texts)
    assert isinstance(encoded[1], TokenizerFailure)
    assert "PanicException" in encoded[1].reason and "retry-limit" in encoded[1].reason
    assert [encoded[0], encoded[2]] == [
        token_bytes(e.ids)
        for e in backend.encode_batch([texts[0], texts[2]], add_special_tokens=False)
    ]


def test_failures_first_say_nothing_of_the_texts_after_them(backtracking):
    """Whether a text fails is its own: however many failures a tokenizer met first, a text it
    encodes is encoded (the judgement that it does not tokenize is load's, on a probe)."""
    tokenizer = FallibleTokenizer(_backend(backtracking))
    failures = tokenizer.encode([GIVES_UP + "c" * i for i in range(3)])  # each panic ~0.3 s
    assert all(isinstance(failure, TokenizerFailure) for failure in failures)
    assert tokenizer.encode(["hello world"]) == tokenizer.encode_or_raise(["hello world"])


def test_a_tokenizer_failing_on_kvtraces_probe_text_is_refused_at_load(tiny_tokenizer, tmp_path):
    """`(.|.)+(?!.)x` backtracks past Oniguruma's limit on any line of 40 characters or more,
    so on the probe text: load says so in one line."""
    folder = _splitting_on(tiny_tokenizer, tmp_path / "tok", "(.|.)+(?!.)x")
    with pytest.raises(ValueError, match="fails on kvtrace's own text.*it does not tokenize"):
        load_tokenizer(str(folder))


def test_kvtraces_own_text_failing_is_one_line(backtracking):
    with pytest.raises(ValueError, match="fails on kvtrace's own text: PanicException"):
        FallibleTokenizer(_backend(backtracking)).encode_or_raise([GIVES_UP])


@pytest.mark.parametrize("segment_cache_bytes", [0, 1 << 20], ids=["whole", "cut"])
def test_a_request_the_tokenizer_fails_on_is_a_dead_letter_and_the_rest_are_hashed(
    backtracking, segment_cache_bytes
):
    """Through the segment cache too: a chat prompt is cut at its added tokens, and the text
    fails where one of its segments does."""
    tokenizer = FastTokenizer.from_directory(backtracking)
    encoder = RequestEncoder(
        tokenizer,
        chain_seed(b"salt"),
        EncodeOptions(
            str(backtracking),
            SaltSource("random"),
            block_size=4,
            segment_cache_bytes=segment_cache_bytes,
        ),
    )
    lines = [
        {"timestamp": 0, "messages": [{"role": "user", "content": GIVES_UP}]},
        {"timestamp": 1, "messages": [{"role": "user", "content": "hello world"}]},
        {"timestamp": 2, "prompt": "hello " + GIVES_UP},
    ]
    requests = [parse_record(json.dumps(line).encode(), "in.jsonl") for line in lines]
    hashed, letters = encoder.encode(requests)
    assert [(letter.reason, json.loads(letter.line)["timestamp"]) for letter in letters] == [
        (TOKENIZER_ERROR, 0),
        (TOKENIZER_ERROR, 2),
    ]
    assert "retry-limit" in letters[0].message
    assert hashed is not None and hashed.requests["timestamp_ms"].tolist() == [1]


ROUTED = """
import logging, os, sys, threading
from kvtrace.pipelines.processes import busy_threads
from kvtrace.transforms.encode.native_stderr import capture_native_stderr
logging.basicConfig(format="%(name)s: %(message)s")
logging.getLogger().setLevel(sys.argv[1])
capture_native_stderr()
print(busy_threads(), sum(t.name == "native-stderr" for t in threading.enumerate()), flush=True)
os.write(2, b"thread '<unnamed>' panicked at src/lib.rs:1:1:\\nRust's own words\\n")
os.close(2)  # the relay's last writer: it logs what it read and ends
[thread.join(10) for thread in threading.enumerate() if thread.name == "native-stderr"]
logging.getLogger("kvtrace").critical("logged")
print("printed", file=sys.stderr, flush=True)
os._exit(0)
"""


@pytest.mark.parametrize("level", ["CRITICAL", "INFO"])
def test_native_stderr_is_logged_and_python_stderr_is_never_held_back(level):
    """What native code writes to descriptor 2 is a log line (seen with --verbose, at INFO);
    what Python writes reaches stderr at once, even when the process ends with os._exit; and
    the relay thread leaves forking safe."""
    done = subprocess.run(
        [sys.executable, "-c", ROUTED, level], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    said = done.stderr.splitlines()
    assert said[-2:] == ["kvtrace: logged", "printed"] and done.stdout.split() == ["0", "1"]
    native = [line for line in said if "panicked" in line or "Rust's own words" in line]
    assert native == (
        []
        if level == "CRITICAL"
        else ["native: thread '<unnamed>' panicked at src/lib.rs:1:1:", "native: Rust's own words"]
    )


def test_a_request_encoders_first_requests_failing_are_dead_letters(backtracking):
    """The segment cache's probes and the run's first texts decide nothing: every request the
    tokenizer fails on is its own letter, the rest are hashed."""
    encoder = RequestEncoder(
        FastTokenizer.from_directory(backtracking),
        chain_seed(b"salt"),
        EncodeOptions(str(backtracking), SaltSource("random"), block_size=4),
    )
    prompts = [GIVES_UP + "c" * i for i in range(3)] + ["hello world"]
    requests = [
        parse_record(json.dumps({"timestamp": i, "prompt": p}).encode(), "in.jsonl")
        for i, p in enumerate(prompts)
    ]
    hashed, letters = encoder.encode(requests)
    assert [letter.reason for letter in letters] == [TOKENIZER_ERROR] * 3
    assert hashed is not None and hashed.requests["timestamp_ms"].tolist() == [3]
