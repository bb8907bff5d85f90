"""Nightly exports with a persisted id map: nights concatenate into one run, reruns change
nothing, a killed run leaves the map usable, mismatched runs are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from helpers import anonymize_night, chat, read_jsonl, trace_bytes, write_jsonl
from kvtrace.cli import main
from kvtrace.transforms.ids import id_map, map_record

SALT = "nightly-salt-kept-in-a-secret-manager"
KEY = map_record.map_key(SALT.encode())
DAY_MS = 86_400_000


@pytest.fixture
def nights(tmp_path) -> tuple[Path, Path]:
    """Two nights of logs, split between two distinct timestamps; sessions span both."""
    first = [chat(i, 1_000 + 997 * i, f"user-{i % 4}") for i in range(25)]
    second = [chat(i + 3, DAY_MS + 1_000 + 613 * i, f"user-{i % 6}") for i in range(25)]
    return (
        write_jsonl(tmp_path / "night1.jsonl", first),
        write_jsonl(tmp_path / "night2.jsonl", second),
    )


@pytest.fixture
def salt_file(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("KVTRACE_SALT", raising=False)
    path = tmp_path / "salt"
    path.write_text(SALT)
    return path


def rows(out: Path) -> list[dict]:
    return [r for p in sorted(out.glob("trace-*.jsonl")) for r in read_jsonl(p)]


def current(directory: Path) -> dict:
    return json.loads(
        (
            directory / "versions" / f"{id_map.current_version_number(str(directory)):06d}.json"
        ).read_text()
    )


def test_two_nights_concatenated_equal_one_run_over_both(
    tiny_tokenizer, tmp_path, nights, salt_file
):
    salt = ["--salt-file", str(salt_file)]
    assert (
        anonymize_night(
            tiny_tokenizer, [nights[0]], tmp_path / "n1", "--id-map", str(tmp_path / "map"), *salt
        )
        == 0
    )
    assert (
        anonymize_night(
            tiny_tokenizer, [nights[1]], tmp_path / "n2", "--id-map", str(tmp_path / "map"), *salt
        )
        == 0
    )
    assert (
        anonymize_night(tiny_tokenizer, list(nights), tmp_path / "both") == 0
    )  # no map, random salt

    assert trace_bytes(tmp_path / "n1") + trace_bytes(tmp_path / "n2") == trace_bytes(
        tmp_path / "both"
    )
    first_ids = {i for r in rows(tmp_path / "n1") for i in r["hash_ids"]}
    second_ids = {i for r in rows(tmp_path / "n2") for i in r["hash_ids"]}
    assert first_ids & second_ids, "night 2 should hit blocks first seen on night 1"
    assert {r["session"] for r in rows(tmp_path / "n1")} & {
        r["session"] for r in rows(tmp_path / "n2")
    }
    metadata = current(tmp_path / "map")
    assert metadata["version"] == 2
    assert metadata["next_id"]["blocks"] == len(first_ids | second_ids)
    assert metadata["next_id"]["sessions"] == 6


def test_rerunning_a_night_changes_neither_output_nor_map(
    tiny_tokenizer, tmp_path, nights, salt_file
):
    common = ["--id-map", str(tmp_path / "map"), "--salt-file", str(salt_file)]
    assert anonymize_night(tiny_tokenizer, [nights[0]], tmp_path / "n1", *common) == 0
    assert anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "n2", *common) == 0
    files_before = sorted(p.relative_to(tmp_path / "map") for p in (tmp_path / "map").rglob("*"))
    before = current(tmp_path / "map")
    for night, out in ((nights[1], "n2"), (nights[0], "n1")):
        assert anonymize_night(tiny_tokenizer, [night], tmp_path / f"{out}-again", *common) == 0
        for name in ("trace-00000-of-00001.jsonl", "trace-00000-of-00001.parquet", "stats.json"):
            assert (tmp_path / out / name).read_bytes() == (
                tmp_path / f"{out}-again" / name
            ).read_bytes()
        # The map recorded the night with its start: the rerun names that start, not the
        # map's current one, so its manifest is the original's, byte for byte.
        assert (tmp_path / out / "manifest.json").read_bytes() == (
            tmp_path / f"{out}-again" / "manifest.json"
        ).read_bytes()
    assert current(tmp_path / "map") == before
    assert (
        sorted(p.relative_to(tmp_path / "map") for p in (tmp_path / "map").rglob("*"))
        == files_before
    )


def test_a_run_killed_before_publishing_leaves_the_map_intact(
    tiny_tokenizer, tmp_path, nights, salt_file, monkeypatch
):
    common = ["--id-map", str(tmp_path / "map"), "--salt-file", str(salt_file)]
    assert anonymize_night(tiny_tokenizer, [nights[0]], tmp_path / "n1", *common) == 0
    version_1 = current(tmp_path / "map")

    # SystemExit: the CLI turns Ctrl-C (KeyboardInterrupt) into exit 130, a kill it cannot see.
    def killed(*_):
        raise SystemExit("killed before committing version 2")

    monkeypatch.setattr(id_map, "create_exclusive", killed)
    with pytest.raises(BaseException, match="killed"):
        anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "n2-killed", *common)
    assert not (tmp_path / "map" / "versions" / "000002.json").exists()
    assert current(tmp_path / "map") == version_1
    assert not (tmp_path / "n2-killed" / "manifest.json").exists()
    monkeypatch.undo()

    # A partial file of another dead run, as a kill mid-write leaves it.
    dead = tmp_path / "map" / "segments" / "000002-deadbeef0000"
    dead.mkdir()
    (dead / "blocks-00063.parquet").write_bytes(b"PAR1 trunc")
    assert anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "n2", *common) == 0
    assert anonymize_night(tiny_tokenizer, list(nights), tmp_path / "both") == 0
    assert trace_bytes(tmp_path / "n1") + trace_bytes(tmp_path / "n2") == trace_bytes(
        tmp_path / "both"
    )
    listed = set(current(tmp_path / "map")["files"]["blocks"])
    on_disk = {
        str(p.relative_to(tmp_path / "map"))
        for p in (tmp_path / "map" / "segments").rglob("blocks-*.parquet")
    }
    assert listed == on_disk
    indexes = {
        str(p.relative_to(tmp_path / "map"))
        for p in (tmp_path / "map" / "segments").rglob("blocks-*.index.npz")
    }
    assert indexes == {name.replace(".parquet", ".index.npz") for name in listed}


def test_compaction_folds_segments_and_keeps_ids(tiny_tokenizer, tmp_path, salt_file, monkeypatch):
    monkeypatch.setattr("kvtrace.transforms.ids.id_map.MAX_SEGMENTS", 2)
    nights = [
        write_jsonl(
            tmp_path / f"n{k}.jsonl",
            [chat(i, k * DAY_MS + 100 * i, f"u{i % 3 + k}", rotate=k) for i in range(12)],
        )
        for k in range(3)
    ]
    common = ["--id-map", str(tmp_path / "map"), "--salt-file", str(salt_file)]
    for k, night in enumerate(nights):
        assert anonymize_night(tiny_tokenizer, [night], tmp_path / f"out{k}", *common) == 0
    assert anonymize_night(tiny_tokenizer, nights, tmp_path / "all") == 0
    assert b"".join(trace_bytes(tmp_path / f"out{k}") for k in range(3)) == trace_bytes(
        tmp_path / "all"
    )
    metadata = current(tmp_path / "map")
    assert metadata["history"][-1]["compacted"] is True
    assert {f.split("/")[1][:6] for f in metadata["files"]["blocks"]} == {"000003"}
    stored = np.concatenate(
        [
            pq.read_table(tmp_path / "map" / f).column("id").to_numpy()
            for f in metadata["files"]["blocks"]
        ]
    )
    assert sorted(stored.tolist()) == list(range(metadata["next_id"]["blocks"]))


def test_map_holds_keyed_hashes_and_ids_only(tiny_tokenizer, tmp_path, nights, salt_file):
    assert (
        anonymize_night(
            tiny_tokenizer,
            [nights[0]],
            tmp_path / "n1",
            "--id-map",
            str(tmp_path / "map"),
            "--salt-file",
            str(salt_file),
        )
        == 0
    )
    segments = sorted((tmp_path / "map" / "segments").rglob("*.parquet"))
    assert segments
    for path in segments:
        assert pq.read_schema(path).names == ["hi", "lo", "id"]
    everything = b"".join(p.read_bytes() for p in (tmp_path / "map").rglob("*") if p.is_file())
    for secret in (SALT.encode(), b"quick", b"caching", b"user-1", str(nights[0]).encode()):
        assert secret not in everything


def test_mismatched_runs_are_refused(tiny_tokenizer, tmp_path, nights, salt_file, capsys):
    common = ["--id-map", str(tmp_path / "map")]
    assert (
        anonymize_night(
            tiny_tokenizer, [nights[0]], tmp_path / "n1", *common, "--salt-file", str(salt_file)
        )
        == 0
    )
    capsys.readouterr()

    other_salt = tmp_path / "other-salt"
    other_salt.write_text("a-different-salt-of-enough-bytes")
    assert (
        anonymize_night(
            tiny_tokenizer, [nights[1]], tmp_path / "x", *common, "--salt-file", str(other_salt)
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "MAC does not verify with this run's salt" in err and "salt fingerprint" in err

    assert (
        anonymize_night(
            tiny_tokenizer,
            [nights[1]],
            tmp_path / "x",
            *common,
            "--salt-file",
            str(salt_file),
            "--block-size",
            "8",
        )
        == 2
    )
    assert "block size: map has 4, this run has 8" in capsys.readouterr().err

    edited = tmp_path / "edited-tokenizer"
    shutil.copytree(tiny_tokenizer, edited)
    config = json.loads((edited / "tokenizer_config.json").read_text())
    config["chat_template"] = config.get("chat_template", "") + " "
    (edited / "tokenizer_config.json").write_text(json.dumps(config))
    assert (
        anonymize_night(
            str(edited), [nights[1]], tmp_path / "x", *common, "--salt-file", str(salt_file)
        )
        == 2
    )
    assert "tokenizer files (sha256)" in capsys.readouterr().err

    assert (
        anonymize_night(
            tiny_tokenizer,
            [nights[1]],
            tmp_path / "x",
            *common,
            "--salt-file",
            str(salt_file),
            "--chat-template-kwargs",
            '{"enable_thinking": false}',
        )
        == 2
    )
    assert "chat template kwargs" in capsys.readouterr().err

    version = tmp_path / "map" / "versions" / "000001.json"
    metadata = json.loads(version.read_text())
    version.write_text(json.dumps({**metadata, "hash_scheme": "sha256-v0"}))  # edited in place
    assert (
        anonymize_night(
            tiny_tokenizer, [nights[1]], tmp_path / "x", *common, "--salt-file", str(salt_file)
        )
        == 2
    )
    assert "000001.json: its MAC does not verify" in capsys.readouterr().err
    other = {k: v for k, v in metadata.items() if k != "mac"} | {"hash_scheme": "sha256-v0"}
    version.write_bytes(map_record.keyed(other, KEY))  # another map's, keyed with this salt
    assert (
        anonymize_night(
            tiny_tokenizer, [nights[1]], tmp_path / "x", *common, "--salt-file", str(salt_file)
        )
        == 2
    )
    assert "hash scheme" in capsys.readouterr().err
    version.write_text(json.dumps({**metadata, "format_version": 99}))
    assert (
        anonymize_night(
            tiny_tokenizer, [nights[1]], tmp_path / "x", *common, "--salt-file", str(salt_file)
        )
        == 2
    )
    assert "format version 99" in capsys.readouterr().err

    assert anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "x", *common) == 2  # random salt
    assert "--id-map needs the same salt every run" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_requests_before_the_maps_origin_are_refused(
    tiny_tokenizer, tmp_path, nights, salt_file, capsys
):
    common = ["--id-map", str(tmp_path / "map"), "--salt-file", str(salt_file)]
    assert anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "n2", *common) == 0
    assert anonymize_night(tiny_tokenizer, [nights[0]], tmp_path / "n1", *common) == 1
    assert "precedes the id map's timestamp origin" in capsys.readouterr().err
    assert not list((tmp_path / "n1").glob("trace-*"))
    assert current(tmp_path / "map")["version"] == 1


def test_date_fills_path_templates(tiny_tokenizer, tmp_path, salt_file, capsys):
    (tmp_path / "logs" / "2026-11-20").mkdir(parents=True)
    write_jsonl(tmp_path / "logs" / "2026-11-20" / "part-0.jsonl", [chat(1, 5)])
    preset = tmp_path / "nightly.yaml"
    preset.write_text(
        f"tokenizer: {tiny_tokenizer}\n"
        f"input: {tmp_path}/logs/{{date}}/*.jsonl\n"
        f"output: {tmp_path}/traces/{{yyyy}}/{{mm}}/{{dd}}\n"
        f"id-map: {tmp_path}/map\n"
        f"salt-file: {salt_file}\n"
    )
    assert main(["anonymize", "--config", str(preset), "--date", "2026-11-20"]) == 0
    assert (tmp_path / "traces" / "2026" / "11" / "20" / "manifest.json").exists()
    assert (tmp_path / "map" / "CURRENT").exists()
    assert main(["anonymize", "--config", str(preset)]) == 2
    assert "has a date placeholder: give --date" in capsys.readouterr().err
    assert main(["anonymize", "--config", str(preset), "--date", "2026-13-01"]) == 2
    assert "--date 2026-13-01" in capsys.readouterr().err


def night(base: id_map.MapVersion, time_from_ms: int = 0, identity: str = "a" * 64) -> id_map.Night:
    """A night extending base: its start where base stands."""
    return id_map.Night(
        {
            "block_ids_from": base.next_id["blocks"],
            "sessions_from": base.next_id["sessions"],
            "time_from_ms": time_from_ms,
        },
        identity,
    )


def test_a_run_killed_after_committing_has_published_and_its_rerun_changes_nothing(
    tiny_tokenizer, tmp_path, nights, salt_file, monkeypatch
):
    common = ["--id-map", str(tmp_path / "map"), "--salt-file", str(salt_file)]
    assert anonymize_night(tiny_tokenizer, [nights[0]], tmp_path / "n1", *common) == 0
    version_1 = current(tmp_path / "map")

    def killed(*_):
        raise SystemExit("killed between committing version 2 and moving CURRENT")

    monkeypatch.setattr(id_map, "_switch_current", killed)
    with pytest.raises(BaseException, match="killed"):
        anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "n2", *common)
    monkeypatch.undo()
    assert json.loads((tmp_path / "map" / "CURRENT").read_text())["version"] == 1
    assert current(tmp_path / "map")["version"] == 2  # readers follow the committed version
    assert not (tmp_path / "n2" / "manifest.json").exists()
    assert anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "n2", *common) == 0  # the retry
    assert current(tmp_path / "map")["version"] == 2
    # The retry finds every id in the map, yet names where the killed run began: version 2's
    # night, not the map's current next ids.
    start = json.loads((tmp_path / "n2" / "manifest.json").read_text())["id_map"]
    assert (start["block_ids_from"], start["sessions_from"]) == (
        version_1["next_id"]["blocks"],
        version_1["next_id"]["sessions"],
    )
    assert start == current(tmp_path / "map")["history"][-1]["start"]
    assert anonymize_night(tiny_tokenizer, list(nights), tmp_path / "both") == 0
    assert trace_bytes(tmp_path / "n1") + trace_bytes(tmp_path / "n2") == trace_bytes(
        tmp_path / "both"
    )


def test_a_cleanup_failing_after_the_commit_is_a_warning_not_the_nights_failure(
    tiny_tokenizer, tmp_path, nights, salt_file, monkeypatch, caplog
):
    """The version stands once committed: what its cleanup cannot remove, the next run's
    opening removes, and the night is published."""
    common = ["--id-map", str(tmp_path / "map"), "--salt-file", str(salt_file)]
    assert anonymize_night(tiny_tokenizer, [nights[0]], tmp_path / "n1", *common) == 0

    def refused(*_):
        raise PermissionError(13, "Permission denied", "segments/000002-x/blocks-00000.parquet")

    monkeypatch.setattr(id_map, "discard_abandoned", refused)  # the one after the commit
    assert anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "n2", *common) == 0
    assert (tmp_path / "n2" / "manifest.json").exists() and current(tmp_path / "map")[
        "version"
    ] == 2
    warned = [r for r in caplog.records if "not cleared after version 2" in r.getMessage()]
    assert len(warned) == 1 and "Permission denied" in warned[0].getMessage()


def test_another_shard_count_re_splits_the_map_and_keeps_ids(
    tiny_tokenizer, tmp_path, nights, salt_file
):
    common = ["--id-map", str(tmp_path / "map"), "--salt-file", str(salt_file)]
    assert anonymize_night(tiny_tokenizer, [nights[0]], tmp_path / "n1", *common) == 0
    assert current(tmp_path / "map")["hash_shards"] == 64
    assert (
        anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "n2", *common, "--hash-shards", "7")
        == 0
    )
    assert anonymize_night(tiny_tokenizer, list(nights), tmp_path / "both") == 0
    assert trace_bytes(tmp_path / "n1") + trace_bytes(tmp_path / "n2") == trace_bytes(
        tmp_path / "both"
    )
    metadata = current(tmp_path / "map")
    assert metadata["hash_shards"] == 7 and metadata["history"][-1]["compacted"] is True
    shards = {id_map.shard_of_segment(name) for name in metadata["files"]["blocks"]}
    assert (
        shards <= set(range(7))
        and len({name.split("/")[1] for name in metadata["files"]["blocks"]}) == 1
    )
    # The next night keeps the map's count without being told, and does not fold again.
    assert anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "n2-again", *common) == 0
    assert current(tmp_path / "map")["hash_shards"] == 7
