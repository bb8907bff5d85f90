"""kvtrace audit, round 4's mechanisms from the operator's side: run settings no row shows are
published only when a consumer needs them and confirmed as the run was given them (hash scheme,
template kwargs), and the tokenizer's name comes from kvtrace's own vocabulary.

The unit tests; the whole CLI runs are in tests/e2e/test_audit_round4_cli.py."""

from __future__ import annotations

import pytest

from kvtrace.transforms.trace_format import PUBLISHED_TOKENIZER_NAMES
from kvtrace.transforms.write.manifest import public_tokenizer_name


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
    assert public_tokenizer_name(name) is None


def test_a_declared_name_is_published_unless_it_is_a_local_folder(tmp_path, monkeypatch):
    for name in PUBLISHED_TOKENIZER_NAMES:
        assert public_tokenizer_name(name) == name
    monkeypatch.chdir(tmp_path)  # a folder of that name holds the operator's own files
    (tmp_path / "Qwen" / "Qwen3-8B").mkdir(parents=True)
    assert public_tokenizer_name("Qwen/Qwen3-8B") is None
