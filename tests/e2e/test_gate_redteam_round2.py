"""Red team round 2 against the publication gate (`kvtrace audit`): variants that slip past the
round-1 fixes. Each test builds a folder carrying something kvtrace would not write, recomputing
every digest and statistic with kvtrace's own serializers, and asserts the gate refuses it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_gate_redteam import (
    NUMBERING,
    SECRET,
    TOKENIZER,
    _columns,
    _copy,
    _manifest,
    _night,
    _republish,
    _with,
    audit,
    the_tokenizer,  # noqa: F401 (an autouse fixture)
)

from helpers import ROOT, anonymize, under_rlimit, write_jsonl
from kvtrace.transforms.stats import audit as gate
from kvtrace.transforms.write.manifest import set_content_times

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def outputs(tiny_tokenizer, tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("redgate2")
    night = write_jsonl(tmp / "night.jsonl", _night(12))
    made = {}
    NUMBERING[:] = []  # no id map here
    for name, extra in {"plain": ()}.items():
        assert anonymize(tiny_tokenizer, [night], tmp / name, "--block-size", "4", *extra) == 0
        assert audit(str(tmp / name))["publishable"]
        made[name] = tmp / name
    return made


def _refused(folder: Path) -> list[str]:
    report = audit(str(folder))
    assert not report["publishable"], "the gate accepted it: " + json.dumps(report["flags"])
    return report["flags"]


def test_ids_extend_map_flag_reopens_absolute_time_sessions_and_ids(outputs, tmp_path):
    """A night of its own (no --id-map) republished with ids_extend_map: true. That one bit,
    which nothing in the folder can contradict, switches off the round-1 fixes: the first row
    at time 0, sessions and block ids numbered 0, 1, 2 in first-seen order, dense ids. So the
    log's epoch seconds (as ms), a session holding 5 bytes of text and block ids relabelled to
    carry text all pass."""
    folder = _copy(outputs["plain"], tmp_path)
    columns = _columns(folder)
    word = int.from_bytes(SECRET, "big")
    session = np.where(columns.session >= 0, columns.session + word, columns.session)
    _republish(
        folder,
        _with(
            columns,
            timestamp=columns.timestamp + 1_700_000_000,
            session=session,
            ids=columns.ids + word,
        ),
        id_map={"block_ids_from": word, "sessions_from": word, "time_from_ms": 1_700_000_000},
    )  # (the manifest's form of the bit now)
    assert _refused(folder) == [
        "manifest.json: id_map says where this night's numbering began, which only the id map "
        "(or, for a stream's window, the stream's folder audited whole) can confirm: pass "
        "--id-map MAP with the salt the run used (--salt-file or --salt-secret), or audit the "
        "stream's output folder"
    ]


def test_local_tokenizer_folder_template_file_names_are_published(tmp_path):
    """manifest.json promises "no string an operator typed, no path": a local tokenizer folder's
    path is never published. Yet each file name under its additional_chat_templates/ (16 names
    of up to 64 free characters) is published as a key of tokenizer.sha256, and the gate passes
    it: an operator's own text, named as the operator chose, in the published folder."""
    import shutil

    from tiny_tokenizer import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer(tmp_path / "tok")
    extra = Path(tokenizer) / "additional_chat_templates"
    extra.mkdir()
    secret = "patient_jane_doe_dob_1980-01-01"
    shutil.copy(Path(tokenizer) / "chat_template.jinja", extra / f"{secret}.jinja")
    night = write_jsonl(tmp_path / "night.jsonl", _night(4))
    out = tmp_path / "out"
    assert anonymize(str(tokenizer), [night], out, "--block-size", "4") == 0
    published = b"".join(p.read_bytes() for p in out.iterdir())
    assert secret.encode() not in published or not gate.audit(str(out), tokenizer)["publishable"]


def test_record_counts_still_carry_free_numbers_when_consistent(outputs, tmp_path):
    """Round 1's fix flags counts that exceed the rows (without_output_length > exported), not
    free numbers: rejected (with read = exported + rejected), damaged_files <= rejected and
    lost_bytes, which nothing bounds, still carry three 40-bit words of text each."""
    folder = _copy(outputs["plain"], tmp_path)
    records = _manifest(folder)["records"]
    word = int.from_bytes(SECRET, "big")
    records.update(
        rejected=word, read=records["exported"] + word, damaged_files=word, lost_bytes=word
    )
    _republish(folder, records=records)
    _refused(folder)


