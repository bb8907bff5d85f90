"""Red team round 4 (rt4-det): the id map. Each test asserts a promise and fails today."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from helpers import WORDS, anonymize_night, chat, trace_bytes, write_jsonl

pytestmark = pytest.mark.slow

ROUND4 = "red team round 4"
SALT = b"keyed-map-test-salt-of-32-bytes!"
DAY_MS = 86_400_000


def _night(folder: Path, day: int, n: int = 20, name: str = "night") -> Path:
    records = []
    for i in range(n):
        record = chat(i, day * DAY_MS + 1_000 + 611 * i, f"user-{day}-{i % 5}")
        words = random.Random(1000 * day + i).sample(WORDS, len(WORDS))
        record["messages"][1]["content"] = " ".join(words * 2) + f" {name} {day}"
        records.append(record)
    return write_jsonl(folder / f"{name}{day}.jsonl", records)


def _block_ids(out: Path) -> set[int]:
    return {h for line in trace_bytes(out).splitlines() for h in json.loads(line)["hash_ids"]}


def test_a_map_replaced_by_another_of_the_same_salt_is_refused_even_holding_the_marked_record(
    tiny_tokenizer, tmp_path
):
    """Promise (docs/ID_MAP.md 'Rollback'): with the map's files only (no salt, not the marks)
    'a map replaced by another of the same salt ... is refused'; the map must 'descend' from
    the marked version. check_anchor (anchor.py) only compares the bytes of
    versions/<marked>.json with the mark's sha256 and the current version with the marked
    number: nothing ties the current record to the marked one. So the map's files are replaced
    by another map of the same salt that has more versions (here a second map, four small
    nights, the last folding it), with the marked record file copied in at its number: the night reads the other
    map's newest version, passes the anchor, and numbers new blocks from that map's smaller
    next_id, reissuing ids the first map's traces published for other blocks."""
    (tmp_path / "salt").write_bytes(SALT)
    common = ["--salt-file", str(tmp_path / "salt")]
    map_dir, other = tmp_path / "map", tmp_path / "other-map"
    for day in range(3):  # the real map: versions 1..3, mark at 3
        assert (
            anonymize_night(
                tiny_tokenizer,
                [_night(tmp_path, day)],
                tmp_path / f"out{day}",
                "--id-map",
                str(map_dir),
                *common,
            )
            == 0
        )
    for day in range(4):  # another map of the same salt: four one-request nights, the last
        fold = ["--hash-shards", "32"] if day == 3 else []  # folding it (one segment folder)
        assert (
            anonymize_night(
                tiny_tokenizer,
                [_night(tmp_path, day, 1, "small")],
                tmp_path / f"small{day}",
                "--id-map",
                str(other),
                *fold,
                "--id-map-marks",
                str(tmp_path / "other-marks"),
                *common,
            )
            == 0
        )
    shutil.copytree(map_dir, tmp_path / "reference-map")  # night 3 on the untouched map
    # with its marks: a committed map that meets none is refused
    shutil.copytree(tmp_path / "salt.id-map-marks", tmp_path / "reference-marks")
    assert (
        anonymize_night(
            tiny_tokenizer,
            [_night(tmp_path, 3)],
            tmp_path / "expected",
            "--id-map",
            str(tmp_path / "reference-map"),
            "--id-map-marks",
            str(tmp_path / "reference-marks"),
            *common,
        )
        == 0
    )
    shutil.move(map_dir, tmp_path / "real-map")  # the swap: no salt needed
    shutil.copytree(other, map_dir)
    shutil.copy(tmp_path / "real-map" / "versions" / "000003.json", map_dir / "versions")
    for folder in (tmp_path / "real-map" / "segments").glob("000003-*"):  # what it lists
        shutil.copytree(folder, map_dir / "segments" / folder.name)
    code = anonymize_night(
        tiny_tokenizer, [_night(tmp_path, 3)], tmp_path / "out3", "--id-map", str(map_dir), *common
    )
    earlier = set().union(*(_block_ids(tmp_path / f"out{d}") for d in range(3)))
    new_ids = _block_ids(tmp_path / "out3") - _block_ids(tmp_path / "expected")
    assert code != 0 or trace_bytes(tmp_path / "out3") == trace_bytes(tmp_path / "expected"), (
        f"the swapped map passed its mark; the night gave ids {sorted(new_ids & earlier)[:5]}, "
        f"which the real map's traces published for other blocks, to its new blocks"
    )


def test_a_rollback_by_repointing_a_link_in_the_maps_path_is_refused(tiny_tokenizer, tmp_path):
    """Promise (docs/ID_MAP.md 'Rollback'; anchor.map_location): a map swapped for an older
    copy through a link is 'the same map to its readers, so it must meet the same mark'. Only
    the map's own link is kept; links in its parents are resolved (storage.place), so with the
    common layout `--id-map maps/current/map`, `current` a link to the live folder, whoever
    can write `maps/` repoints `current` at a copy of the map taken after night 1: the night
    looks for the mark of `maps/backup/map`, finds none, starts one, and numbers from version
    1's next_id, giving night 2's ids to other blocks (no salt, not the marks folder)."""
    (tmp_path / "salt").write_bytes(SALT)
    common = ["--salt-file", str(tmp_path / "salt")]
    maps = tmp_path / "maps"
    (maps / "live").mkdir(parents=True)
    (maps / "current").symlink_to(maps / "live")
    map_dir = maps / "current" / "map"
    assert (
        anonymize_night(
            tiny_tokenizer,
            [_night(tmp_path, 0)],
            tmp_path / "out0",
            "--id-map",
            str(map_dir),
            *common,
        )
        == 0
    )
    shutil.copytree(maps / "live", maps / "backup")  # a copy after night 1
    assert (
        anonymize_night(
            tiny_tokenizer,
            [_night(tmp_path, 1)],
            tmp_path / "out1",
            "--id-map",
            str(map_dir),
            *common,
        )
        == 0
    )
    shutil.copytree(maps / "live", tmp_path / "reference")  # night 3 on the untouched map
    # with its marks: a committed map that meets none is refused
    shutil.copytree(tmp_path / "salt.id-map-marks", tmp_path / "reference-marks")
    assert (
        anonymize_night(
            tiny_tokenizer,
            [_night(tmp_path, 2)],
            tmp_path / "expected",
            "--id-map",
            str(tmp_path / "reference" / "map"),
            "--id-map-marks",
            str(tmp_path / "reference-marks"),
            *common,
        )
        == 0
    )
    (maps / "current").unlink()  # the rollback: one link repointed
    (maps / "current").symlink_to(maps / "backup")
    code = anonymize_night(
        tiny_tokenizer, [_night(tmp_path, 2)], tmp_path / "out2", "--id-map", str(map_dir), *common
    )
    new_ids = _block_ids(tmp_path / "out2") - _block_ids(tmp_path / "expected")
    assert code != 0 or trace_bytes(tmp_path / "out2") == trace_bytes(tmp_path / "expected"), (
        f"night 3 ran on the map rolled back through its parent's link; it gave ids "
        f"{sorted(new_ids & _block_ids(tmp_path / 'out1'))[:5]}, published by night 2 for "
        f"other blocks, to its new blocks"
    )
