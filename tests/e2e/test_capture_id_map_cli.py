"""anonymize --capture --id-map: nights of engine hash captures keep dense ids across nights as
text nights do, in a map of their own kind (docs/ID_MAP.md: what a map's ids are over); a map
of text refuses a capture night and the other way round, and the gate confirms a night only by
a map of its kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import (
    anonymize_night,
    assert_same_output,
    chat,
    dynamo_request_end,
    kvtrace_token_ids,
    lmcache_lookup,
    trace,
    write_jsonl,
)
from kvtrace.cli import main

SALT = "capture-map-salt-kept-in-a-secret-manager"
DAY_MS = 86_400_000
DYNAMO, LMCACHE = "dynamo-request-trace", "lmcache-lookup-hashes"
# Two nights of chats whose prompts recur across them (shared system prompts, sessions).
NIGHTS = [
    [chat(i, 1_000 + 997 * i, f"user-{i % 4}", rotate=i % 3) for i in range(10)],
    [chat(i + 3, DAY_MS + 1_000 + 613 * i, f"user-{i % 6}", rotate=i % 3) for i in range(10)],
]
COMPARED = ("timestamp", "input_length", "hash_ids", "session")


@pytest.fixture
def logs(tiny_tokenizer, tmp_path, monkeypatch) -> dict[str, list[Path]]:
    """Each night as text, as Dynamo's request trace and as LMCache's lookup hash log."""
    monkeypatch.delenv("KVTRACE_SALT", raising=False)
    (tmp_path / "salt").write_text(SALT)
    made: dict[str, list[Path]] = {"text": [], DYNAMO: [], LMCACHE: []}
    for night, records in enumerate(NIGHTS, 1):
        ids = kvtrace_token_ids(tiny_tokenizer, records)
        made["text"].append(write_jsonl(tmp_path / f"text{night}.jsonl", records))
        made[DYNAMO].append(
            write_jsonl(
                tmp_path / f"request_trace{night}.jsonl",
                [
                    dynamo_request_end(r["timestamp"], t, 4, r["output_length"], r["session_id"])
                    for r, t in zip(records, ids)
                ],
            )
        )
        made[LMCACHE].append(
            write_jsonl(
                tmp_path / f"lookup_hashes_{night}.jsonl",
                [
                    lmcache_lookup(r["timestamp"] / 1000, f"r{night}-{i}", t, 4)
                    for i, (r, t) in enumerate(zip(records, ids))
                ],
            )
        )
    return made


def _capture(tmp_path: Path, capture: str, inputs: list[Path], out: str, *extra: str) -> int:
    args = ["anonymize", "--output", str(tmp_path / out), "--capture", capture]
    for path in inputs:
        args += ["--input", str(path)]
    return main([*args, "--block-size", "4", "--salt-file", str(tmp_path / "salt"), *extra])


def _rows(out: Path) -> list[dict]:
    return [{key: row.get(key) for key in COMPARED} for row in trace(out)]


def _map_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _audit(tmp_path: Path, out: str, *given: str) -> int:
    salt = ["--salt-file", str(tmp_path / "salt")] if "--id-map" in given else []
    return main(["audit", str(tmp_path / out), *given, *salt])


def test_two_capture_nights_number_as_one_capture_run_and_as_text_nights(
    tiny_tokenizer, tmp_path, logs
):
    """Night 2 continues night 1's ids, sessions and clock: the two nights concatenated are one
    capture run over both, and (Dynamo hashes every block as text's chain cuts them) the text
    nights of a text map, row for row. The gate confirms each capture night by its map."""
    capture_map = ["--id-map", str(tmp_path / "cmap")]
    for night in (0, 1):
        assert _capture(tmp_path, DYNAMO, [logs[DYNAMO][night]], f"c{night}", *capture_map) == 0
        text = [*capture_map[:1], str(tmp_path / "tmap"), "--salt-file", str(tmp_path / "salt")]
        assert (
            anonymize_night(tiny_tokenizer, [logs["text"][night]], tmp_path / f"t{night}", *text)
            == 0
        )
    assert _capture(tmp_path, DYNAMO, logs[DYNAMO], "both") == 0
    nights = _rows(tmp_path / "c0") + _rows(tmp_path / "c1")
    assert len(nights) == sum(map(len, NIGHTS))
    assert nights == _rows(tmp_path / "both")
    assert nights == _rows(tmp_path / "t0") + _rows(tmp_path / "t1")
    second = json.loads((tmp_path / "c1" / "manifest.json").read_text())
    assert second["engine_capture"]["format"] == DYNAMO and second["id_map"]["block_ids_from"] > 0
    record = json.loads(next((tmp_path / "cmap" / "versions").glob("000002.json")).read_text())
    assert record["engine_capture"] == DYNAMO and record["tokenizer_sha256"] == {}
    given = ["--capture", DYNAMO, "--id-map", str(tmp_path / "cmap")]
    assert _audit(tmp_path, "c0", *given) == 0
    assert _audit(tmp_path, "c1", *given) == 0
    assert _audit(tmp_path, "c1", "--capture", DYNAMO) == 1  # its start needs the map


def test_rerunning_a_capture_night_changes_neither_output_nor_map(tmp_path, logs):
    """A rerun is the night the map recorded, on either clock: the map and the night's manifest
    are unchanged, and the gate confirms both presentations."""
    capture_map = ["--id-map", str(tmp_path / "map")]
    assert _capture(tmp_path, LMCACHE, [logs[LMCACHE][0]], "n1", *capture_map) == 0
    assert _capture(tmp_path, LMCACHE, [logs[LMCACHE][1]], "n2", *capture_map) == 0
    before = _map_files(tmp_path / "map"), (tmp_path / "n2" / "manifest.json").read_bytes()
    assert _capture(tmp_path, LMCACHE, [logs[LMCACHE][1]], "n2", *capture_map) == 0
    assert (
        _map_files(tmp_path / "map"),
        (tmp_path / "n2" / "manifest.json").read_bytes(),
    ) == before
    given = ["--capture", LMCACHE, "--id-map", str(tmp_path / "map")]
    assert _audit(tmp_path, "n2", *given) == 0
    own = ["--time-origin", "night"]
    assert _capture(tmp_path, LMCACHE, [logs[LMCACHE][1]], "own", *capture_map, *own) == 0
    assert _map_files(tmp_path / "map") == before[0]
    assert trace(tmp_path / "own")[0]["timestamp"] == 0
    assert _audit(tmp_path, "own", *given) == 0


def test_a_map_of_one_kind_refuses_a_night_of_another_in_one_line(
    tiny_tokenizer, tmp_path, logs, capsys
):
    """Text, Dynamo and LMCache ids are three spaces: each map refuses the others' nights before
    anything is written, saying what it numbers; the gate confirms no night by another kind's
    map."""
    salt = ["--salt-file", str(tmp_path / "salt")]
    text_map, dynamo_map = (
        ["--id-map", str(tmp_path / "tmap")],
        ["--id-map", str(tmp_path / "dmap")],
    )
    assert anonymize_night(tiny_tokenizer, [logs["text"][0]], tmp_path / "t", *text_map, *salt) == 0
    assert _capture(tmp_path, DYNAMO, [logs[DYNAMO][0]], "d", *dynamo_map) == 0
    maps = _map_files(tmp_path / "tmap"), _map_files(tmp_path / "dmap")
    capsys.readouterr()
    runs = [
        (lambda: _capture(tmp_path, DYNAMO, [logs[DYNAMO][1]], "x1", *text_map), "blocks of text"),
        (
            lambda: anonymize_night(
                tiny_tokenizer, [logs["text"][1]], tmp_path / "x2", *dynamo_map, *salt
            ),
            f"engine hashes of --capture {DYNAMO}, this run reads blocks of text",
        ),
        (
            lambda: _capture(tmp_path, LMCACHE, [logs[LMCACHE][1]], "x3", *dynamo_map),
            f"this run reads engine hashes of --capture {LMCACHE}",
        ),
    ]
    for run, named in runs:
        code = run()
        err = capsys.readouterr().err
        assert code == 2 and named in err and len(err.strip().splitlines()) == 1, err
    assert not any((tmp_path / name).exists() for name in ("x1", "x2", "x3"))
    assert (_map_files(tmp_path / "tmap"), _map_files(tmp_path / "dmap")) == maps
    # The gate: a night of one kind is no night of the other's map.
    anonymize_night(tiny_tokenizer, [logs["text"][1]], tmp_path / "t2", *text_map, *salt)
    _capture(tmp_path, DYNAMO, [logs[DYNAMO][1]], "d2", *dynamo_map)
    assert _audit(tmp_path, "d2", "--capture", DYNAMO, *dynamo_map) == 0
    capsys.readouterr()
    assert _audit(tmp_path, "d2", "--capture", DYNAMO, *text_map) == 1
    assert "the id map numbers blocks of text" in capsys.readouterr().out
    assert _audit(tmp_path, "t2", *text_map) == 0
    assert _audit(tmp_path, "t2", *dynamo_map) == 1
    assert f"numbers engine hashes of --capture {DYNAMO}" in capsys.readouterr().out


def test_a_capture_map_still_refuses_streaming(tmp_path, logs, capsys):
    code = _capture(tmp_path, DYNAMO, [logs[DYNAMO][0]], "s", "--streaming", "--id-map", "m")
    assert code == 2 and "--streaming cannot go with it" in capsys.readouterr().err


@pytest.mark.beam
def test_both_engines_extend_a_capture_map_alike(tmp_path, logs):
    """The same capture nights on the local engine and on Beam: the same outputs and the same
    map, byte for byte (a map's bytes are its nights', whichever engine ran them)."""
    for engine in ("local", "beam"):
        for night in (0, 1):
            flags = ["--engine", engine, "--id-map", str(tmp_path / f"map-{engine}")]
            # the two maps are one map (same nights, same salt): marks apart
            flags += ["--id-map-marks", str(tmp_path / f"marks-{engine}")]
            assert (
                _capture(tmp_path, DYNAMO, [logs[DYNAMO][night]], f"{engine}{night}", *flags) == 0
            )
    for night in (0, 1):
        assert_same_output(tmp_path / f"local{night}", tmp_path / f"beam{night}")
    assert _map_files(tmp_path / "map-local") == _map_files(tmp_path / "map-beam")