def test_file_times_carry_free_data(outputs, tmp_path):
    """The extended-attribute channel of round 1, through the other metadata copies keep
    (rsync -t, cp -p, tar, gsutil's goog-reserved-file-mtime): a file's mtime. kvtrace writes
    files at the time of the run; a published mtime of 1980 whose nanoseconds are 5 bytes of
    text is never looked at."""
    import os

    folder = _copy(outputs["plain"], tmp_path)
    stamp = 315_532_800 * 10**9 + int.from_bytes(SECRET[:3], "big")  # 1980-01-01 + text in ns
    for path in folder.iterdir():
        os.utime(path, ns=(stamp, stamp))
    _refused(folder)


def test_lengths_and_response_times_kvtrace_never_writes_pass(outputs, tmp_path):
    """kvtrace's reader refuses an output_length above 2^31 - 1 (records.MAX_COUNT) and a
    response time above 2^31 - 1 ms (response_end.MAX_RESPONSE_MS): no row it writes holds more.
    The gate bounds every integer only by 2^40, so 5 bytes of text ("alice" = 4.2e11) in a row's
    output_length and in its response_ms pass: values kvtrace cannot write."""
    folder = _copy(outputs["plain"], tmp_path)
    columns = _columns(folder)
    word = int.from_bytes(SECRET, "big")
    assert 2**31 < word < 2**40
    output_length, response = columns.output_length.copy(), columns.response_ms.copy()
    output_length[1] = word
    response[0] = word
    _republish(folder, _with(columns, output_length=output_length, response_ms=response))
    _refused(folder)


@pytest.mark.parametrize("name", ["security.note", "system.posix_acl_access"])
def test_extended_attributes_outside_user_and_trusted_pass(outputs, tmp_path, name):
    """Round 1's fix (_check_attributes) flags only user.* and trusted.* attributes. A
    security.* attribute of any name and value (as root, or where no security module claims the
    name), and a POSIX ACL whose entries name uids of the attacker's choosing (4 bytes each:
    "alic"), pass; cp -a, rsync -AX (as root) and tar --acls --xattrs carry them along."""
    import os
    import struct

    folder = _copy(outputs["plain"], tmp_path)
    target = folder / "trace-00000-of-00001.jsonl"
    if name.startswith("system."):  # the kernel's ACL xattr: version 2, (tag, perm, id) entries
        entries = (
            (0x01, 6, 0xFFFFFFFF),
            (0x02, 4, int.from_bytes(b"alic", "big")),
            (0x04, 4, 0xFFFFFFFF),
            (0x10, 4, 0xFFFFFFFF),
            (0x20, 4, 0xFFFFFFFF),
        )
        value = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
    else:
        value = b"patient jane doe, dob 1980-01-01"
    try:
        os.setxattr(target, name, value)
    except (OSError, AttributeError):
        pytest.skip(f"no {name} attributes here")
    _refused(folder)


def test_extended_attributes_on_the_folder_itself_pass(outputs, tmp_path):
    """_check_attributes looks at the folder's entries, never at the folder: a user.* attribute
    on the published directory (copied by cp -a, rsync -X, tar --xattrs of the folder) passes."""
    import os

    folder = _copy(outputs["plain"], tmp_path)
    try:
        os.setxattr(folder, "user.note", b"patient jane doe, dob 1980-01-01")
    except (OSError, AttributeError):
        pytest.skip("no user extended attributes on this file system")
    _refused(folder)


def test_manifest_digests_carry_free_bytes(outputs, tmp_path):
    """tokenizer.sha256 is checked for shape only (64 hex digits per file, up to 20 files with
    16 names of the attacker's choosing), and a vllm scheme's 16 hex digits are checked against
    nothing: 32 free bytes per digest, ~700 bytes of text in all, pass. The gate has no
    tokenizer to compare them to (`kvtrace audit` takes none)."""
    folder = _copy(outputs["plain"], tmp_path)
    tokenizer = _manifest(folder)["tokenizer"]
    text = b"patient jane doe, dob 1980-01-01".hex()  # 32 bytes: 64 hex digits
    tokenizer["sha256"] = {name: text for name in tokenizer["sha256"]}
    for i in range(16):
        tokenizer["sha256"][f"additional_chat_templates/t{i}.jinja"] = text
    _republish(
        folder,
        tokenizer=tokenizer,
        hash_scheme="vllm-sha256-cbor-v1:" + text[:16],
        hash_scheme_keyed=False,
    )
    _refused(folder)


