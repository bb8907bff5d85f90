"""The publication gate accepts exactly what kvtrace writes: real outputs of several kinds pass,
and any mutation that adds something kvtrace does not write is refused, also when the attacker
recomputes the manifest's digests to match."""

from __future__ import annotations

import io
import json
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_gate_redteam import NUMBERING, audit, the_tokenizer  # noqa: F401 (autouse fixture)

from helpers import anonymize, chat, write_jsonl
from kvtrace.transforms.stats.audit import map_numbering
from kvtrace.transforms.trace_format import (
    MANIFEST,
    canonical_json,
    columns_of_jsonl,
    jsonl_bytes,
    parquet_bytes,
)
from kvtrace.transforms.write.manifest import set_content_times
from kvtrace.transforms.write.publish import sha256_of


def _records(count: int) -> list[dict]:
    rows = [
        chat(i, 1_700_000_000_000 + 997 * i, session=f"user-{i % 3}", rotate=i % 2)
        for i in range(count)
    ]
    for i, row in enumerate(rows[::2]):
        row["latency_ms"] = 100 + 7 * i  # a response time for some rows: the optional column
    return rows


@pytest.fixture(scope="module")
def outputs(tiny_tokenizer, tmp_path_factory) -> dict[str, Path]:
    """Real outputs of each kind the gate must accept."""
    tmp = tmp_path_factory.mktemp("gate")
    first = write_jsonl(tmp / "night1.jsonl", _records(12))
    second = write_jsonl(
        tmp / "night2.jsonl",
        [
            chat(i, 1_700_100_000_000 + 13 * i, session=f"user-{i % 5}", rotate=(i + 1) % 3)
            for i in range(9)
        ],
    )
    runs = {
        "plain": ([first], ()),
        "outputs": ([first], ("--emit-output-hashes",)),
        "coarse": ([first], ("--timestamp-granularity-ms", "1000", "--length-granularity", "4")),
        "night2": ([second], ("--id-map", str(tmp / "map"), "--salt-file", str(tmp / "salt"))),
    }
    (tmp / "salt").write_bytes(b"s" * 32)
    assert (
        anonymize(
            str(tiny_tokenizer),
            [first],
            tmp / "night1",
            "--block-size",
            "4",
            "--id-map",
            str(tmp / "map"),
            "--salt-file",
            str(tmp / "salt"),
        )
        == 0
    )
    made = {}
    for name, (inputs, extra) in runs.items():
        assert anonymize(str(tiny_tokenizer), inputs, tmp / name, "--block-size", "4", *extra) == 0
        made[name] = tmp / name
    NUMBERING[:] = [map_numbering(str(tmp / "map"), b"s" * 32)]
    return made


@pytest.mark.parametrize("kind", ["plain", "outputs", "coarse", "night2"])
def test_every_kind_of_real_output_is_publishable(outputs, kind):
    report = audit(str(outputs[kind]))
    assert report["publishable"], report["flags"]
    assert report["rows"] > 0


def test_the_manifest_says_whether_ids_continue_a_map(outputs):
    assert json.loads((outputs["plain"] / MANIFEST).read_text())["id_map"] is None
    start = json.loads((outputs["night2"] / MANIFEST).read_text())["id_map"]
    assert start["block_ids_from"] > 0 and start["sessions_from"] == 3  # night 1's user-0..2


TEXT = st.text(min_size=1, max_size=12)
# Text no field of kvtrace's vocabulary holds (nothing kvtrace writes has a space but the replay
# commands, which the gate writes again itself): what an operator or attacker would add.
FREE_TEXT = TEXT.map(lambda text: f"note {text}")
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)


def _objects(value, path=()):
    """Every JSON object inside value, with its path."""
    if isinstance(value, dict):
        yield path, value
        for key, item in value.items():
            yield from _objects(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _objects(item, path + (index,))


def _leaves(value, path=()):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, path + (key,))
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from _leaves(item, path + (index,))
    else:
        yield path


def _at(value, path):
    for step in path:
        value = value[step]
    return value


def _mutate_json(text: str, data: st.DataObject) -> str:
    """One JSON document with something added: a key, text in place of a value, or a key
    repeated (as bytes: a parser keeps one of the two)."""
    document = json.loads(text)
    how = data.draw(st.sampled_from(["key", "text", "repeat"]))
    objects = list(_objects(document))
    if how == "key" or how == "repeat":
        path, obj = data.draw(st.sampled_from(objects))
        if how == "key":
            key = data.draw(TEXT.filter(lambda k: k not in obj))
            obj[key] = data.draw(JSON_VALUE)
            return json.dumps(document)
        assume(obj)
        key = data.draw(st.sampled_from(sorted(obj)))
        secret = json.dumps(data.draw(FREE_TEXT))
        encoded = json.dumps(document, indent=2 if "\n" in text.strip() else None)
        needle = json.dumps(key) + ":"
        assume(needle in encoded)
        return encoded.replace(needle, f"{needle} {secret}, {needle}", 1)
    leaves = list(_leaves(document))
    path = data.draw(st.sampled_from(leaves))
    assume(path)
    replacement = data.draw(FREE_TEXT)
    parent = _at(document, path[:-1])
    assume(parent[path[-1]] != replacement)
    parent[path[-1]] = replacement
    return json.dumps(document)


