"""Red team round 11, the gate (nothing private published): reproducers of what `kvtrace audit`
could not refuse within its bounds on a folder anonymize published, each asserting the promised
behaviour (a one-line flag, each file read at most once, within the bytes kvtrace writes)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import chat, kvtrace_child, write_jsonl
from kvtrace.transforms.stats import audit as gate

pytestmark = pytest.mark.slow
SHARD = "trace-00000-of-00001"
SALT = b"s" * 32


@pytest.fixture(scope="module")
def made(tiny_tokenizer, tmp_path_factory) -> dict[str, Path]:
    """A publishable night of its own and the first night of an id map, six rows each at block
    size 4, with the map and its salt."""
    tmp = tmp_path_factory.mktemp("redgate11")
    log = write_jsonl(tmp / "night.jsonl", [chat(i, 1000 * i, f"s{i % 2}") for i in range(6)])
    (tmp / "salt").write_bytes(SALT)
    common = ("--input", str(log), "--tokenizer", tiny_tokenizer, "--block-size", "4")
    mapped = ("--id-map", str(tmp / "map"), "--salt-file", str(tmp / "salt"))
    for name, extra in (("night", ()), ("mapped", mapped)):
        made = kvtrace_child("anonymize", *common, "--output", str(tmp / name), *extra)
        assert made.returncode == 0, made.stderr
    assert gate.audit(str(tmp / "night"))["publishable"]
    assert gate.audit(str(tmp / "mapped"), numbering=_numbering(tmp / "map"))["publishable"]
    return {"night": tmp / "night", "mapped": tmp / "mapped", "map": tmp / "map"}


def _numbering(id_map: Path) -> list:
    return gate.map_numbering(str(id_map), SALT)


def _bytes_read() -> int:
    """What this process has read through read(2) and its kin so far (page cache included)."""
    with open("/proc/self/io") as io:
        return int(next(line for line in io if line.startswith("rchar:")).split()[1])


def _read_by_audit(folder: Path, **options) -> tuple[dict, int]:
    """The gate's report on the folder and the bytes it read to give it."""
    before = _bytes_read()
    report = gate.audit(str(folder), **options)
    return report, _bytes_read() - before


def test_a_twin_longer_than_kvtraces_bytes_is_not_hashed_to_the_shard_bound(made, tmp_path):
    """Round 10 holds no more of a Parquet twin than kvtrace's bytes for its rows (+1), but
    still hashes the whole file, up to MAX_SHARD_BYTES (2 GiB), for the manifest's digest
    (_read -> _kept_and_digest), although a file longer than every form is refused whatever it
    hashes to, and its size says so before a byte is read. A sparse twin costs no disk: one of
    2 GiB beside six rows takes the CLI's audit ~6 CPU-s (16 s on this shared machine), and a
    folder of 99,999 such shards (an empty JSONL each, a few MB on disk) days. A file kvtrace
    could not have written needs no reading past the length kvtrace's bytes could have."""
    folder = tmp_path / "sparse-twin"
    shutil.copytree(made["night"], folder)
    with open(folder / f"{SHARD}.parquet", "r+b") as twin:
        twin.truncate(1 << 30)  # a hole: no block is written
    report, read = _read_by_audit(folder)
    assert not report["publishable"]
    assert read < 64 << 20, f"the audit of a six-row night read {read >> 20} MiB"


def test_audit_id_map_reads_the_shards_the_manifest_names_as_often_as_it_names_them(made, tmp_path):
    """Round 10 dropped the manifest schema's uniqueItems on `files` (quadratic), leaving its
    check to the files confirmer; but under `audit --id-map` the night's identity
    (_confirm_recorded_start -> id_map.night_identity) reads every JSONL name the manifest's
    `files` lists, before and whatever that confirmer finds: as often as it is listed, and
    whole (storage.open_regular with no size bound, where the shard itself is refused past
    MAX_SHARD_BYTES unread). A 31 KB manifest naming a 16 MiB shard 1,000 times took the CLI's
    audit 180 s here (52 CPU-s); 1 MiB of manifest names it ~35,000 times, and a sparse shard
    may be terabytes: the audit never ends. The gate must read only the folder's own shards,
    once each, within the shard bound, however the manifest lists them."""
    folder = tmp_path / "repeated"
    shutil.copytree(made["mapped"], folder)
    (folder / f"{SHARD}.jsonl").write_bytes(b"x" * (1 << 20))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"] = [f"{SHARD}.jsonl"] * 1_000
    (folder / "manifest.json").write_text(json.dumps(manifest))
    report, read = _read_by_audit(folder, numbering=_numbering(made["map"]))
    assert not report["publishable"]
    assert read < 64 << 20, f"the audit of a 1 MiB shard read {read >> 20} MiB"


def test_the_audit_opens_each_file_once(made, monkeypatch):
    """By construction: the night's identity is taken from the shard bytes the audit read, so
    `audit --id-map` opens no file twice (and the identity so taken is the one anonymize
    recorded: the night passes)."""
    from kvtrace.transforms import storage

    opened, open_regular = [], storage.open_regular

    def counted(path, *args, **kwargs):
        opened.append(Path(path).name)
        return open_regular(path, *args, **kwargs)

    monkeypatch.setattr(storage, "open_regular", counted)
    assert gate.audit(str(made["mapped"]), numbering=_numbering(made["map"]))["publishable"]
    files = sorted(p.name for p in made["mapped"].iterdir())
    assert sorted(n for n in opened if n in files) == files