def test_output_ids_permuted_out_of_first_seen_order(tiny_tokenizer, tmp_path):
    """Round 1's first-seen check (_Rows._check_order) covers prompt ids and sessions, never
    output_hash_ids: kvtrace numbers output-only ids after the night's prompt ids, in first-seen
    order (23, 24, ...), but any relabelling of them keeps the set dense and passes, a covert
    channel of log2(N!) bits (N output-only ids), as prompt ids were in round 1."""
    night = write_jsonl(tmp_path / "texts.jsonl", _night(12, with_output_text=True))
    folder = tmp_path / "out"
    assert (
        anonymize(tiny_tokenizer, [night], folder, "--block-size", "4", "--emit-output-hashes") == 0
    )
    columns = _columns(folder)
    only = sorted(set(columns.output_ids.tolist()) - set(columns.ids.tolist()))
    assert len(only) > 2
    relabel = dict(zip(only, only[::-1]))
    output_ids = np.array([relabel.get(v, v) for v in columns.output_ids.tolist()], np.int64)
    _republish(folder, _with(columns, output_ids=output_ids))
    _refused(folder)


def test_shard_boundaries_of_the_attackers_choice_pass(outputs, tmp_path):
    """kvtrace cuts shards only at write/shards.MAX_BLOCKS_PER_SHARD (8M blocks): a 12-row night
    is one shard. The gate checks each shard's bytes and the rows across them, never where the
    cuts fall or how many there are: 12 rows cut into 3 shards after rows 1 and 7 pass, the
    shard count and cut points a free channel (up to 99,999 shards)."""
    from kvtrace.transforms.stats.audit import _Rows
    from kvtrace.transforms.trace_format import (
        MANIFEST,
        STATS,
        canonical_json,
        jsonl_bytes,
        parquet_bytes,
        shard_name,
    )
    from kvtrace.transforms.write.publish import sha256_of
    from kvtrace.transforms.write.replayers import replay_commands

    folder = _copy(outputs["plain"], tmp_path)
    columns = _columns(folder)
    for path in folder.glob("trace-*"):
        path.unlink()
    cuts = [0, 1, 7, len(columns)]
    for shard in range(3):
        part = columns.rows(cuts[shard], cuts[shard + 1])
        (folder / shard_name(shard, 3, ".jsonl")).write_bytes(jsonl_bytes(part))
        (folder / shard_name(shard, 3, ".parquet")).write_bytes(parquet_bytes(part))
    manifest = _manifest(folder)
    rows = _Rows()
    rows.block_size = manifest["block_size"]
    rows.add(columns, None)
    (folder / STATS).write_bytes(canonical_json(rows.stats()))
    manifest["files"] = sorted(p.name for p in folder.iterdir() if p.name != MANIFEST)
    manifest["sha256"] = {n: sha256_of((folder / n).read_bytes()) for n in manifest["files"]}
    manifest["replay"] = replay_commands(
        manifest["block_size"], manifest["records"]["exported"], manifest["files"]
    )
    (folder / MANIFEST).write_bytes(canonical_json(manifest))
    set_content_times(str(folder))
    assert _refused(folder) == [
        "the rows are in 3 trace shards, kvtrace cuts them into 1 "
        "(consecutive published minutes up to 8,000,000 blocks each)"
    ]


def _renumbered(columns, order):
    """The rows in a new order, ids and sessions numbered again in first-seen order (as
    kvtrace's dense_ids numbers them): every check the gate makes on a night still holds."""
    ends = np.cumsum(columns.num_ids)
    rows = [columns.ids[ends[r] - columns.num_ids[r] : ends[r]] for r in order]
    ids = np.concatenate(rows)
    first = {}
    for value in ids.tolist():
        first.setdefault(value, len(first))
    sessions = {}
    session = columns.session[order]
    for value in session.tolist():
        if value >= 0:
            sessions.setdefault(value, len(sessions))
    return _with(
        columns,
        timestamp=columns.timestamp[order],
        input_length=columns.input_length[order],
        output_length=columns.output_length[order],
        num_ids=columns.num_ids[order],
        ids=np.array([first[v] for v in ids.tolist()], np.int64),
        session=np.array([sessions.get(v, -1) for v in session.tolist()], np.int64),
        response_ms=columns.response_ms[order],
    )


