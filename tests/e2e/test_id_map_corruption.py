"""A damaged id map never gives wrong ids: each kind of map file flipped, truncated, zeroed,
swapped with another of its kind or deleted; the next night either refuses, naming the file and
publishing nothing, or (for a hint like CURRENT) repairs exactly: the bytes of an undamaged run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from helpers import anonymize_night, chat, trace_bytes, write_jsonl
from kvtrace.transforms.ids import id_map

DAY_MS = 86_400_000
SALT = "corruption-test-salt-of-32-bytes"


def _night(folder: Path, day: int, offset: int) -> Path:
    records = [
        chat(
            i + offset, day * DAY_MS + 1_000 + 611 * i, f"user-{day}-{i % 5}", rotate=(i + day) % 4
        )
        for i in range(30)
    ]
    return write_jsonl(folder / f"night{day}.jsonl", records)


@pytest.fixture(scope="module")
def built(tiny_tokenizer, tmp_path_factory):
    """A map of two nights (versions 1 and 2), the third night's logs, and the output and map
    of an undamaged third night."""
    folder = tmp_path_factory.mktemp("corruption")
    salt = folder / "salt"
    salt.write_text(SALT)
    nights = [_night(folder, day, 3 * day) for day in range(3)]
    common = ["--salt-file", str(salt), "--hash-shards", "3"]
    for day in range(2):
        assert (
            anonymize_night(
                tiny_tokenizer,
                [nights[day]],
                folder / f"out{day}",
                "--id-map",
                str(folder / "map"),
                *common,
            )
            == 0
        )
    reference = folder / "reference-map"
    shutil.copytree(folder / "map", reference)
    assert (
        anonymize_night(
            tiny_tokenizer,
            [nights[2]],
            folder / "expected",
            "--id-map",
            str(reference),
            *_marks_copy(folder, folder / "reference-marks"),
            *common,
        )
        == 0
    )
    return folder, nights[2], common


def _marks_copy(folder: Path, to: Path) -> list[str]:
    """Its own copy of the map's marks: a copy of a map is the same map (its id names its
    mark), so a copy extended with the shared marks would make the others rollbacks."""
    shutil.copytree(folder / "salt.id-map-marks", to)
    return ["--id-map-marks", str(to)]


def _files(map_dir: Path) -> dict[str, list[Path]]:
    return {
        "version": sorted((map_dir / "versions").glob("*.json")),
        "current": [map_dir / "CURRENT"],
        "segment": sorted(map_dir.glob("segments/*/*.parquet")),
        "index": sorted(map_dir.glob("segments/*/*.index.npz")),
        "committed": sorted(map_dir.glob(f"segments/*/{id_map.COMMITTED_MARK}")),
    }


def _damage(path: Path, how: str, others: list[Path]) -> None:
    data = path.read_bytes()
    if how == "flip":
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes([data[middle] ^ 0x40]) + data[middle + 1 :])
    elif how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "zero":
        path.write_bytes(bytes(len(data)))
    elif how == "swap":
        other = next(o for o in others if o != path and o.read_bytes() != data)
        path.write_bytes(other.read_bytes())
    elif how == "delete":
        path.unlink()


@pytest.mark.parametrize("kind", ["version", "current", "segment", "index", "committed"])
@pytest.mark.parametrize("how", ["flip", "truncate", "zero", "swap", "delete"])
def test_a_damaged_map_file_is_refused_by_name_or_repaired_exactly(
    tiny_tokenizer, built, tmp_path, capsys, kind, how
):
    folder, night, common = built
    map_dir = tmp_path / "map"
    shutil.copytree(folder / "map", map_dir)
    files = _files(map_dir)[kind]
    if (
        not files
        or (how == "swap" and len({f.read_bytes() for f in files}) < 2)
        or (kind == "committed" and how != "delete")
    ):
        pytest.skip(f"no {how} for {kind} files here")
    targets = files[-2:] if kind in ("segment", "index") else files[-1:]  # what night 3 reads
    for target in targets:
        _damage(target, how, files)
    capsys.readouterr()
    code = anonymize_night(
        tiny_tokenizer,
        [night],
        tmp_path / "out",
        "--id-map",
        str(map_dir),
        *_marks_copy(folder, tmp_path / "marks"),
        *common,
    )
    err = capsys.readouterr().err
    if code == 0:  # repaired: exactly the undamaged night
        assert trace_bytes(tmp_path / "out") == trace_bytes(folder / "expected")
        assert (tmp_path / "out" / "manifest.json").read_bytes() == (
            folder / "expected" / "manifest.json"
        ).read_bytes()
        return
    assert any(str(t.relative_to(map_dir)) in err for t in targets), err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert not (map_dir / "versions" / "000003.json").exists()  # the map was not extended


def test_a_map_whose_versions_are_lost_is_refused_not_restarted(
    tiny_tokenizer, built, tmp_path, capsys
):
    folder, night, common = built
    map_dir = tmp_path / "map"
    shutil.copytree(folder / "map", map_dir)
    shutil.rmtree(map_dir / "versions")
    (map_dir / "CURRENT").unlink()
    segments = sorted(map_dir.glob("segments/*/*"))
    assert (
        anonymize_night(
            tiny_tokenizer, [night], tmp_path / "out", "--id-map", str(map_dir), *common
        )
        == 2
    )
    assert "lost committed versions" in capsys.readouterr().err
    assert sorted(map_dir.glob("segments/*/*")) == segments  # nothing deleted


def test_map_files_are_owner_only(built):
    folder, _, _ = built
    for path in [folder / "map", *(folder / "map").rglob("*")]:
        assert path.stat().st_mode & 0o077 == 0, path
