"""Red-team reproducers for the publication gate (`kvtrace audit`): each builds a folder that
carries something kvtrace itself would not write (or hostile input), with every digest, stat
and serializer the attacker can recompute, and asserts the gate refuses it (or survives it)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT, WORDS, anonymize, chat, write_jsonl
from kvtrace.transforms.stats import audit as gate
from kvtrace.transforms.stats.audit import REMOTE_FOLDER, _Rows
from kvtrace.transforms.trace_format import (
    MANIFEST,
    STATS,
    TraceColumns,
    canonical_json,
    columns_of_jsonl,
    jsonl_bytes,
    parquet_bytes,
)
from kvtrace.transforms.write.manifest import set_content_times
from kvtrace.transforms.write.publish import sha256_of

TOKENIZER: list[str] = []  # the tokenizer of every output here: the gate checks its digests


@pytest.fixture(scope="session", autouse=True)  # before the module's outputs
def the_tokenizer(tiny_tokenizer):
    TOKENIZER[:] = [tiny_tokenizer]


# The id map the module's outputs extend, as audit --id-map reads it (set by its fixture).
NUMBERING: list = []


def audit(target: str) -> dict:
    """The gate's report, with the tokenizer the outputs were made with (and their id map)."""
    return gate.audit(target, TOKENIZER[0], numbering=NUMBERING[0] if NUMBERING else None)


SHARD = "trace-00000-of-00001"
# Private text as the attacker packs it into an integer field: 5 bytes stay under 2^40.
SECRET = b"alice"


def _night(count: int, with_output_text: bool = False) -> list[dict]:
    rows = []
    for i in range(count):
        row = chat(i, 1_700_000_000_000 + 997 * i, session=f"user-{i % 3}", rotate=i % 2)
        if with_output_text:  # a response text: --emit-output-hashes then has output blocks
            row.pop("output_length")
            row["output"] = " ".join(WORDS[: 1 + (3 * i) % len(WORDS)])
        rows.append(row)
    for i, row in enumerate(rows[::2]):
        row["latency_ms"] = 100 + 7 * i
    return rows


@pytest.fixture(scope="module")
def outputs(tiny_tokenizer, tmp_path_factory) -> dict[str, Path]:
    """Real, publishable outputs: plain, with output ids, coarse, and a night extending a map."""
    tmp = tmp_path_factory.mktemp("redgate")
    night = write_jsonl(tmp / "night.jsonl", _night(12))
    texts = write_jsonl(tmp / "texts.jsonl", _night(12, with_output_text=True))
    (tmp / "salt").write_bytes(b"s" * 32)
    mapped = ("--id-map", str(tmp / "map"), "--salt-file", str(tmp / "salt"))
    assert anonymize(tiny_tokenizer, [night], tmp / "night1", "--block-size", "4", *mapped) == 0
    runs = {
        "plain": (night, ()),
        "outputs": (texts, ("--emit-output-hashes",)),
        "coarse": (night, ("--timestamp-granularity-ms", "1000", "--length-granularity", "4")),
        "night2": (night, mapped),
    }
    made = {}
    for name, (source, extra) in runs.items():
        assert anonymize(tiny_tokenizer, [source], tmp / name, "--block-size", "4", *extra) == 0
        NUMBERING[:] = [gate.map_numbering(str(tmp / "map"), b"s" * 32)]
        assert audit(str(tmp / name))["publishable"]
        made[name] = tmp / name
    return made