def test_rows_of_one_timestamp_in_an_order_of_the_attackers_choice(tiny_tokenizer, tmp_path):
    """Rows that share a published timestamp (every row of a granule with
    --timestamp-granularity-ms) may be put in any order as long as ids and sessions are then
    numbered again first-seen: the gate checks only that time never decreases. kvtrace writes
    one order for them; any other is a channel of log2(k!) bits per k tied rows (with an
    hour's granularity, most of a night)."""
    night = write_jsonl(tmp_path / "night.jsonl", _night(12))
    folder = tmp_path / "out"
    assert (
        anonymize(
            tiny_tokenizer,
            [night],
            folder,
            "--block-size",
            "4",
            "--timestamp-granularity-ms",
            "60000",
        )
        == 0
    )
    columns = _columns(folder)
    assert (columns.timestamp == 0).all()  # one granule: 12 rows tied
    order = np.arange(len(columns))[::-1].copy()
    _republish(folder, _renumbered(columns, order))
    assert _columns(folder).timestamp.tolist() == columns.timestamp.tolist()
    _refused(folder)


def test_a_jsonl_shard_that_disagrees_with_its_twin_is_parsed_into_python_objects(
    outputs, tmp_path
):
    """Round 1's fix keeps a JSONL shard without its twin unread, but beside a real Parquet
    twin a JSONL shard that is not its bytes is parsed whole into Python objects to word the
    flag (_why_not_canonical -> columns_of_jsonl): ~36 bytes of memory per byte of file (20 MB
    took 800 MB here, an audit of the bare folder 77 MB), so a shard within MAX_SHARD_BYTES
    (2 GiB) costs ~70 GB. The flag needs no parse of the whole file. Since round 9 a shard's
    rows come from its JSONL file (parsed to columns, never Python objects per value) and the
    Parquet twin is compared with kvtrace's Parquet bytes for them: this worst case of one-digit
    ids (6.5M of them) costs their columns and kvtrace's own Parquet writer, ~390 MB."""
    from test_gate_redteam import _peak_memory_of_audit

    folder = _copy(outputs["plain"], tmp_path)
    line = (
        b'{"timestamp": 0, "input_length": 4000, "output_length": 0, "hash_ids": ['
        + b", ".join([b"0"] * 1000)
        + b"]}\n"
    )
    (folder / "trace-00000-of-00001.jsonl").write_bytes(line * (20_000_000 // len(line)))
    publishable, peak = _peak_memory_of_audit(folder)
    assert not publishable
    assert peak < 450 << 20, f"a 20 MB JSONL shard: the audit peaked at {peak:,} bytes"


def test_a_small_folder_is_audited_within_a_modest_address_space(outputs):
    """audit._read reads each shard file with handle.read(MAX_SHARD_BYTES + 1): the buffer of
    2 GiB + 1 is allocated before a byte is read, whatever the file's size. Under an address
    space limit of 2 GB (ulimit -v, prlimit --as) `kvtrace audit` of a 7 KB folder stops with
    "the job failed: MemoryError" (exit 1, read as "flagged"), instead of reading 7 KB."""
    import subprocess
    import sys

    limit = 2_000_000_000

    command = [sys.executable, "-m", "kvtrace.cli", "audit", str(outputs["plain"])]
    out = subprocess.run(
        under_rlimit([*command, "--tokenizer", TOKENIZER[0]], "RLIMIT_AS", limit),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(ROOT),
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-300:]


def test_one_block_id_with_two_token_counts(outputs, tmp_path):
    """A block id stands for its whole prefix, so it always holds the same tokens: a prompt's
    partial last block has one size wherever its id appears. The gate keeps each id's first
    token count (_Rows._distinct) and never compares the others: a repeat of the first prompt
    (ids [0, 1, 2, 3, 4], 18 tokens) republished with 17 tokens, its id sequence unchanged,
    passes. Every row ending in a shared block carries log2(block size) free bits (9 at 512)."""
    folder = _copy(outputs["plain"], tmp_path)
    columns = _columns(folder)
    ends = np.cumsum(columns.num_ids)
    repeats = [
        r
        for r in range(len(columns))
        if columns.ids[ends[r] - columns.num_ids[r] : ends[r]].tolist() == [0, 1, 2, 3, 4]
    ]
    assert len(repeats) > 1 and columns.input_length[repeats[0]] == 18
    input_length = columns.input_length.copy()
    input_length[repeats[-1]] = 17
    _republish(folder, _with(columns, input_length=input_length))
    _refused(folder)
