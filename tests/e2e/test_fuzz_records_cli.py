"""Fuzz harness for the record parser and the render step: every node of every supported request
shape replaced by hostile values (wrong types, unhashable `type`s, huge and deep values), as a
JSONL line and as a Parquet row. Invariant: each record is a Request that renders (or a dead
letter), never an exception; and good records are untouched by the bad ones beside them.

The whole CLI runs; the unit tests are in tests/transforms/read/test_fuzz_records.py."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import chat
from kvtrace.cli import main

MUTATION = st.tuples(
    st.sampled_from(["flip", "insert", "delete"]),
    st.integers(0, 10**6),
    st.binary(min_size=1, max_size=4),
)


def _mutated(data: bytes, mutations) -> bytes:
    for kind, where, payload in mutations:
        at = where % max(len(data), 1)
        if kind == "flip":
            data = data[:at] + bytes([data[at] ^ payload[0] or 1]) + data[at + 1 :]
        elif kind == "insert":
            data = data[:at] + payload + data[at:]
        else:
            data = data[:at] + data[at + len(payload) :]
    return data


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(MUTATION, min_size=1, max_size=3))
def test_byte_mutations_of_a_valid_log_are_counted_and_good_records_kept(
    tiny_tokenizer, tmp_path_factory, mutations
):
    folder = tmp_path_factory.mktemp("mutated")
    lines = [
        json.dumps(chat(i, 1_700_000_000_000 + 1000 * i, session=f"s{i % 3}")).encode()
        for i in range(12)
    ]
    data = _mutated(b"\n".join(lines) + b"\n", mutations)
    (folder / "in.jsonl").write_bytes(data)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(
            [
                "anonymize",
                "--input",
                str(folder / "in.jsonl"),
                "--output",
                str(folder / "out"),
                "--tokenizer",
                tiny_tokenizer,
                "--block-size",
                "4",
            ]
        )
    assert code == 0 and "Traceback" not in err.getvalue()
    records = json.loads((folder / "out" / "manifest.json").read_text())["records"]
    present = [line for line in data.replace(b"\r", b"").split(b"\n") if line.strip()]
    letters = [
        line
        for p in (folder / "out-rejected").glob("*.jsonl")
        for line in p.read_bytes().splitlines()
    ]
    assert records["exported"] + len(letters) == len(present)  # each exported or a letter
    assert records["exported"] >= sum(line in present for line in lines)
