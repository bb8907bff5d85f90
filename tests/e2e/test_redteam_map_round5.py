"""Red team round 5 (rt5-det): the id map. Each test asserts a promise and fails today."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from helpers import WORDS, anonymize_night, chat, trace_bytes, write_jsonl
from kvtrace.cli import main

pytestmark = pytest.mark.slow

ROUND5 = "red team round 5"
SALT = b"keyed-map-test-salt-of-32-bytes!"
DAY_MS = 86_400_000
ZERO = 1_700_000_000_000


def _one_request(folder: Path, name: str, prompt: str, day: int = 0) -> Path:
    return write_jsonl(
        folder / f"{name}.jsonl",
        [
            {
                "timestamp": ZERO + day * DAY_MS,
                "output_length": 5,
                "messages": [{"role": "user", "content": prompt}],
            }
        ],
    )


def _map_id(map_dir: Path) -> str:
    return json.loads((map_dir / "versions" / "000001.json").read_bytes())["map_id"]


def test_two_maps_of_other_logs_get_other_ids_and_both_publish(tiny_tokenizer, tmp_path):
    """Promise (docs/ID_MAP.md 'Version record'; id_map.map_id_of): the map id is derived from
    the salt, the base record and the first night's identity so that 'maps of other nights or
    salts get other ids'; only 'two maps grown from the same first night' are one map. But the
    night's identity is the digest of what it PUBLISHES (dense first-seen ids, lengths, times
    from the origin), not of its keys: two maps of one salt file (the default folder of marks
    beside it) whose first nights are other prompts of the same shape (here one request each,
    same token count: a smoke test, a new tenant's first night) get the same map id and meet
    one mark. The second map's first night commits its version 1, then advance_anchor refuses
    it ('the map was replaced while it ran', which it was not): nothing published, and every
    rerun or later night of that map is refused the same way (or, once the first map is
    ahead, as a rollback). A map of other keys is bricked by an unrelated map."""
    (tmp_path / "salt").write_bytes(SALT)
    common = ["--salt-file", str(tmp_path / "salt")]
    first = _one_request(tmp_path, "tenant-a", "the quick brown fox jumps over the lazy dog")
    other = _one_request(tmp_path, "tenant-b", "hello world again the dog is lazy and quick")
    assert (
        anonymize_night(
            tiny_tokenizer, [first], tmp_path / "a0", "--id-map", str(tmp_path / "map-a"), *common
        )
        == 0
    )
    code = anonymize_night(
        tiny_tokenizer, [other], tmp_path / "b0", "--id-map", str(tmp_path / "map-b"), *common
    )
    assert code == 0 and trace_bytes(tmp_path / "b0"), (
        f"map-b's first night was refused (map-a's id {_map_id(tmp_path / 'map-a')}, map-b's "
        f"{_map_id(tmp_path / 'map-b')}): two maps of other keys share one id and one mark"
    )
    later = _one_request(tmp_path, "tenant-b-1", "over and over again", day=1)
    assert (
        anonymize_night(
            tiny_tokenizer, [later], tmp_path / "b1", "--id-map", str(tmp_path / "map-b"), *common
        )
        == 0
    )


def _night(folder: Path, day: int, n: int = 20) -> Path:
    records = []
    for i in range(n):
        record = chat(i, ZERO + day * DAY_MS + 1_000 + 611 * i, f"user-{day}-{i % 5}")
        words = random.Random(1000 * day + i).sample(WORDS, len(WORDS))
        record["messages"][1]["content"] = " ".join(words * 2) + f" night {day}"
        records.append(record)
    return write_jsonl(folder / f"night{day}.jsonl", records)


def _block_ids(out: Path) -> set[int]:
    return {h for line in trace_bytes(out).splitlines() for h in json.loads(line)["hash_ids"]}


def test_a_map_removed_by_repointing_a_link_in_its_path_is_refused(tiny_tokenizer, tmp_path):
    """Promise (docs/ID_MAP.md 'Rollback'): with the map's files only (no salt, not the marks),
    a rollback 'through a link in the map's path' is refused, and deleting files 'is noticed
    (missing versions, the mark)'. Round 4's repoint to a backup copy now meets the map's mark
    (named by its id). But repoint the link to an empty folder: the run finds no map (version
    0, no id), so no mark is looked up, and the place (links in the parents resolved,
    anchor.map_location) is a new one with no place file: check_anchor passes and the night
    starts a new map, numbering its blocks from 0 again, ids nights 1-2 published for other
    blocks. Whoever can write maps/ (not the map, not the marks) does it with one link."""
    (tmp_path / "salt").write_bytes(SALT)
    common = ["--salt-file", str(tmp_path / "salt")]
    maps = tmp_path / "maps"
    (maps / "live").mkdir(parents=True)
    (maps / "current").symlink_to(maps / "live")
    map_dir = maps / "current" / "map"
    for day in range(2):
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
    (maps / "empty").mkdir()
    (maps / "current").unlink()  # the map's link in its path now leads to no map
    (maps / "current").symlink_to(maps / "empty")
    code = anonymize_night(
        tiny_tokenizer, [_night(tmp_path, 2)], tmp_path / "out2", "--id-map", str(map_dir), *common
    )
    published = _block_ids(tmp_path / "out0") | _block_ids(tmp_path / "out1")
    reused = sorted(_block_ids(tmp_path / "out2") & published) if code == 0 else []
    assert code != 0, (
        f"night 3 ran on no map (its path's link repointed) and published as a new map's "
        f"first night: block ids {reused[:8]}..., which nights 1-2 published for other blocks"
    )


def _tenant_night(folder: Path, name: str, day: int, n: int = 20) -> Path:
    records = []
    for i in range(n):
        record = chat(i, ZERO + day * DAY_MS + 1_000 + 611 * i, f"user-{day}-{i % 5}")
        words = random.Random(f"{name}-{day}-{i}").sample(WORDS, len(WORDS))
        record["messages"][1]["content"] = " ".join(words * 2) + f" {name} {day}"
        records.append(record)
    return write_jsonl(folder / f"{name}{day}.jsonl", records)


def test_the_gate_confirms_no_night_of_another_map_spliced_into_the_map(tiny_tokenizer, tmp_path):
    """Promise (docs/ID_MAP.md 'What the gate confirms', 'Rollback'): `audit --id-map` passes a
    night's id_map 'only as the night a version recorded', confirming its references to the
    map's earlier ids 'by the map alone'; with the map's files only (no salt, not the marks) 'no
    edit of a record ... goes unnoticed'. The records form a previous_sha256 chain, but the gate
    (audit.map_numbering) reads each version's record on its own: MAC'd, its number right, never
    linked to the record above it, nor the map to its mark. So version 2 of map A is replaced by
    version 2 of map B (same salt, another tenant's map): the gate then passes B's second night
    as a night of map A (its ids below block_ids_from are B's blocks, not A's), and refuses A's
    own second night."""
    (tmp_path / "salt").write_bytes(SALT)
    common = ["--salt-file", str(tmp_path / "salt")]
    for day in range(3):
        assert (
            anonymize_night(
                tiny_tokenizer,
                [_tenant_night(tmp_path, "a", day)],
                tmp_path / f"a{day}",
                "--id-map",
                str(tmp_path / "map-a"),
                *common,
            )
            == 0
        )
    for day in range(2):
        assert (
            anonymize_night(
                tiny_tokenizer,
                [_tenant_night(tmp_path, "b", day)],
                tmp_path / f"b{day}",
                "--id-map",
                str(tmp_path / "map-b"),
                "--id-map-marks",
                str(tmp_path / "marks-b"),
                *common,
            )
            == 0
        )
    shutil.copy(
        tmp_path / "map-b" / "versions" / "000002.json",
        tmp_path / "map-a" / "versions" / "000002.json",
    )  # the splice: no salt needed

    def audit(night: str) -> int:
        return main(
            [
                "audit",
                str(tmp_path / night),
                "--id-map",
                str(tmp_path / "map-a"),
                "--tokenizer",
                tiny_tokenizer,
                *common,
            ]
        )

    assert audit("b1") != 0, "the gate passed map B's night as a night of map A"
    assert audit("a1") == 0


def test_a_map_replaced_by_another_maps_copy_is_refused_when_their_first_nights_look_alike(
    tiny_tokenizer, tmp_path
):
    """Promise (docs/ID_MAP.md 'Rollback'): with the map's files only (no salt, not the marks),
    'a map replaced by another of the same salt ... is refused': the place is bound to its
    map's id and the map must descend from its id's mark. Two maps of one salt file whose first
    nights publish the same bytes (here one request each, other words, same token count) get
    one id (map_id_of derives it from what the night publishes, not from its keys): map B's
    place is bound to map A's id and mark. Map A is at version 2 when B's first night commits,
    so B publishes (A's mark covers version 1). Whoever can write map B's folder replaces it
    with a copy of map A: B's second night passes the place (same id) and the mark (A's own
    chain), and numbers on A's map: B's first request, published as blocks [0, 1, 2, 3],
    now gets other ids, and ids 0-3 stand for A's blocks in B's traces."""
    (tmp_path / "salt").write_bytes(SALT)
    common = ["--salt-file", str(tmp_path / "salt")]
    prompt_b = "hello world again the dog is lazy and quick"
    nights = [
        _one_request(tmp_path, "a0", "the quick brown fox jumps over the lazy dog"),
        _one_request(tmp_path, "a1", "over and over again the fox", day=1),
    ]
    for day, night in enumerate(nights):
        assert (
            anonymize_night(
                tiny_tokenizer,
                [night],
                tmp_path / f"a{day}",
                "--id-map",
                str(tmp_path / "map-a"),
                *common,
            )
            == 0
        )
    assert (
        anonymize_night(
            tiny_tokenizer,
            [_one_request(tmp_path, "b0", prompt_b)],
            tmp_path / "b0",
            "--id-map",
            str(tmp_path / "map-b"),
            *common,
        )
        == 0
    )
    first = json.loads(trace_bytes(tmp_path / "b0"))["hash_ids"]
    shutil.rmtree(tmp_path / "map-b")  # the swap: no salt, not the marks
    shutil.copytree(tmp_path / "map-a", tmp_path / "map-b")
    code = anonymize_night(
        tiny_tokenizer,
        [_one_request(tmp_path, "b1", prompt_b, day=2)],
        tmp_path / "b1",
        "--id-map",
        str(tmp_path / "map-b"),
        *common,
    )
    again = json.loads(trace_bytes(tmp_path / "b1"))["hash_ids"] if code == 0 else first
    assert code != 0 or again == first, (
        f"map B, replaced by a copy of map A, ran its night: B's request, published as "
        f"{first} on night 1, is {again} now, and {first} are A's blocks"
    )


def test_a_map_whose_path_is_long_in_escapes_keeps_its_marks_readable(tiny_tokenizer, tmp_path):
    """Promise (docs/BOUNDS.md: every resource bounded, the bound fitting what kvtrace writes;
    anchor.MAX_MARK_BYTES: 'a path (up to PATH_MAX, escaped), an id, a version, two digests';
    tests/e2e/test_redteam_writes_round4: a location whose name is not UTF-8 is written). A
    mark and a place file hold the map's place as canonical ASCII JSON: each byte of a name
    that is not UTF-8 is written as a 6-character escape (\\udcXX; a CJK character too, for
    its 3 bytes). A 1.5 KB path (six folders of 250 Latin-1 bytes, far below PATH_MAX) makes
    a 9 KB mark, which _read_keyed reads only to 8,193 bytes: the first night commits and
    writes it, every later night reads it cut short and stops, saying the mark 'was altered,
    or belongs to another salt' (a false tamper alarm, the map never extended again)."""
    import os

    (tmp_path / "salt").write_bytes(SALT)
    deep = tmp_path.joinpath(*[os.fsdecode(b"\xe9" * 250) for _ in range(6)])
    deep.mkdir(parents=True)
    (tmp_path / "short").symlink_to(deep)  # the place resolves it: logs stay ASCII (xdist)
    codes = [
        anonymize_night(
            tiny_tokenizer,
            [_night(tmp_path, day)],
            tmp_path / f"out{day}",
            "--id-map",
            str(tmp_path / "short" / "map"),
            "--salt-file",
            str(tmp_path / "salt"),
        )
        for day in range(2)
    ]
    sizes = sorted(p.stat().st_size for p in (tmp_path / "salt.id-map-marks").iterdir())
    assert codes == [0, 0], f"nights gave {codes}; the marks are {sizes} bytes"
