"""Block hashes are staged beside their folder as the shards are written and published (one
rename, owner-only) only after the output they belong to, saying which output that is."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from kvtrace.transforms.trace_format import canonical_json
from kvtrace.transforms.write.publish import STAGING_MARK, OutputRefused
from kvtrace.transforms.write.rows import ROW, RowBatch
from kvtrace.transforms.write.shards import (
    BLOCK_HASHES_OUTPUT,
    block_hashes_staging,
    check_block_hashes_folder,
    publish_block_hashes,
    write_shard,
)

MANIFEST = {"format": "mooncake-trace", "records": {"exported": 2}}


def _batch() -> RowBatch:
    rows = np.zeros(2, dtype=ROW)
    rows["num_ids"] = [2, 1]
    return RowBatch(rows, np.array([0, 1, 2]), np.array([11, 12, 13], dtype=np.uint64))


def _run(tmp_path: Path, hashes: Path, shards: int = 1, run: str = "a") -> str:
    """A run's shards written: the output into its staging folder, the hashes into theirs."""
    output_staging = str(tmp_path / f".out{STAGING_MARK}{run}")
    for shard in range(shards):
        write_shard(
            output_staging,
            shard,
            shards,
            [_batch()],
            0,
            hashes_directory=block_hashes_staging(str(hashes), output_staging),
        )
    return output_staging


def test_the_staging_folder_is_beside_the_hashes_hidden_and_one_runs(tmp_path):
    hashes = str(tmp_path / "hashes")
    first = block_hashes_staging(hashes, str(tmp_path / ".out.kvtrace-staging-a"))
    assert os.path.dirname(first) == str(tmp_path)  # one rename publishes it
    assert os.path.basename(first).startswith(f".hashes{STAGING_MARK}")
    assert first == block_hashes_staging(hashes, str(tmp_path / ".out.kvtrace-staging-a"))
    assert first != block_hashes_staging(hashes, str(tmp_path / ".out.kvtrace-staging-b"))
    assert block_hashes_staging(None, "x") is None


def test_nothing_reaches_the_folder_before_it_is_published(tmp_path):
    hashes = tmp_path / "hashes"
    staging = _run(tmp_path, hashes)
    assert not hashes.exists()
    publish_block_hashes(str(hashes), staging, MANIFEST)
    assert sorted(p.name for p in hashes.iterdir()) == [
        "block-hashes-00000-of-00001.parquet",
        BLOCK_HASHES_OUTPUT,
    ]
    assert pq.read_table(hashes / "block-hashes-00000-of-00001.parquet")["hash"].to_pylist() == [
        11,
        12,
        13,
    ]
    assert not list(tmp_path.glob(f".hashes{STAGING_MARK}*"))  # the staging folder became it


def test_the_published_folder_is_owner_only_and_names_its_output(tmp_path):
    hashes = tmp_path / "hashes"
    publish_block_hashes(str(hashes), _run(tmp_path, hashes), MANIFEST)
    for path in (hashes, *hashes.iterdir()):
        assert path.stat().st_mode & 0o077 == 0, path
    # as `sha256sum -c` checks it inside the output folder
    assert (
        hashes / BLOCK_HASHES_OUTPUT
    ).read_text() == f"{hashlib.sha256(canonical_json(MANIFEST)).hexdigest()}  manifest.json\n"


def test_an_earlier_runs_hashes_are_replaced_whole(tmp_path):
    hashes = tmp_path / "hashes"
    publish_block_hashes(str(hashes), _run(tmp_path, hashes, shards=3, run="a"), MANIFEST)
    publish_block_hashes(str(hashes), _run(tmp_path, hashes, shards=1, run="b"), MANIFEST)
    assert sorted(p.name for p in hashes.iterdir()) == [
        "block-hashes-00000-of-00001.parquet",
        BLOCK_HASHES_OUTPUT,
    ]


def test_none_publishes_nothing(tmp_path):
    assert publish_block_hashes(None, str(tmp_path / "s"), MANIFEST) is MANIFEST
    assert list(tmp_path.iterdir()) == []


def test_a_folder_holding_what_kvtrace_did_not_write_is_refused_before_the_work(tmp_path):
    hashes = tmp_path / "hashes"
    check_block_hashes_folder(str(hashes))  # new
    hashes.mkdir()
    check_block_hashes_folder(str(hashes))  # empty
    publish_block_hashes(str(hashes), _run(tmp_path, hashes), MANIFEST)
    check_block_hashes_folder(str(hashes))  # an earlier run's
    victim = tmp_path / "victim"
    victim.write_text("someone's")
    (hashes / "block-hashes-00000-of-00001.parquet").unlink()
    (hashes / "block-hashes-00000-of-00001.parquet").symlink_to(victim)
    with pytest.raises(OutputRefused, match="block-hashes-00000-of-00001.parquet"):
        check_block_hashes_folder(str(hashes))
    (hashes / "block-hashes-00000-of-00001.parquet").unlink()
    (hashes / "notes.txt").write_text("")
    with pytest.raises(OutputRefused, match=r"--emit-block-hashes .* \(notes\.txt\)"):
        check_block_hashes_folder(str(hashes))
    assert victim.read_text() == "someone's"
    (tmp_path / "link").symlink_to(hashes)  # a swap would move the link, not its folder
    with pytest.raises(OutputRefused, match="is a link"):
        check_block_hashes_folder(str(tmp_path / "link"))


def test_the_block_hashes_staging_of_an_output_whose_name_is_not_utf8_is_named(tmp_path):
    """Linux names are bytes: b'night\\xff' reaches Python as a surrogate, which .encode()
    refuses; its block hashes stage by the name's bytes, one name per output staging."""
    hashes = str(tmp_path / "hashes")
    odd = os.fsdecode(os.fsencode(str(tmp_path)) + b"/.night\xff.kvtrace-staging-a")
    other = os.fsdecode(os.fsencode(str(tmp_path)) + b"/.night\xfe.kvtrace-staging-a")
    staged = block_hashes_staging(hashes, odd)
    assert staged.startswith(str(tmp_path / ".hashes.kvtrace-staging-"))
    assert staged != block_hashes_staging(hashes, other)
