"""Red team round 3 (t33-rt3-det): the id map. Each test asserts a promise and fails today."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from helpers import WORDS, anonymize_night, chat, trace_bytes, write_jsonl
from kvtrace.cli import main
from kvtrace.transforms.ids import map_record
from kvtrace.transforms.ids.map_record import keyless_checksum, record_bytes

pytestmark = pytest.mark.slow

SALT = b"keyed-map-test-salt-of-32-bytes!"
DAY_MS = 86_400_000


def _night(folder: Path, day: int) -> Path:
    records = []
    for i in range(20):
        record = chat(i, day * DAY_MS + 1_000 + 611 * i, f"user-{day}-{i % 5}")
        words = random.Random(1000 * day + i).sample(WORDS, len(WORDS))
        record["messages"][1]["content"] = " ".join(words * 2)
        records.append(record)
    return write_jsonl(folder / f"night{day}.jsonl", records)


def _block_ids(out: Path) -> set[int]:
    return {h for line in trace_bytes(out).splitlines() for h in json.loads(line)["hash_ids"]}


def test_upgrade_does_not_key_a_forged_format_3_version_on_top_of_a_keyed_map(
    tiny_tokenizer, tmp_path
):
    """Promise (docs/ID_MAP.md 'Format 3 maps', 'Rollback'): with the map's files only (no salt,
    not the marks) no edit goes unnoticed and a rollback is refused; on a keyed map `kvtrace
    id-map upgrade` 'only verifies the newest record and the mark and anchors it'. Yet anyone
    who can write the map can append versions/000002.json in format 3 (a sha256 of its own,
    next_id reset to 0, no files; the salt fingerprint is public in version 1). The night then
    fails with 'key it once with its salt (kvtrace id-map upgrade ...)'; the upgrade it asks
    for keys the forged record (key_format_3_map keys every format-3 record, even above a keyed
    one), anchors it, and the next night numbers from 0: ids night 1 published for other
    blocks are reissued."""
    (tmp_path / "salt").write_bytes(SALT)
    common = ["--salt-file", str(tmp_path / "salt")]
    map_dir = tmp_path / "map"
    nights = [_night(tmp_path, day) for day in range(2)]
    assert (
        anonymize_night(
            tiny_tokenizer, [nights[0]], tmp_path / "out0", "--id-map", str(map_dir), *common
        )
        == 0
    )
    v1 = json.loads((map_dir / "versions" / "000001.json").read_bytes())
    assert v1["format_version"] == map_record.FORMAT_VERSION
    forged = {k: v for k, v in v1.items() if k not in ("mac", "timestamp_kind")}
    zero = {"blocks": 0, "sessions": 0}
    forged |= {
        "format_version": map_record.KEYLESS_FORMAT,
        "version": 2,
        "next_id": zero,
        "files": {"blocks": [], "sessions": []},
        "checksums": {},
        "history": [
            {"version": 1, "added": zero, "compacted": False},
            {"version": 2, "added": zero, "compacted": True},
        ],
    }
    (map_dir / "versions" / "000002.json").write_bytes(
        record_bytes(forged | {"sha256": keyless_checksum(forged)})
    )
    (map_dir / "CURRENT").write_text('{"version": 2}\n')
    upgraded = main(["id-map", "upgrade", str(map_dir), "--salt-file", str(tmp_path / "salt")])
    code = anonymize_night(
        tiny_tokenizer, [nights[1]], tmp_path / "out1", "--id-map", str(map_dir), *common
    )
    reissued = code == 0 and bool(_block_ids(tmp_path / "out1") & _block_ids(tmp_path / "out0"))
    assert upgraded != 0 and not reissued, (
        f"upgrade exit {upgraded}; night 2 exit {code}: a forged format-3 version was keyed and "
        f"anchored, and the map numbered from 0 again"
    )


def test_the_mark_never_moves_back_when_a_later_night_commits_during_its_write(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise (docs/ID_MAP.md 'Rollback'): the mark anchors the newest version published; a
    map rolled back behind it is refused. advance_anchor reads the mark, then replaces it
    unconditionally: night A commits version 2 and reads the mark (version 1); night B, begun
    once version 2 was visible, commits version 3 and marks it; A then writes its mark of
    version 2 over B's. The mark has moved back: the map rolled back to version 2 (version 3's
    record and segments deleted, no salt needed) is extended by night 4, which gives new
    blocks the ids night 3 published for others."""
    import shutil

    from kvtrace.transforms.ids import anchor, id_map

    (tmp_path / "salt").write_bytes(SALT)
    common = ["--salt-file", str(tmp_path / "salt")]
    map_dir = tmp_path / "map"
    nights = [_night(tmp_path, day) for day in range(4)]
    assert (
        anonymize_night(
            tiny_tokenizer, [nights[0]], tmp_path / "out0", "--id-map", str(map_dir), *common
        )
        == 0
    )
    original_read, original_advance = anchor.read_mark, id_map.advance_anchor
    state = {"advances": 0, "interleave": False}

    def advance(*args):
        state["advances"] += 1
        state["interleave"] = state["advances"] == 1  # night A's, after its commit
        return original_advance(*args)

    def read_mark(*args):
        mark = original_read(*args)
        if state["interleave"]:
            state["interleave"] = False  # night B runs between A's read and A's write
            assert (
                anonymize_night(
                    tiny_tokenizer,
                    [nights[2]],
                    tmp_path / "out2",
                    "--id-map",
                    str(map_dir),
                    *common,
                )
                == 0
            )
        return mark

    monkeypatch.setattr(id_map, "advance_anchor", advance)
    monkeypatch.setattr(anchor, "read_mark", read_mark)
    assert (
        anonymize_night(
            tiny_tokenizer, [nights[1]], tmp_path / "out1", "--id-map", str(map_dir), *common
        )
        == 0
    )
    monkeypatch.undo()
    assert id_map.current_version_number(str(map_dir)) == 3
    shutil.copytree(map_dir, tmp_path / "reference-map")  # night 4 on the untouched map
    # with its marks: a committed map that meets none is refused
    shutil.copytree(tmp_path / "salt.id-map-marks", tmp_path / "reference-marks")
    assert (
        anonymize_night(
            tiny_tokenizer,
            [nights[3]],
            tmp_path / "expected",
            "--id-map",
            str(tmp_path / "reference-map"),
            "--id-map-marks",
            str(tmp_path / "reference-marks"),
            *common,
        )
        == 0
    )
    (map_dir / "versions" / "000003.json").unlink()  # the rollback: no salt needed
    for folder in (map_dir / "segments").glob("000003-*"):
        shutil.rmtree(folder)
    (map_dir / "CURRENT").write_text('{"version": 2}\n')
    code = anonymize_night(
        tiny_tokenizer, [nights[3]], tmp_path / "out3", "--id-map", str(map_dir), *common
    )
    mixed = (
        (_block_ids(tmp_path / "out3") & _block_ids(tmp_path / "out2"))
        - _block_ids(tmp_path / "out1")
        - _block_ids(tmp_path / "out0")
    )
    clash = code == 0 and trace_bytes(tmp_path / "out3") != trace_bytes(tmp_path / "expected")
    assert not (clash and mixed), (
        f"the mark moved back to version 2; a rollback went through, ids {sorted(mixed)[:5]} "
        f"of night 3 reissued"
    )
