"""Red team round 22, damaged id maps: reproducers of holes left after the twenty-first round's
fixes. Each asserts the promised behaviour, so each fails until it is fixed."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import KVTRACE, map_night, map_of_nights, peak_rss_mb

pytestmark = pytest.mark.slow


def _third_night(tokenizer: str, tmp_path: Path, common: list[str]) -> tuple[int, int, str]:
    """(exit code, peak RSS in MB, stderr) of the map's next night, run as a command."""
    command = [*KVTRACE, "anonymize", "--input", str(map_night(tmp_path, 2))]
    command += ["--tokenizer", tokenizer, "--block-size", "4"]
    return peak_rss_mb(command + ["--output", str(tmp_path / "out2"), "--quiet", *common])


def test_a_record_of_short_strings_in_a_versions_place_is_refused_in_bounded_memory(
    tiny_tokenizer, tmp_path
):
    """Promise (brief: bounded memory when reading a map of huge claimed sizes; map_record.
    read_record: 'what an unkeyed writer puts in a version's place costs its bytes to read,
    never their parse'). Round 21's fix bounds an unverified record's parse by its containers
    only (MAX_RECORD_CONTAINERS); when the MAC fails, map_record._unverified still parses the
    whole record (_parsed -> json.loads) to say why. Its scalars are not bounded: a string
    `"ab",` is 5 bytes of text and ~60 bytes of Python. Whoever can write the map's files (no
    salt) puts 48 MiB of them, in one list, in the newest version's place: the night peaks at
    ~940 MB (a clean night ~146 MB) before its one-line refusal; at the 256 MiB a record may
    be, ~5 GB. The same parse runs in every command that opens a map (audit --id-map, id-map
    rebind and upgrade) and for any version below the newest once the chain breaks."""
    common = map_of_nights(tiny_tokenizer, tmp_path, 2)
    newest = tmp_path / "map" / "versions" / "000002.json"
    strings = (48 << 20) // 5
    newest.write_bytes(
        b'{"format":"kvtrace-id-map","format_version":7,"x":[' + b'"ab",' * strings + b'"ab"]}\n'
    )
    code, peak, stderr = _third_night(tiny_tokenizer, tmp_path, common)
    assert code == 2, stderr
    assert "000002.json" in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert peak < 500, f"peak RSS {peak} MB for a 48 MiB record"
    assert not (tmp_path / "out2").exists()


@pytest.mark.parametrize("part", ["footer", "index"])
def test_a_listed_segment_file_damaged_in_place_is_not_carried_into_the_next_version(
    tiny_tokenizer, tmp_path, part
):
    """Promise (brief: a damaged map is refused in one line, never silently extended;
    id_map.check_listed_files: 'A night reads only the shards its keys fall in, so damage
    elsewhere would otherwise be carried into the next version'). Round 21's fix checks each
    listed file by one lstat: present, a regular file, its recorded size. A segment file
    damaged in place (a bit flipped: disk rot, a bad copy, or any writer of the map's files)
    keeps its size, so a night whose keys fall in other shards never reads it: it publishes
    and commits version 3 listing the damaged file under its old checksum. The damage is
    found only by the first night whose keys reach that shard, or at the latest by the next
    folding night (every MAX_SEGMENTS = 32 nights reads every file), up to a month later, when
    backups from before it may have rotated away (the map is then lost) and each night in
    between committed a version over it; the same goes for a damaged index or a segment file
    swapped with another of the same size.

    Fixed (round 22, id_map.check_carried_files): before a commit lists a file again, its
    index is verified by its sha256 and its footer by its recorded digest (small reads); a
    row group damaged with its footer intact is found when read, the window docs/BOUNDS.md
    accepts. So the damage here is to what the commit checks: the footer, or the index."""
    common = map_of_nights(tiny_tokenizer, tmp_path, 2)
    (segment,) = (tmp_path / "map" / "segments").glob("000001-*/blocks-00012.parquet")
    victim = segment if part == "footer" else segment.with_name("blocks-00012.index.npz")
    data = bytearray(victim.read_bytes())
    data[-9 if part == "footer" else 100] ^= 0xFF  # the footer's last byte before its length
    victim.write_bytes(bytes(data))
    code, _, stderr = _third_night(tiny_tokenizer, tmp_path, common)
    assert code != 0, stderr
    assert victim.name in stderr, stderr
    assert not (tmp_path / "map" / "versions" / "000003.json").exists()
    # Refused before the night's segments settle: none moved into a version's folder.
    assert not list((tmp_path / "map" / "segments").glob("000003-*"))
    assert not (tmp_path / "out2" / "manifest.json").exists()
