"""Fixtures every test may ask for: a tiny trained tokenizer and the real tokenizers of ../shared.
The helpers the tests import are in helpers.py."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from helpers import shared_path
from tiny_tokenizer import build_tiny_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
# Property tests assert results, not speed (speed lives in benchmarks/): a loaded CI machine
# must not fail an example for taking over hypothesis's default 200 ms.
settings.register_profile("kvtrace", deadline=None)
settings.load_profile("kvtrace")


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory) -> str:
    return str(build_tiny_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer")))


@pytest.fixture(scope="session")
def deepseek_tokenizer() -> str:
    return str(shared_path("tokenizers", "deepseek-r1"))


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> str:
    return str(shared_path("tokenizers", "qwen3"))