def _mutate_parquet(data_bytes: bytes, data: st.DataObject) -> bytes:
    table = pq.read_table(io.BytesIO(data_bytes))
    how = data.draw(st.sampled_from(["file-metadata", "column-metadata", "column", "rewrite"]))
    if how == "file-metadata":
        table = table.replace_schema_metadata(
            {**(table.schema.metadata or {}), data.draw(TEXT).encode(): data.draw(TEXT).encode()}
        )
    elif how == "column-metadata":
        index = data.draw(st.integers(0, table.num_columns - 1))
        field = table.schema.field(index).with_metadata({b"note": data.draw(TEXT).encode()})
        table = table.cast(table.schema.set(index, field))
    elif how == "column":
        table = table.append_column(
            data.draw(TEXT.filter(lambda n: n not in table.schema.names)),
            pa.array([data.draw(TEXT)] * table.num_rows),
        )
    sink = io.BytesIO()
    # "rewrite": the same rows by another writer's settings (its own created_by, no zstd)
    pq.write_table(table, sink, compression="snappy" if how == "rewrite" else "zstd")
    return sink.getvalue()


def _copy(folder: Path, into: Path) -> Path:
    target = into / "out"
    shutil.copytree(folder, target)
    return target


def _recompute_digests(folder: Path) -> None:
    """What an attacker would do next: make the manifest list the mutated files' sha256."""
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["sha256"] = {
        name: sha256_of((folder / name).read_bytes())
        for name in manifest["sha256"]
        if (folder / name).exists()
    }
    (folder / MANIFEST).write_bytes(canonical_json(manifest))
    set_content_times(str(folder))  # and stamp the times kvtrace derives from content


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_added_content_is_refused_even_with_digests_recomputed(outputs, data):
    _mutated_output_is_refused(outputs, data)


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_added_content_is_refused_many_mutations(outputs, data):
    _mutated_output_is_refused(outputs, data)


def _mutated_output_is_refused(outputs: dict[str, Path], data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(sorted(outputs)))
    with tempfile.TemporaryDirectory() as tmp:
        folder = _copy(outputs[kind], Path(tmp))
        names = sorted(p.name for p in folder.iterdir())
        target = data.draw(st.sampled_from(names + ["<new file>", "<bytes>"]))
        mutated = target
        if target == "<new file>":
            name = data.draw(st.from_regex(r"[.A-Za-z0-9_-]{1,20}", fullmatch=True))
            assume(name not in names and name not in (".", ".."))
            (folder / name).write_text(data.draw(TEXT))
        elif target == "<bytes>":
            name = mutated = data.draw(st.sampled_from(names))
            original = (folder / name).read_bytes()
            at = data.draw(st.integers(0, len(original)))
            (folder / name).write_bytes(
                original[:at] + data.draw(st.binary(min_size=1, max_size=8)) + original[at:]
            )
        elif target.endswith(".parquet"):
            before = (folder / target).read_bytes()
            after = _mutate_parquet(before, data)
            assume(after != before)
            (folder / target).write_bytes(after)
        elif target.endswith(".jsonl"):
            lines = (folder / target).read_text().splitlines()
            index = data.draw(st.integers(0, len(lines) - 1))
            lines[index] = _mutate_json(lines[index], data)
            (folder / target).write_text("\n".join(lines) + "\n")
        else:
            (folder / target).write_text(_mutate_json((folder / target).read_text(), data))
        if mutated != MANIFEST and data.draw(st.booleans()):
            _recompute_digests(folder)
        report = audit(str(folder))
    assert not report["publishable"]


def test_a_self_consistent_rewrite_with_ids_out_of_place_is_refused(outputs, tmp_path):
    """An attacker who rewrites both twins with kvtrace's own writer and fixes every digest
    still cannot publish ids outside the night's id space."""
    folder = _copy(outputs["plain"], tmp_path)
    (parquet,) = folder.glob("trace-*.parquet")
    columns = columns_of_jsonl(parquet.with_suffix(".jsonl").read_bytes())
    shifted = columns.__class__(**{**columns.__dict__, "ids": columns.ids + 1000})
    parquet.write_bytes(parquet_bytes(shifted))
    parquet.with_suffix(".jsonl").write_bytes(jsonl_bytes(shifted))
    _recompute_digests(folder)
    flags = audit(str(folder))["flags"]
    assert any("not dense from 0" in f for f in flags), flags
