"""Red team round 10, the gate (nothing private published): reproducers of what `kvtrace audit`
could not refuse within its bounds on a folder anonymize published, each asserting the promised
behaviour (a one-line flag in bounded time and memory)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from helpers import chat, kvtrace_child, peak_rss_mb, write_jsonl

pytestmark = pytest.mark.slow
SHARD = "trace-00000-of-00001"


@pytest.fixture(scope="module")
def night(tiny_tokenizer, tmp_path_factory) -> Path:
    """A publishable night at block size 4: six rows, two sessions."""
    tmp = tmp_path_factory.mktemp("redgate10")
    log = write_jsonl(tmp / "night.jsonl", [chat(i, 1000 * i, f"s{i % 2}") for i in range(6)])
    made = kvtrace_child(
        "anonymize", "--input", str(log), "--output", str(tmp / "out"),
        "--tokenizer", tiny_tokenizer, "--block-size", "4",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    audited = kvtrace_child("audit", str(tmp / "out"))
    assert audited.returncode == 0, audited.stdout
    return tmp / "out"


def _with_files_of(night: Path, folder: Path, pairs: int) -> Path:
    """A copy of the night whose manifest's files list holds `pairs` pairs of an integer and its
    decimal text (0, "0", 1, "1", ...): items no sort orders and no two equal."""
    shutil.copytree(night, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"] = [item for i in range(pairs) for item in (i, str(i))]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_a_manifest_files_list_of_mixed_items_is_refused_in_linear_time(night, tmp_path):
    """The manifest schema's `files` says uniqueItems; jsonschema checks it by sorting, and
    items that do not sort (an integer beside a string) by comparing every pair: quadratic. A
    176 KB manifest of 16,000 such items takes the CLI's audit 15 CPU-s here; the 1 MiB the
    gate reads (MAX_MANIFEST_BYTES, ~150,000 items in compact JSON) ~20 minutes before the
    one-line flag. Refusing 8x the items must cost about 8x the CPU, not 64x (CPU time, the
    best of three for the small one: a wall-clock limit fails on a loaded machine)."""
    import time

    from kvtrace.transforms.stats.audit import _Gate, _manifest

    def refusal_cpu_s(pairs: int, tries: int) -> float:
        folder = _with_files_of(night, tmp_path / f"files-{pairs}", pairs)
        names = sorted(p.name for p in folder.iterdir())
        costs = []
        for _ in range(tries):
            gate = _Gate()
            start = time.process_time()
            assert _manifest(str(folder), names, False, gate) is None
            costs.append(time.process_time() - start)
            assert gate.flags
        return min(costs)

    small, large = refusal_cpu_s(500, 3), refusal_cpu_s(4_000, 1)
    assert large < 24 * max(small, 1e-3), (small, large)


def test_a_parquet_twin_larger_than_kvtraces_bytes_for_its_rows_is_never_read_whole(
    night, tmp_path
):
    """The audit reads a shard's Parquet twin whole (up to MAX_SHARD_BYTES, 2 GiB) before it
    parses the JSONL, then compares it with kvtrace's Parquet bytes for the JSONL's rows
    (parquet_forms: 2,229 bytes for these six rows). A sparse twin costs no disk: this 20 KB
    folder with a 256 MiB twin peaks at ~400 MB (512 MiB: 657 MB, 4 s; 2 GiB: ~2.2 GB), and a
    folder of many such shards (an empty JSONL each) is read for hours, one twin at a time. A
    file longer than every form of its rows is not kvtrace's bytes whatever it holds: it needs
    no reading past that length."""
    folder = tmp_path / "sparse-twin"
    shutil.copytree(night, folder)
    with open(folder / f"{SHARD}.parquet", "r+b") as twin:
        twin.truncate(256 << 20)  # a hole: no block is written
    code, peak_mb, _ = peak_rss_mb([sys.executable, "-m", "kvtrace.cli", "audit", str(folder)])
    assert code == 1
    assert peak_mb < 200, f"the audit of a six-row shard's 256 MiB twin peaked at {peak_mb} MB"


def test_a_shard_of_empty_objects_is_refused_within_the_documented_memory(night, tmp_path):
    """The byte screen (trace_format._screen) passes a line `{}`: 3 bytes, which pyarrow's JSON
    reader turns into a row of seven columns (~170 bytes at the peak, fill_null copies and the
    joined columns). A 10.5 MB JSONL shard of them peaks at ~600 MB (58x its bytes; 2 GiB, the
    shard bound, ~120 GB), where docs/BOUNDS.md's worst figure is 20 MB of one-digit ids at
    ~390 MB (10.5 MB of those peak at ~280 MB here). No row kvtrace writes is shorter than its
    four fields (~70 bytes): a shard must be refused at the cost of the ids' case at most."""
    folder = tmp_path / "empty-objects"
    shutil.copytree(night, folder)
    (folder / f"{SHARD}.jsonl").write_bytes(b"{}\n" * 3_500_000)
    code, peak_mb, _ = peak_rss_mb([sys.executable, "-m", "kvtrace.cli", "audit", str(folder)])
    assert code == 1
    assert peak_mb < 300, f"the audit of a 10.5 MB shard of {{}} rows peaked at {peak_mb} MB"
