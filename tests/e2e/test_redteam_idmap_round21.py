"""Red team round 21, damaged id maps: reproducers of holes left after the twentieth round's
fixes. Each asserts the promised behaviour, so each fails until it is fixed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import (
    KVTRACE,
    MAP_NIGHT_ZERO_MS,
    MAP_SALT,
    ROOT,
    anonymize_night,
    map_night,
    map_of_nights,
    peak_rss_mb,
    write_jsonl,
)

pytestmark = pytest.mark.slow


def test_a_record_of_empty_lists_in_a_versions_place_is_refused_in_bounded_memory(
    tiny_tokenizer, tmp_path
):
    """Promise (brief, docs/BOUNDS.md 'JSON line's containers'): bad input is refused in one
    line within bounded memory; a damaged map is refused before any work. docs/ID_MAP.md, 'What
    a read checks, in order': a record is parsed (1: at most 256 MiB) before its MAC is checked
    (3), and map_record._parsed gives json.loads the whole record with no count of its
    containers, the rule every other JSON reader bounds its parse by (json_tree.containers_over:
    a container parses to ~64 bytes of Python for its 2-3 bytes of text). Whoever can write the
    map's files (no salt needed: the MAC is checked after) puts 48 MiB of `[],` in the newest
    version's place: the night peaks at ~1.4 GB (a one-night baseline is ~150 MB) before it
    refuses the MAC; at the 256 MiB the read allows, ~7.5 GB; under a memory limit it ends 'the
    job failed: MemoryError' (exit 1), not the refusal. The same parse opens the map in `kvtrace
    audit --id-map`, `id-map rebind` and `id-map upgrade`."""
    common = map_of_nights(tiny_tokenizer, tmp_path, 2)
    newest = tmp_path / "map" / "versions" / "000002.json"
    lists = (48 << 20) // 3
    newest.write_bytes(
        b'{"format":"kvtrace-id-map","format_version":7,"x":[' + b"[]," * lists + b"[]]}\n"
    )
    night = map_night(tmp_path, 2)
    code, peak, stderr = peak_rss_mb(
        [*KVTRACE, "anonymize", "--input", str(night), "--tokenizer", tiny_tokenizer]
        + ["--block-size", "4", "--output", str(tmp_path / "out2"), "--quiet", *common]
    )
    assert code == 2, stderr
    assert "000002.json" in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert peak < 500, f"peak RSS {peak} MB for a 48 MiB record"
    assert not (tmp_path / "out2").exists()


def test_a_dangling_link_in_the_next_versions_place_is_refused_as_the_map_opens(
    tiny_tokenizer, tmp_path
):
    """Promise (docs/ID_MAP.md, docs/BOUNDS.md 'id map file read'): a damaged map is refused in
    one line naming the file before any work; a link or folder in a map file's place is refused
    as such. But id_map._committed_versions lists versions/ through storage.files_in, which
    keeps regular files only: a dangling link (or a folder) named versions/000003.json, which
    kvtrace never writes, is invisible as the map opens. The night does all its work, then
    exclusive.create_exclusive's link(2) finds the name taken and the night is told 'the id map
    was extended by another run while this one ran ... Run the night again': every rerun does
    the work again and ends so, and nothing names the file to remove."""
    common = map_of_nights(tiny_tokenizer, tmp_path, 2)
    (tmp_path / "map" / "versions" / "000003.json").symlink_to(tmp_path / "nowhere")
    night = map_night(tmp_path, 2)
    code, _, stderr = peak_rss_mb(
        [*KVTRACE, "anonymize", "--input", str(night), "--tokenizer", tiny_tokenizer]
        + ["--block-size", "4", "--output", str(tmp_path / "out2"), "--quiet", *common]
    )
    assert code == 2, stderr  # refused as the map opens, as a link elsewhere in the map is
    assert "versions/000003.json" in stderr, stderr
    assert "extended by another run" not in stderr
    assert not (tmp_path / "out2").exists()


def test_a_map_missing_a_listed_segment_folder_is_not_extended(tiny_tokenizer, tmp_path):
    """Promise (brief, docs/ID_MAP.md): a damaged map is refused in one line, never silently
    extended; 'Deleting files is noticed'. But a night checks a segment file only if it reads
    it (segments.read_matching, for the hash shards its keys fall in), and as the map opens
    id_map.finish_interrupted_commit 'rolls forward' a commit that was never interrupted: for
    each folder the newest record lists with no COMMITTED mark, storage.create makes the folder
    again and marks it. So with version 1's whole segment folder deleted (files the newest
    version still lists), the next night whose keys fall in other shards recreates the folder,
    empty but for COMMITTED, publishes, and commits version 3 listing files that are gone: the
    damage is carried into a new version, and backups from before it are now rollbacks."""
    common = map_of_nights(tiny_tokenizer, tmp_path, 2)
    (first,) = (tmp_path / "map" / "segments").glob("000001-*")
    listed = sorted(p.name for p in first.iterdir())
    assert any(name.endswith(".parquet") for name in listed)
    for path in first.iterdir():
        path.unlink()
    first.rmdir()
    assert (
        anonymize_night(tiny_tokenizer, [map_night(tmp_path, 2)], tmp_path / "out2", *common) != 0
    )
    assert not (tmp_path / "map" / "versions" / "000003.json").exists()
    assert not (tmp_path / "out2" / "manifest.json").exists()


# A child running the CLI with the map folded every 2 nights instead of every 32
# (id_map.MAX_SEGMENTS): the folding night's code path, reached without 32 nights.
_FOLDING_EVERY_2_NIGHTS = (
    "import sys\n"
    "from kvtrace.transforms.ids import id_map\n"
    "id_map.MAX_SEGMENTS = 2\n"
    "from kvtrace.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def test_a_folding_night_reads_no_segment_footer_before_it_is_verified(tiny_tokenizer, tmp_path):
    """Promise (brief; docs/ID_MAP.md 'What a read checks', 6): bounded memory when reading a
    map of huge claimed sizes; a segment file is read unit by unit, its size and footer checked
    against the record before Parquet decodes anything. But a folding night (every
    MAX_SEGMENTS = 32 nights) calls segments.merge_segment, whose first step, _row_count, opens
    every earlier segment file of the shard with pq.ParquetFile(handle): an unverified file of
    any size, its footer length read from its own last bytes. A listed segment file replaced
    (no salt needed) by a sparse 1 GiB file (8 KB on disk) ending in a footer length of ~1 GiB
    makes Arrow read and try to parse ~1 GiB: the night peaks at ~1.2 GB (3 GiB: 3.3 GB, 11 s)
    and ends 'the job failed: Couldn't deserialize thrift', never the one-line damage refusal
    naming the file (and a crafted footer reaches Arrow's parser, which docs/BOUNDS.md records
    aborting the process on one byte)."""
    common = map_of_nights(tiny_tokenizer, tmp_path, 2)
    segments = sorted((tmp_path / "map" / "segments").glob("*/blocks-*.parquet"))
    victim = segments[0]
    size = 1 << 30
    with open(victim, "r+b") as handle:
        handle.truncate(size)
        handle.seek(size - 8)
        handle.write((size - 16).to_bytes(4, "little") + b"PAR1")
    night = map_night(tmp_path, 2)
    code, peak, stderr = peak_rss_mb(
        [sys.executable, "-c", _FOLDING_EVERY_2_NIGHTS, "anonymize", "--input", str(night)]
        + ["--tokenizer", tiny_tokenizer, "--block-size", "4", "--output", str(tmp_path / "out2")]
        + ["--quiet", *common]
    )
    assert peak < 600, f"peak RSS {peak} MB for a segment file of 8 KB on disk"
    assert code != 0, stderr
    assert "damaged" in stderr and victim.name in stderr, stderr
    assert not (tmp_path / "map" / "versions" / "000003.json").exists()


def _newest_folder_unmarked(tmp_path: Path) -> Path:
    """The COMMITTED mark of the newest version's segment folder, removed: what a run killed
    between its commit and its marks leaves, and any writer of the map's files can make."""
    (newest,) = (tmp_path / "map" / "segments").glob("000002-*")
    mark = newest / "COMMITTED"
    mark.unlink()
    return mark


def test_a_fifo_in_a_committed_marks_place_is_one_line_not_a_hang(tiny_tokenizer, tmp_path):
    """Promise (brief; docs/BOUNDS.md 'id map file read': a FIFO in a map file's place is
    refused in one line; round 6 made every read of the map do so): never a hang. But as the
    map opens, id_map.finish_interrupted_commit writes the COMMITTED mark of each folder the
    newest record lists that has none (storage.files_in lists regular files only, so a FIFO
    named COMMITTED is 'none') with storage.create: open(O_WRONLY|O_CREAT) on the FIFO, which
    waits for a reader forever. Every night then hangs before any work."""
    common = map_of_nights(tiny_tokenizer, tmp_path, 2)
    os.mkfifo(_newest_folder_unmarked(tmp_path))
    command = [*KVTRACE, "anonymize", "--input", str(map_night(tmp_path, 2))]
    command += ["--tokenizer", tiny_tokenizer, "--block-size", "4"]
    command += ["--output", str(tmp_path / "out2"), "--quiet", *common]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("the night hung on a FIFO named COMMITTED in the id map")
    assert done.returncode != 0 and "COMMITTED" in done.stderr, done.stderr


def test_a_link_in_a_committed_marks_place_makes_no_file_outside_the_map(tiny_tokenizer, tmp_path):
    """Promise (docs/BOUNDS.md 'id map file read': a link in a map file's place is refused,
    its own link not followed; docs/ID_MAP.md: whoever writes only the map's files cannot make
    a run act elsewhere). The same write follows a dangling link named COMMITTED: the night
    creates an empty owner-only file wherever the link points (any path the run's user may
    write: another map's next version, a name a later step expects free) and publishes."""
    common = map_of_nights(tiny_tokenizer, tmp_path, 2)
    outside = tmp_path / "elsewhere" / "made-by-the-night"
    outside.parent.mkdir()
    _newest_folder_unmarked(tmp_path).symlink_to(outside)
    anonymize_night(tiny_tokenizer, [map_night(tmp_path, 2)], tmp_path / "out2", *common)
    assert not outside.exists()


def test_a_link_in_place_of_segments_deletes_no_other_maps_files(tiny_tokenizer, tmp_path):
    """Promise (docs/ID_MAP.md 'What this gives': whoever can write the map's files only can
    deny that map, nothing more; docs/BOUNDS.md: a link in a map file's place is refused). As
    the map opens, map_opening.open_repaired_map runs id_map.discard_abandoned, which lists
    segments/ with storage.files_in (os.walk: a link at the top is followed) and deletes every
    file of a folder NNNNNN-* whose version's record does not list it, before any segment file
    is read. With the map's segments/ replaced by a link to another map's segments/ (a map of
    the same operator its writer cannot write), the night deletes that map's every segment
    file and leaves COMMITTED-only folders there; only then does it fail on its own files."""
    common = map_of_nights(tiny_tokenizer, tmp_path / "attacked", 2)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "salt").write_bytes(MAP_SALT)
    flags = ["--id-map", str(victim / "map"), "--id-map-marks", str(victim / "marks")]
    flags += ["--salt-file", str(victim / "salt")]
    other = write_jsonl(
        victim / "night.jsonl",
        [
            {
                "timestamp": MAP_NIGHT_ZERO_MS,
                "output_length": 5,
                "messages": [{"role": "user", "content": "a b"}],
            }
        ],
    )
    assert anonymize_night(tiny_tokenizer, [other], victim / "out", *flags) == 0
    kept = sorted((victim / "map" / "segments").glob("*/*.parquet"))
    assert kept
    segments = tmp_path / "attacked" / "map" / "segments"
    segments.rename(segments.with_name("segments.moved"))
    segments.symlink_to(victim / "map" / "segments")
    night = map_night(tmp_path, 2)
    anonymize_night(tiny_tokenizer, [night], tmp_path / "attacked" / "out2", *common)
    assert all(path.exists() for path in kept)
