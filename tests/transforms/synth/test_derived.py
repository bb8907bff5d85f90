"""A derived trace's folder (synth/derived.py): a manifest kvtrace's readers take the block size
from, in the declared shape, and a digest of the sources anyone can recompute."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms.read.trace_inputs import declared_block_size, trace_files
from kvtrace.transforms.synth.derived import (
    DERIVED_SHARD,
    Derivation,
    bare_file_refusal,
    derived_manifest,
    sources_digest,
    write_derived,
)
from kvtrace.transforms.trace_format import DERIVED_MANIFEST_SCHEMA, canonical_json, schema_problems

ROWS = b'{"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [0, 1]}\n' * 3


def test_the_folder_declares_its_block_size_to_every_reader(tmp_path):
    derivation = Derivation("synthesize", "mooncake-trace", "0" * 64, {"seed": 3, "ratio": 0.5})
    manifest = write_derived(str(tmp_path), lambda out: out.write(ROWS), 16, derivation)
    assert (tmp_path / "manifest.json").read_bytes() == canonical_json(manifest)
    assert manifest["records"] == {"exported": 3}
    assert manifest["sha256"] == {DERIVED_SHARD: hashlib.sha256(ROWS).hexdigest()}
    assert manifest["derived_from"]["settings"] == {"seed": 3, "ratio": "0.5"}
    files = trace_files([str(tmp_path)])  # read as every trace command reads it
    assert declared_block_size(files) == 16


def test_the_sources_digest_is_what_sha256sum_gives(tmp_path):
    for name, data in (("a.jsonl", b"one\n"), ("b.jsonl.gz", b"\x1f\x8b two")):
        (tmp_path / name).write_bytes(data)
    files = [str(tmp_path / "b.jsonl.gz"), str(tmp_path / "a.jsonl")]
    shell = subprocess.run(
        f"sha256sum {' '.join(files)} | cut -c1-64 | sha256sum",
        shell=True,
        capture_output=True,
        text=True,
        check=True,
    )
    assert sources_digest(files) == shell.stdout.split()[0]
    assert sources_digest(files) != sources_digest(files[::-1])  # the order read is part of it


@given(
    st.dictionaries(
        st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True),
        st.none() | st.integers(-(2**40), 2**40) | st.floats(1e-6, 1e6),
        max_size=8,
    )
)
def test_any_numeric_settings_make_a_manifest_of_the_declared_shape(settings):
    derivation = Derivation("synthesize", "mooncake-trace", "a" * 64, settings)
    manifest = derived_manifest(5, "b" * 64, 512, derivation)
    assert schema_problems(json.loads(canonical_json(manifest)), DERIVED_MANIFEST_SCHEMA) == []


def test_a_manifest_readers_would_not_accept_is_never_written():
    with pytest.raises(ValueError, match="does not write"):
        derived_manifest(1, "b" * 64, 16, Derivation("render", "mooncake-trace", "a" * 64))


def test_a_bare_file_is_refused_only_where_its_readers_would_take_another_size():
    assert bare_file_refusal("-o", "out.jsonl", 512) is None
    assert bare_file_refusal("-o", "out", 16) is None
    refusal = bare_file_refusal("-o", "out.jsonl", 16)
    assert refusal is not None and "block size 512" in refusal and "-o DIR" in refusal
