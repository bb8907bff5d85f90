"""--time-origin night: a night of an id map published from its own first request. Only the
rows move: the map and the manifest keep the night's place on the map's clock, so the next
night must still follow it, a rerun is the same night, and the audit confirms it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import anonymize_night, chat, read_jsonl, write_jsonl
from kvtrace.cli import main

SALT = "nightly-salt-kept-in-a-secret-manager"
DAY_MS = 86_400_000


@pytest.fixture
def nights(tmp_path, monkeypatch) -> dict:
    monkeypatch.delenv("KVTRACE_SALT", raising=False)
    (tmp_path / "salt").write_text(SALT)
    return {
        n: write_jsonl(
            tmp_path / f"night{n}.jsonl",
            [chat(i + n, (n - 1) * DAY_MS + 1_000 + 613 * i, f"user-{i % 5}") for i in range(12)],
        )
        for n in (1, 2, 3)
    }


def night(tokenizer: str, tmp_path: Path, logs: Path, out: str, map_name: str, *extra: str) -> int:
    salt = ["--salt-file", str(tmp_path / "salt")]
    marks = ["--id-map-marks", str(tmp_path / f"marks-{map_name}")]
    args = ["--id-map", str(tmp_path / map_name), *marks, *salt, *extra]
    return anonymize_night(tokenizer, [logs], tmp_path / out, *args)


def rows(out: Path) -> list[dict]:
    return [r for p in sorted(out.glob("trace-*.jsonl")) for r in read_jsonl(p)]


def test_a_night_from_its_own_start_is_the_map_clocks_night_moved(
    tiny_tokenizer, tmp_path, nights, capsys
):
    for out, origin in (("map", []), ("own", ["--time-origin", "night"])):
        assert night(tiny_tokenizer, tmp_path, nights[1], f"{out}1", out, *origin) == 0
        assert night(tiny_tokenizer, tmp_path, nights[2], f"{out}2", out, *origin) == 0
    said = capsys.readouterr().out
    assert "this night begins 86,400,000 ms (24.0 h) after the map's first request" in said
    assert "--time-origin night: from its own first request" in said
    assert "timestamps: from this night's first request, which lies 86,400,000 ms" in said
    on_map, own = rows(tmp_path / "map2"), rows(tmp_path / "own2")
    start = json.loads((tmp_path / "own2" / "manifest.json").read_text())
    assert start["time_origin"] == "night" and start["id_map"]["time_from_ms"] == DAY_MS
    assert own[0]["timestamp"] == 0 and on_map[0]["timestamp"] == DAY_MS
    assert [{**r, "timestamp": r["timestamp"] + DAY_MS} for r in own] == on_map
    plain = json.loads((tmp_path / "map2" / "manifest.json").read_text())
    assert "time_origin" not in plain  # from the map's origin: the manifest as it always was
    for name in ("own1", "own2"):
        audit = ["audit", str(tmp_path / name), "--tokenizer", tiny_tokenizer, "--id-map"]
        salt = ["--salt-file", str(tmp_path / "salt")]
        assert main([*audit, str(tmp_path / "own"), *salt]) == 0, name


def test_the_next_night_must_still_follow_and_a_rerun_is_the_same_night(
    tiny_tokenizer, tmp_path, nights, capsys
):
    own = ["--time-origin", "night"]
    assert night(tiny_tokenizer, tmp_path, nights[1], "n1", "m", *own) == 0
    assert night(tiny_tokenizer, tmp_path, nights[2], "n2", "m", *own) == 0
    first = (tmp_path / "n2" / "manifest.json").read_bytes()
    # Logs inside night 2's span on the map's clock: refused, though their rows would begin at 0.
    late = write_jsonl(tmp_path / "late.jsonl", [chat(40, DAY_MS + 2_000, "user-9")])
    assert night(tiny_tokenizer, tmp_path, late, "late", "m", *own) == 1
    assert "at or before" in capsys.readouterr().err and not (tmp_path / "late").exists()
    assert night(tiny_tokenizer, tmp_path, nights[2], "n2", "m", *own) == 0  # a rerun
    assert (tmp_path / "n2" / "manifest.json").read_bytes() == first
    assert night(tiny_tokenizer, tmp_path, nights[3], "n3", "m", *own) == 0
    assert rows(tmp_path / "n3")[0]["timestamp"] == 0


def test_night_origin_without_an_id_map_is_refused_in_one_line(tiny_tokenizer, tmp_path, nights):
    args = ["--salt-file", str(tmp_path / "salt"), "--time-origin", "night"]
    assert anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "out", *args) == 2
    assert not (tmp_path / "out").exists()


@pytest.mark.beam
@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_the_beam_engine_publishes_the_same_night(tiny_tokenizer, tmp_path, nights):
    own = ["--time-origin", "night"]
    for engine in ("local", "beam"):
        assert night(tiny_tokenizer, tmp_path, nights[1], f"{engine}1", engine, *own) == 0
        args = (*own, "--engine", engine)
        assert night(tiny_tokenizer, tmp_path, nights[2], f"{engine}2", engine, *args) == 0
    for name in ("manifest.json", "trace-00000-of-00001.jsonl"):
        assert (tmp_path / "beam2" / name).read_bytes() == (tmp_path / "local2" / name).read_bytes()


def test_time_origin_is_one_free_bit_on_every_night_of_a_map(tiny_tokenizer, tmp_path, nights):
    """docs/AUDIT.md: on a later night too (time_from_ms 24 h), a rerun on the other origin is
    the same night, and both presentations pass audit --id-map: no option confirms the run's."""
    assert night(tiny_tokenizer, tmp_path, nights[1], "n1", "m") == 0
    assert night(tiny_tokenizer, tmp_path, nights[2], "n2", "m") == 0
    assert night(tiny_tokenizer, tmp_path, nights[2], "n2own", "m", "--time-origin", "night") == 0
    manifests = [json.loads((tmp_path / n / "manifest.json").read_text()) for n in ("n2", "n2own")]
    assert [m.get("time_origin") for m in manifests] == [None, "night"]
    assert (
        manifests[0]["id_map"] == manifests[1]["id_map"] and manifests[0]["id_map"]["time_from_ms"]
    )
    for name in ("n2", "n2own"):
        audit = ["audit", str(tmp_path / name), "--tokenizer", tiny_tokenizer, "--id-map"]
        assert main([*audit, str(tmp_path / "m"), "--salt-file", str(tmp_path / "salt")]) == 0
