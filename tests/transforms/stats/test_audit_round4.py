"""kvtrace audit, round 4's mechanisms from the operator's side: run settings no row shows are
published only when a consumer needs them and confirmed as the run was given them (hash scheme,
template kwargs), and the tokenizer's name comes from kvtrace's own vocabulary.

The unit tests; the whole CLI runs are in tests/e2e/test_audit_round4_cli.py."""

from __future__ import annotations

import pytest

from kvtrace.transforms.trace_format import PUBLISHED_TOKENIZERS
from kvtrace.transforms.write.manifest import public_tokenizer


@pytest.mark.parametrize(
    "name",
    [
        "acme-internal/patient-jane-doe-triage",
        "Qwen/Qwen3-8B-private",
        "pkg:acme_tokenizer",
        "deepseek-ai/deepseek-r1",
        "",
    ],
)
def test_a_name_kvtrace_does_not_declare_is_published_as_null(name):
    (pinned, *_) = PUBLISHED_TOKENIZERS["Qwen/Qwen3-8B"]
    assert public_tokenizer(name, pinned) == {"name": None, "sha256": {}}


def test_a_declared_name_is_published_with_its_pinned_files_only():
    for name, (pinned, *_) in PUBLISHED_TOKENIZERS.items():
        assert public_tokenizer(name, pinned)["name"] == name
        assert public_tokenizer(name, {**pinned, "chat_template.jinja": "0" * 64})["name"] is None