def _copy(folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / "out"
    shutil.copytree(folder, target)
    return target


def _columns(folder: Path) -> TraceColumns:
    return columns_of_jsonl((folder / f"{SHARD}.jsonl").read_bytes())


def _manifest(folder: Path) -> dict:
    return json.loads((folder / MANIFEST).read_text())


def _republish(folder: Path, columns: TraceColumns | None = None, **manifest_changes) -> None:
    """What the attacker does after any change: both twins rewritten by kvtrace's own
    serializers, stats.json recomputed from the rows, the manifest's digests and counts made to
    agree, all in kvtrace's canonical bytes."""
    if columns is not None:
        (folder / f"{SHARD}.parquet").write_bytes(parquet_bytes(columns))
        (folder / f"{SHARD}.jsonl").write_bytes(jsonl_bytes(columns))
        rows = _Rows()
        rows.block_size = _manifest(folder)["block_size"]
        rows.add(columns, None)
        (folder / STATS).write_bytes(canonical_json(rows.stats()))
    manifest = _manifest(folder)
    for key, value in manifest_changes.items():
        manifest[key] = value
    manifest["sha256"] = {
        name: sha256_of((folder / name).read_bytes()) for name in manifest["files"]
    }
    (folder / MANIFEST).write_bytes(canonical_json(manifest))
    set_content_times(str(folder))  # the times kvtrace derives from content: anyone can


def _with(columns: TraceColumns, **changes) -> TraceColumns:
    return dataclasses.replace(columns, **changes)


def _refused(folder: Path) -> list[str]:
    report = audit(str(folder))
    assert not report["publishable"], "the gate accepted it: " + json.dumps(report["flags"])
    return report["flags"]


def test_the_fixture_outputs_pass_untouched(outputs, tmp_path):
    for kind in outputs:
        folder = _copy(outputs[kind], tmp_path / kind)
        _republish(folder, _columns(folder))  # the attacker's rewrite alone changes no byte
        assert audit(str(folder))["publishable"], kind


# --- Hidden channels in the rows -----------------------------------------------------------


def test_parquet_twin_lets_integers_past_the_2_to_40_bound(outputs, tmp_path):
    """The JSONL reader refuses integers >= 2^40 or < 0 ("hashes?"), but a folder's rows are
    read from the Parquet twin, which has no such bound: a 63-bit hash (or 8 bytes of text) in
    output_length passes once both twins are rewritten by kvtrace's own serializers."""
    folder = _copy(outputs["plain"], tmp_path)
    columns = _columns(folder)
    output_length = columns.output_length.copy()
    output_length[0] = int.from_bytes(b"alice@x.", "big")  # 2^62 < value < 2^63
    _republish(folder, _with(columns, output_length=output_length))
    _refused(folder)


def test_parquet_twin_lets_negative_lengths_pass(outputs, tmp_path):
    """The same hole for negative values: the JSONL reader refuses them, the Parquet path
    does not check output_length's sign."""
    folder = _copy(outputs["plain"], tmp_path)
    columns = _columns(folder)
    output_length = columns.output_length.copy()
    output_length[3] = -int.from_bytes(SECRET, "big")
    _republish(folder, _with(columns, output_length=output_length))
    _refused(folder)


def test_block_ids_permuted_out_of_first_seen_order(outputs, tmp_path):
    """kvtrace numbers block ids in first-seen order, so scanning the published rows the first
    occurrences read 0, 1, 2, ... The gate checks only that the set is dense: any relabelling
    keeps it dense, so the choice of permutation is a covert channel of log2(N!) bits."""
    folder = _copy(outputs["plain"], tmp_path)
    columns = _columns(folder)
    distinct = int(columns.ids.max()) + 1
    relabel = np.arange(distinct)[::-1].copy()  # id k -> N-1-k: still dense from 0
    _republish(folder, _with(columns, ids=relabel[columns.ids]))
    _refused(folder)


def test_sessions_permuted_out_of_first_seen_order(outputs, tmp_path):
    """Sessions are numbered in first-seen order too (0 on the first row); a swapped
    numbering stays dense and passes."""
    folder = _copy(outputs["plain"], tmp_path)
    columns = _columns(folder)
    session = np.where(columns.session >= 0, (2 - columns.session), columns.session)
    _republish(folder, _with(columns, session=session))
    _refused(folder)


def test_output_ids_beyond_the_decoded_blocks(outputs, tmp_path):
    """A row holds (input+output)//block - input//block output ids; the gate never counts
    them. Extra output ids (here existing ids, so everything stays dense) are free data."""
    folder = _copy(outputs["outputs"], tmp_path)
    columns = _columns(folder)
    payload = np.frombuffer(SECRET, np.uint8).astype(np.int64)  # ids 97..105 < distinct ids?
    payload = payload % (int(columns.ids.max()) + 1)
    num_output_ids = columns.num_output_ids.copy()
    num_output_ids[0] += len(payload)
    output_ids = np.concatenate([payload, columns.output_ids])
    _republish(folder, _with(columns, num_output_ids=num_output_ids, output_ids=output_ids))
    _refused(folder)


def test_manifest_record_counts_carry_free_numbers(outputs, tmp_path):
    """records.rejected, damaged_files, lost_bytes, without_output_length and
    with_unrendered_messages are checked against nothing (read = exported + rejected only):
    five 40-bit fields of free data, and counts that contradict the rows (more rows without
    an output length than rows)."""
    folder = _copy(outputs["plain"], tmp_path)
    records = _manifest(folder)["records"]
    word = int.from_bytes(SECRET, "big")
    records.update(
        rejected=word,
        read=records["exported"] + word,
        damaged_files=word,
        lost_bytes=word,
        without_output_length=word,
        with_unrendered_messages=word,
    )
    _republish(folder, records=records)
    _refused(folder)


def test_manifest_kvtrace_version_carries_free_text(outputs, tmp_path):
    """kvtrace_version is any 40 characters of [0-9A-Za-z.+-] after a digit, not this
    kvtrace's version."""
    folder = _copy(outputs["plain"], tmp_path)
    _republish(folder, kvtrace_version="0.1.0+alice.smith.acme-corp.ssn.078-05")
    _refused(folder)


def test_block_ids_that_contradict_chained_hashing(outputs, tmp_path):
    """Every hash scheme kvtrace publishes is chained: a block id stands for its whole prefix,
    so one id always sits at the same position after the same id. The gate never checks it:
    a row may reuse earlier ids in any order (log2(N) free bits per block), here a repeat of the
    first prompt's [0, 1, 2, 3, 4] republished as [0, 1, 2, 4, 3]."""
    folder = _copy(outputs["plain"], tmp_path)
    columns = _columns(folder)
    ids = columns.ids.copy()
    ends = np.cumsum(columns.num_ids)
    row = [
        r
        for r in range(1, len(columns))  # a later repeat of the first prompt
        if ids[ends[r] - columns.num_ids[r] : ends[r]].tolist() == [0, 1, 2, 3, 4]
    ][-1]
    repeat = ids[ends[row] - 5 : ends[row]]
    repeat[3], repeat[4] = 4, 3
    _republish(folder, _with(columns, ids=ids))
    _refused(folder)


def test_one_trace_file_is_measured_never_passed(tmp_path):
    """`kvtrace audit FILE` says "publishable: exactly what kvtrace publishes" for a lone shard
    no manifest vouches for: a session that is 5 bytes of text, input_length 2^40-1 with one
    block id, a timestamp of any precision."""
    shard = tmp_path / f"{SHARD}.jsonl"
    shard.write_bytes(
        b'{"timestamp": 123456789, "input_length": 1099511627775, '
        b'"output_length": 1099511627775, "hash_ids": [0], "session": '
        + str(int.from_bytes(SECRET, "big")).encode()
        + b"}\n"
    )
    _refused(shard)


def test_extended_attributes_on_published_files_pass(outputs, tmp_path):
    """File metadata beyond the bytes: a user.* extended attribute on a trace file (kept by
    cp -a, rsync -X, tar --xattrs) is never looked at."""
    folder = _copy(outputs["plain"], tmp_path)
    target = folder / f"{SHARD}.jsonl"
    try:
        os.setxattr(target, "user.note", b"patient jane doe, dob 1980-01-01")
    except (OSError, AttributeError):
        pytest.skip("no user extended attributes on this file system")
    _refused(folder)


# --- Crashes and unbounded memory ------------------------------------------------------------


def test_deeply_nested_template_kwargs_crash_the_audit(outputs, tmp_path):
    """A manifest within the 1 MiB bound whose chat_template_kwargs nest 300 arrays deep parses
    (json's own limit is ~1000) and then overflows the stack in the schema check: the audit
    raises RecursionError instead of flagging the file (the CLI prints "the job failed"
    and exits 1, the code for "flagged", not the documented 2 for "could not run")."""
    folder = _copy(outputs["plain"], tmp_path)
    raw = (folder / MANIFEST).read_bytes()
    deep = b"[" * 300 + b"]" * 300
    (folder / MANIFEST).write_bytes(
        raw.replace(
            b'"chat_template_kwargs": {}', b'"chat_template_kwargs": {"thinking": ' + deep + b"}"
        )
    )
    report = audit(str(folder))  # must not raise
    assert not report["publishable"]


def test_a_small_parquet_bomb_is_refused_in_bounded_memory(tmp_path):
    """A 0.4 MB Parquet shard declaring 20M rows of zeros (more than the 8M rows kvtrace ever
    puts in a shard) is decoded whole before anything is compared: ~2.3 GB of memory and ~15 s
    here, and it scales linearly (a 4 MB file: ~23 GB). The gate should refuse it from its
    footer; the audit runs in a child process whose peak memory is measured."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, batch = 20_000_000, 1_000_000
    zeros = pa.array(np.zeros(batch, np.int64))
    table = pa.table(
        {
            "timestamp": zeros,
            "input_length": zeros,
            "output_length": zeros,
            "hash_ids": pa.ListArray.from_arrays(
                pa.array(np.zeros(batch + 1, np.int32)), pa.array(np.zeros(0, np.int64))
            ),
            "session": zeros,
        }
    )
    path = tmp_path / "out" / f"{SHARD}.parquet"
    path.parent.mkdir()
    with pq.ParquetWriter(path, table.schema, compression="zstd") as writer:
        for _ in range(rows // batch):
            writer.write_table(table)
    assert path.stat().st_size < 1 << 20
    publishable, peak = _peak_memory_of_audit(path.parent)
    assert not publishable
    assert peak < 1 << 30, (
        f"the audit of a {path.stat().st_size:,}-byte shard peaked at {peak:,} bytes"
    )


# --- Object stores (gs://, s3://): the folder as Beam lists it -------------------------------

_OBJECTS: dict[str, bytes] = {}


@functools.cache  # one class per process: Beam refuses two file systems of one scheme
def _object_store():
    """A Beam FileSystem over a dict, listing like GCS and S3 do: every object under a prefix,
    nested ones too (Beam's match then filters with its own glob)."""
    import io

    from apache_beam.io.filesystem import FileMetadata, FileSystem

    class RedTeamObjects(FileSystem):
        @classmethod
        def scheme(cls):
            return "redteamobj"

        def join(self, basepath, *paths):
            return "/".join([basepath.rstrip("/"), *paths])

        def split(self, path):
            return path.rsplit("/", 1)

        def has_dirs(self):
            return False

        def _list(self, prefix):
            for name, data in sorted(_OBJECTS.items()):
                if name.startswith(prefix):
                    yield FileMetadata(name, len(data))

        def open(self, path, mime_type=None, compression_type=None):
            return io.BytesIO(_OBJECTS[path])

        def exists(self, path):
            return path in _OBJECTS

        def size(self, path):
            return len(_OBJECTS[path])

        mkdirs = create = copy = rename = last_updated = checksum = metadata = delete = (
            lambda self, *a, **k: (_ for _ in ()).throw(NotImplementedError())
        )

    return RedTeamObjects


@pytest.mark.beam  # a Beam FileSystem: the beam tests' worker runs it
@pytest.mark.parametrize("extra", ["sub/secret.txt", "back\\slash-secret.txt"])
def test_an_object_store_folder_hides_objects_from_the_gate(outputs, extra):
    """On gs:// or s3:// the gate lists the folder with Beam's glob `*`, which is [^/\\\\]*: an
    object in a "subfolder" (out/sub/secret.txt) or with a backslash in its name is never seen,
    and the folder is publishable. `gsutil cp -r` / `aws s3 sync` publish them all."""
    _object_store()
    _OBJECTS.clear()
    folder = "redteamobj://bucket/out"
    for path in outputs["plain"].iterdir():
        _OBJECTS[f"{folder}/{path.name}"] = path.read_bytes()
    try:
        # the listing works: the real output is flagged only for being remote (REMOTE_FOLDER)
        assert audit(folder)["flags"] == [REMOTE_FOLDER]
        _OBJECTS[f"{folder}/top-level-secret.txt"] = b"x"
        assert len(audit(folder)["flags"]) > 1  # and an object beside the files is seen
        del _OBJECTS[f"{folder}/top-level-secret.txt"]
        _OBJECTS[f"{folder}/{extra}"] = b"patient jane doe, dob 1980-01-01"
        report = audit(folder)
    finally:
        _OBJECTS.clear()
    assert len(report["flags"]) > 1, report["files"]


def test_a_decimal_column_crashes_the_audit(outputs, tmp_path):
    """A Parquet shard whose timestamp column is decimal128 holding 10^30: the conversion
    raises OverflowError, which columns_of_parquet does not catch (it catches ValueError,
    TypeError, AttributeError and Arrow's errors), so the audit raises instead of flagging."""
    import decimal
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = _copy(outputs["plain"], tmp_path)
    table = pq.read_table(folder / f"{SHARD}.parquet")
    huge = pa.array([decimal.Decimal(10**30)] * table.num_rows, pa.decimal128(38, 0))
    table = table.set_column(0, "timestamp", huge)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    (folder / f"{SHARD}.parquet").write_bytes(sink.getvalue())
    _republish(folder)
    report = audit(str(folder))  # must not raise
    assert not report["publishable"]


def test_many_shards_are_paired_in_linear_time():
    """A folder may declare up to 99,999 shards (two files each, empty files will do). The gate
    pairs them with `name in names` over a list: quadratic. 20,000 shards take ~40 s to pair
    here (an audit of 25,000 empty shard pairs: 137 s); 99,999 would take most of an hour.
    Pairing 8x the shards must cost about 8x the CPU, not 64x (CPU time, the best of three:
    a wall-clock limit fails on a loaded machine)."""
    import time

    from kvtrace.transforms.stats.audit import _Gate, _shard_pairs
    from kvtrace.transforms.trace_format import shard_name

    def pairing_cpu_s(shards: int) -> float:
        names = sorted(
            shard_name(i, shards, suffix)
            for i in range(shards)
            for suffix in (".jsonl", ".parquet")
        )
        costs = []
        for _ in range(3):
            start = time.process_time()
            _shard_pairs(names, _Gate())
            costs.append(time.process_time() - start)
        return min(costs)

    small, large = pairing_cpu_s(2_500), pairing_cpu_s(20_000)
    assert large < 24 * max(small, 1e-3), (small, large)


def test_absolute_wall_clock_timestamps_pass(outputs, tmp_path):
    """Without an id map kvtrace publishes ms from the night's first request: the first row is
    at 0. The gate never checks the origin, so every timestamp can be shifted back to the log's
    absolute epoch ms (when, to the ms, each request was made: 1.7e12 > 2^40 passes too, through
    the Parquet twin)."""
    folder = _copy(outputs["plain"], tmp_path)
    columns = _columns(folder)
    assert _manifest(folder)["id_map"] is None and columns.timestamp[0] == 0
    _republish(folder, _with(columns, timestamp=columns.timestamp + 1_700_000_000_000))
    _refused(folder)


def test_absolute_time_within_the_2_to_40_bound_passes(outputs, tmp_path):
    """The same leak in bounds, for the JSONL reader too: the log's epoch seconds as ms offset
    (1.7e9 ms after a zero that kvtrace always puts on the first row)."""
    folder = _copy(outputs["plain"], tmp_path)
    columns = _columns(folder)
    _republish(folder, _with(columns, timestamp=columns.timestamp + 1_700_000_000))
    _refused(folder)


def test_manifest_fields_that_contradict_each_other(outputs, tmp_path):
    """hash_scheme_keyed is HashScheme.keyed (true for the salted kvtrace scheme only), yet the
    gate takes an engine's unkeyed scheme declared keyed: a false privacy claim to consumers,
    and a bit that is free to set."""
    folder = _copy(outputs["plain"], tmp_path)
    _republish(folder, hash_scheme="dynamo-xxh3-64-seed1337-v1", hash_scheme_keyed=True)
    _refused(folder)


def test_manifest_numbers_as_floats_pass(outputs, tmp_path):
    """JSON Schema's "integer" admits 4.0, and canonical_json writes 4.0 back as 4.0, so the
    byte comparison holds: block_size, granularity and every record count may be written as
    floats (a free bit per number; and replay commands such as "--isl-block-size 4.0" that
    the replayers' int options refuse). kvtrace writes ints only."""
    from kvtrace.transforms.write.replayers import replay_commands

    folder = _copy(outputs["plain"], tmp_path)
    manifest = _manifest(folder)
    records = {k: float(v) for k, v in manifest["records"].items()}
    _republish(
        folder,
        block_size=4.0,
        granularity={"timestamp_ms": 1.0, "output_length": 1.0},
        records=records,
        replay=replay_commands(4.0, records["exported"], manifest["files"]),
    )
    _refused(folder)


def _peak_memory_of_audit(folder: Path) -> tuple[bool, int]:
    """Run the audit in a child process: its verdict and its peak resident memory in bytes."""
    import subprocess
    import sys
    import textwrap

    # The child's own peak: Linux carries ru_maxrss across exec from the (large) test process,
    # so the peak (VmHWM) is reset through clear_refs first and read from /proc after.
    probe = textwrap.dedent(f"""
        import re
        open("/proc/self/clear_refs", "w").write("5")
        from kvtrace.transforms.stats.audit import audit
        report = audit({str(folder)!r})
        status = open("/proc/self/status").read()
        print(report["publishable"], int(re.search(r"VmHWM:\\s+(\\d+)", status).group(1)) << 10)
    """)
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=600, cwd=str(ROOT)
    )
    assert out.returncode == 0, out.stderr[-500:]
    publishable, peak = out.stdout.split()
    return publishable == "True", int(peak)


def test_a_jsonl_shard_without_its_twin_is_parsed_into_python_objects(tmp_path):
    """With no Parquet twin (or when the twin disagrees, for the flag's wording) the JSONL shard
    is parsed as a Python dict and list per row: ~33 bytes of memory per byte of file (100 MB
    took 3.3 GB and 70 s here), so a JSONL shard within the 2 GiB bound takes ~70 GB. The
    documented bound is one shard's columns plus ~40 bytes per row."""
    line = (
        b'{"timestamp": 0, "input_length": 4000, "output_length": 0, "hash_ids": ['
        + b", ".join([b"0"] * 1000)
        + b"]}\n"
    )
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / f"{SHARD}.jsonl").write_bytes(line * (40_000_000 // len(line)))
    publishable, peak = _peak_memory_of_audit(folder)
    assert not publishable
    assert peak < 600 << 20, f"a 40 MB JSONL shard: the audit peaked at {peak:,} bytes"


def test_distinct_ids_are_merged_across_shards_in_linear_time(monkeypatch):
    """Each shard's ids were merged by concatenating and re-sorting every distinct id seen so
    far: quadratic in the shard count (1,000 one-row shards of 4,000 new ids took 150 s, 10,000
    hours). Merged as they double, the ids sorted in all stay within a few times their count,
    whatever the shard count (counted, not timed)."""
    block = 4_000
    rows = _Rows()
    rows.block_size = 4
    sorted_ids = []
    distinct = _Rows._distinct

    def counted(self, ids, weights, parents):
        sorted_ids.append(len(ids))
        return distinct(self, ids, weights, parents)

    monkeypatch.setattr(_Rows, "_distinct", counted)
    for shard in range(300):
        one = np.array([1])
        rows.add(
            TraceColumns(
                one * shard,
                one * 4 * block,
                one * 0,
                one * block,
                np.arange(shard * block, (shard + 1) * block, dtype=np.int64),
                one * -1,
                one * -1,
            ),
            None,
        )
    assert len(rows.ids) == 300 * block
    assert sum(sorted_ids) <= 4 * 300 * block, f"{sum(sorted_ids):,} ids sorted"


def test_template_kwargs_are_published_keyed_not_as_plain_digests(tiny_tokenizer, tmp_path):
    """An operator's template values must not be published as plain sha256 (sha256("alice") is a
    dictionary lookup away): kvtrace keys them with the run's salt, and the gate passes that."""
    import hashlib

    from kvtrace.transforms.write.manifest import public_template_kwargs

    night = write_jsonl(tmp_path / "night.jsonl", _night(3))
    out = tmp_path / "out"
    (tmp_path / "salt").write_bytes(b"s" * 32)
    kwargs = {"customer": "alice", "reasoning_effort": "high"}
    assert (
        anonymize(
            tiny_tokenizer,
            [night],
            out,
            "--block-size",
            "4",
            "--chat-template-kwargs",
            json.dumps(kwargs),
            "--salt-file",
            str(tmp_path / "salt"),
        )
        == 0
    )
    text = (out / MANIFEST).read_text()
    for guess in (b"alice", b"customer", b"high"):
        assert hashlib.sha256(guess).hexdigest() not in text
    assert "alice" not in text and "customer" not in text
    # The digests are confirmed only by the run's kwargs under its salt: without them, refused.
    assert not gate.audit(str(out), tiny_tokenizer)["publishable"]
    assert not gate.audit(
        str(out), tiny_tokenizer, template_kwargs=public_template_kwargs(kwargs, b"t" * 32)
    )["publishable"]
    assert gate.audit(
        str(out), tiny_tokenizer, template_kwargs=public_template_kwargs(kwargs, b"s" * 32)
    )["publishable"]


def test_the_json_report_written_into_the_audited_folder(outputs, tmp_path):
    """`kvtrace audit DIR --json DIR/report.json` says publishable (exit 0) and then writes a
    file into the folder it just passed: what is uploaded next is not what was audited (a
    second audit refuses it). The CLI should refuse an OUT inside DIR."""
    from kvtrace.cli import main

    folder = _copy(outputs["plain"], tmp_path)
    code = main(["audit", str(folder), "--json", str(folder / "report.json")])
    assert code != 0 or not (folder / "report.json").exists()


def test_a_map_night_renumbered_from_elsewhere_is_refused_against_the_map(outputs, tmp_path):
    """A night extending an id map (night 1 again: no new ids) whose id_map.block_ids_from says
    1000 more: consistent in itself (no id at or past it), but no version of the map began
    numbering there: 40 free bits without the map."""
    folder = _copy(outputs["night2"], tmp_path)
    start = dict(_manifest(folder)["id_map"])
    start["block_ids_from"] += 1000
    assert (_columns(folder).ids < start["block_ids_from"]).all()
    _republish(folder, id_map=start)
    assert _refused(folder) == [
        "manifest.json: id_map and the files are not a night a version "
        "of the id map recorded (its start, time included, and its "
        "files' digests)"
    ]
    NUMBERING_BEFORE = NUMBERING[:]
    try:
        NUMBERING[:] = []
        assert "pass --id-map" in _refused(_copy(outputs["night2"], tmp_path / "bare"))[0]
    finally:
        NUMBERING[:] = NUMBERING_BEFORE
