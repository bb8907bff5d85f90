"""Nightly exports with a persisted id map: nights concatenate into one run, reruns change
nothing, a killed run leaves the map usable, mismatched runs are refused."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import anonymize_night, chat, read_jsonl, trace_bytes, write_jsonl
from kvtrace.transforms.ids import id_map, map_record
from kvtrace.transforms.errors import IdMapError, JobStopped
from kvtrace.transforms.ids.dense_ids import NUMBERED
from kvtrace.transforms.ids.segments import SegmentFile

from kvtrace.cli import main

SALT = "nightly-salt-kept-in-a-secret-manager"
KEY = map_record.map_key(SALT.encode())
DAY_MS = 86_400_000


@pytest.fixture
def nights(tmp_path) -> tuple[Path, Path]:
    """Two nights of logs, split between two distinct timestamps; sessions span both."""
    first = [chat(i, 1_000 + 997 * i, f"user-{i % 4}") for i in range(25)]
    second = [chat(i + 3, DAY_MS + 1_000 + 613 * i, f"user-{i % 6}") for i in range(25)]
    return (write_jsonl(tmp_path / "night1.jsonl", first),
            write_jsonl(tmp_path / "night2.jsonl", second))


@pytest.fixture
def salt_file(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("KVTRACE_SALT", raising=False)
    path = tmp_path / "salt"
    path.write_text(SALT)
    return path


def rows(out: Path) -> list[dict]:
    return [r for p in sorted(out.glob("trace-*.jsonl")) for r in read_jsonl(p)]


def current(directory: Path) -> dict:
    return json.loads((directory / "versions" / f"{id_map.current_version_number(str(directory)):06d}.json").read_text())


def test_two_nights_concatenated_equal_one_run_over_both(tiny_tokenizer, tmp_path, nights, salt_file):
    salt = ["--salt-file", str(salt_file)]
    assert anonymize_night(tiny_tokenizer, [nights[0]], tmp_path / "n1", "--id-map", str(tmp_path / "map"), *salt) == 0
    assert anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "n2", "--id-map", str(tmp_path / "map"), *salt) == 0
    assert anonymize_night(tiny_tokenizer, list(nights), tmp_path / "both") == 0  # no map, random salt

    assert trace_bytes(tmp_path / "n1") + trace_bytes(tmp_path / "n2") == trace_bytes(tmp_path / "both")
    first_ids = {i for r in rows(tmp_path / "n1") for i in r["hash_ids"]}
    second_ids = {i for r in rows(tmp_path / "n2") for i in r["hash_ids"]}
    assert first_ids & second_ids, "night 2 should hit blocks first seen on night 1"
    assert {r["session"] for r in rows(tmp_path / "n1")} & {r["session"] for r in rows(tmp_path / "n2")}
    metadata = current(tmp_path / "map")
    assert metadata["version"] == 2
    assert metadata["next_id"]["blocks"] == len(first_ids | second_ids)
    assert metadata["next_id"]["sessions"] == 6


def test_rerunning_a_night_changes_neither_output_nor_map(tiny_tokenizer, tmp_path, nights, salt_file):
    common = ["--id-map", str(tmp_path / "map"), "--salt-file", str(salt_file)]
    assert anonymize_night(tiny_tokenizer, [nights[0]], tmp_path / "n1", *common) == 0
    assert anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "n2", *common) == 0
    files_before = sorted(p.relative_to(tmp_path / "map") for p in (tmp_path / "map").rglob("*"))
    before = current(tmp_path / "map")
    for night, out in ((nights[1], "n2"), (nights[0], "n1")):
        assert anonymize_night(tiny_tokenizer, [night], tmp_path / f"{out}-again", *common) == 0
        for name in ("trace-00000-of-00001.jsonl", "trace-00000-of-00001.parquet", "stats.json"):
            assert (tmp_path / out / name).read_bytes() == (tmp_path / f"{out}-again" / name).read_bytes()
        # The map recorded the night with its start: the rerun names that start, not the
        # map's current one, so its manifest is the original's, byte for byte.
        assert (tmp_path / out / "manifest.json").read_bytes() == \
            (tmp_path / f"{out}-again" / "manifest.json").read_bytes()
    assert current(tmp_path / "map") == before
    assert sorted(p.relative_to(tmp_path / "map") for p in (tmp_path / "map").rglob("*")) == files_before


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
    assert trace_bytes(tmp_path / "n1") + trace_bytes(tmp_path / "n2") == trace_bytes(tmp_path / "both")
    listed = set(current(tmp_path / "map")["files"]["blocks"])
    on_disk = {str(p.relative_to(tmp_path / "map")) for p in (tmp_path / "map" / "segments").rglob("blocks-*.parquet")}
    assert listed == on_disk
    indexes = {str(p.relative_to(tmp_path / "map")) for p in (tmp_path / "map" / "segments").rglob("blocks-*.index.npz")}
    assert indexes == {name.replace(".parquet", ".index.npz") for name in listed}


def test_compaction_folds_segments_and_keeps_ids(tiny_tokenizer, tmp_path, salt_file, monkeypatch):
    monkeypatch.setattr("kvtrace.transforms.ids.id_map.MAX_SEGMENTS", 2)
    nights = [write_jsonl(tmp_path / f"n{k}.jsonl",
                          [chat(i, k * DAY_MS + 100 * i, f"u{i % 3 + k}", rotate=k) for i in range(12)])
              for k in range(3)]
    common = ["--id-map", str(tmp_path / "map"), "--salt-file", str(salt_file)]
    for k, night in enumerate(nights):
        assert anonymize_night(tiny_tokenizer, [night], tmp_path / f"out{k}", *common) == 0
    assert anonymize_night(tiny_tokenizer, nights, tmp_path / "all") == 0
    assert b"".join(trace_bytes(tmp_path / f"out{k}") for k in range(3)) == trace_bytes(tmp_path / "all")
    metadata = current(tmp_path / "map")
    assert metadata["history"][-1]["compacted"] is True
    assert {f.split("/")[1][:6] for f in metadata["files"]["blocks"]} == {"000003"}
    stored = np.concatenate([pq.read_table(tmp_path / "map" / f).column("id").to_numpy()
                             for f in metadata["files"]["blocks"]])
    assert sorted(stored.tolist()) == list(range(metadata["next_id"]["blocks"]))


def test_map_holds_keyed_hashes_and_ids_only(tiny_tokenizer, tmp_path, nights, salt_file):
    assert anonymize_night(tiny_tokenizer, [nights[0]], tmp_path / "n1", "--id-map", str(tmp_path / "map"),
               "--salt-file", str(salt_file)) == 0
    segments = sorted((tmp_path / "map" / "segments").rglob("*.parquet"))
    assert segments
    for path in segments:
        assert pq.read_schema(path).names == ["hi", "lo", "id"]
    everything = b"".join(p.read_bytes() for p in (tmp_path / "map").rglob("*") if p.is_file())
    for secret in (SALT.encode(), b"quick", b"caching", b"user-1", str(nights[0]).encode()):
        assert secret not in everything


def test_mismatched_runs_are_refused(tiny_tokenizer, tmp_path, nights, salt_file, capsys):
    common = ["--id-map", str(tmp_path / "map")]
    assert anonymize_night(tiny_tokenizer, [nights[0]], tmp_path / "n1", *common, "--salt-file", str(salt_file)) == 0
    capsys.readouterr()

    other_salt = tmp_path / "other-salt"
    other_salt.write_text("a-different-salt-of-enough-bytes")
    assert anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "x", *common, "--salt-file", str(other_salt)) == 2
    err = capsys.readouterr().err
    assert "MAC does not verify with this run's salt" in err and "salt fingerprint" in err

    assert anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "x", *common, "--salt-file",
               str(salt_file), "--block-size", "8") == 2
    assert "block size: map has 4, this run has 8" in capsys.readouterr().err

    edited = tmp_path / "edited-tokenizer"
    shutil.copytree(tiny_tokenizer, edited)
    config = json.loads((edited / "tokenizer_config.json").read_text())
    config["chat_template"] = config.get("chat_template", "") + " "
    (edited / "tokenizer_config.json").write_text(json.dumps(config))
    assert anonymize_night(str(edited), [nights[1]], tmp_path / "x", *common, "--salt-file", str(salt_file)) == 2
    assert "tokenizer files (sha256)" in capsys.readouterr().err

    assert anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "x", *common, "--salt-file", str(salt_file),
               "--chat-template-kwargs", '{"enable_thinking": false}') == 2
    assert "chat template kwargs" in capsys.readouterr().err

    version = tmp_path / "map" / "versions" / "000001.json"
    metadata = json.loads(version.read_text())
    version.write_text(json.dumps({**metadata, "hash_scheme": "sha256-v0"}))  # edited in place
    assert anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "x", *common, "--salt-file", str(salt_file)) == 2
    assert "000001.json: its MAC does not verify" in capsys.readouterr().err
    other = {k: v for k, v in metadata.items() if k != "mac"} | {"hash_scheme": "sha256-v0"}
    version.write_bytes(map_record.keyed(other, KEY))  # another map's, keyed with this salt
    assert anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "x", *common, "--salt-file", str(salt_file)) == 2
    assert "hash scheme" in capsys.readouterr().err
    version.write_text(json.dumps({**metadata, "format_version": 99}))
    assert anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "x", *common, "--salt-file", str(salt_file)) == 2
    assert "format version 99" in capsys.readouterr().err

    assert anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "x", *common) == 2  # random salt
    assert "--id-map needs the same salt every run" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_requests_before_the_maps_origin_are_refused(tiny_tokenizer, tmp_path, nights, salt_file, capsys):
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


CHECKSUM = {"sha256": "0" * 64, "bytes": 1}
PARQUET_CHECKSUM = CHECKSUM | {"footer_sha256": "1" * 64}
TOKENIZER = {"tokenizer.json": "ab" * 32}
RUN = "0123456789ab"  # a run id, as new_run_id gives


def written(directory, *names: str) -> dict:
    """What a run wrote: block segment files (relative names) with checksums."""
    return {"blocks": [SegmentFile(f"{directory}/{name}", PARQUET_CHECKSUM, CHECKSUM)
                       for name in names], "sessions": []}


def night(base: id_map.MapVersion, time_from_ms: int = 0, identity: str = "a" * 64) -> id_map.Night:
    """A night extending base: its start where base stands."""
    return id_map.Night({"block_ids_from": base.next_id["blocks"],
                         "sessions_from": base.next_id["sessions"],
                         "time_from_ms": time_from_ms}, identity)


def test_next_version_numbers_after_the_base_and_records_each_night():
    identity = id_map.MapIdentity(KEY.salt_fingerprint, 4, TOKENIZER, "scheme", {})
    base = id_map.empty_version(identity)
    assert id_map.next_version("m", base, written("m"), {"blocks": 0, "sessions": 0},
                               False, 64, None, night(base)) is None  # no request
    first = id_map.next_version("m", base, written("m", f"segments/000001-{RUN}/blocks-00000.parquet"),
                                {"blocks": 7, "sessions": 0}, False, 64, 1234, night(base))
    assert (first.version, first.next_id, first.timestamp_origin_ms) == (1, {"blocks": 7, "sessions": 0}, 1234)
    assert first.history[-1] == {"version": 1, "added": {"blocks": 7, "sessions": 0},
                                 "compacted": False, "night": "a" * 64, "start": night(base).start}
    assert first.previous_sha256 is None  # born with the map, its id from its first night:
    assert first.map_id == id_map.map_id_of(base, night(base), first.checksums) != \
        id_map.map_id_of(base, night(base, 0, "c" * 64), first.checksums)  # another night's
    other_keys = {name: sum_ | {"sha256": "2" * 64} for name, sum_ in first.checksums.items()}
    assert id_map.map_id_of(base, night(base), other_keys) != first.map_id  # a night that
    # publishes the same bytes from other keys (its segments' digests) is another map
    stored = id_map.version_bytes(first, KEY)
    first = replace(first, record_sha256=hashlib.sha256(stored).hexdigest())  # as opened
    second = id_map.next_version("m", first, written("m", f"segments/000002-{RUN}/blocks-00003.parquet"),
                                 {"blocks": 2, "sessions": 0}, False, 64, 99,
                                 night(first, 60_000, "b" * 64))
    assert second.timestamp_origin_ms == 1234  # the first origin stays
    assert (second.map_id, second.previous_sha256) == (first.map_id, first.record_sha256)
    assert second.segments("blocks") == 2 and second.next_id["blocks"] == 9
    assert second.history[-1]["start"] == {"block_ids_from": 7, "sessions_from": 0,
                                           "time_from_ms": 60_000}
    read = map_record.read_record(id_map.version_bytes(second, KEY), "x", KEY)
    assert id_map.MapVersion.from_record(read) == second
    # A rerun of a night the map recorded adds nothing; another night of known ids only is
    # recorded, so the gate can confirm its start.
    assert id_map.next_version("m", second, written("m"), {"blocks": 0, "sessions": 0}, False,
                               64, 99, night(second, 0, "a" * 64)) is None
    known = id_map.next_version("m", second, written("m"), {"blocks": 0, "sessions": 0}, False,
                                64, 99, night(second, 120_000, "c" * 64))
    assert known.version == 3 and known.next_id == second.next_id
    compacted = id_map.next_version("m", second, written("m", f"segments/000003-{RUN}/blocks-00001.parquet"),
                                    {"blocks": 0, "sessions": 0}, True, 128, 99, night(second))
    assert compacted.files["blocks"] == [f"segments/000003-{RUN}/blocks-00001.parquet"]
    assert set(compacted.checksums) == {f"segments/000003-{RUN}/blocks-00001.parquet",
                                        f"segments/000003-{RUN}/blocks-00001.index.npz"}
    assert compacted.hash_shards == 128


def test_a_rerun_is_given_the_start_recorded_for_its_night():
    identity = id_map.MapIdentity(KEY.salt_fingerprint, 4, TOKENIZER, "scheme", {})
    base = id_map.empty_version(identity)
    first = id_map.next_version("m", base, written("m"), {"blocks": 7, "sessions": 2}, False,
                                64, 0, night(base, 0, "a" * 64))
    second = id_map.next_version("m", first, written("m"), {"blocks": 3, "sessions": 1}, False,
                                 64, 0, night(first, 60_000, "b" * 64))
    # A compacting rerun of night "b" records it again at the map's current start: a rerun
    # is given the first start recorded, the original's.
    again = id_map.next_version("m", second, written("m"), {"blocks": 0, "sessions": 0}, True,
                                64, 0, night(second, 60_000, "b" * 64))
    assert id_map.recorded_start(again, "b" * 64) == {"block_ids_from": 7, "sessions_from": 2,
                                                      "time_from_ms": 60_000}
    assert id_map.recorded_start(again, "a" * 64)["block_ids_from"] == 0
    assert id_map.recorded_start(again, "c" * 64) is None
    assert id_map.night_identity({"sha256": {"stats.json": "1" * 64}}) != \
        id_map.night_identity({"sha256": {"stats.json": "2" * 64}})


def test_a_night_not_beginning_where_the_map_stands_is_not_recorded():
    identity = id_map.MapIdentity(KEY.salt_fingerprint, 4, TOKENIZER, "scheme", {})
    base = id_map.empty_version(identity)
    first = id_map.next_version("m", base, written("m"), {"blocks": 7, "sessions": 2}, False,
                                64, 0, night(base))
    with pytest.raises(JobStopped, match="does not begin where the id map"):
        id_map.next_version("m", first, written("m"), {"blocks": 1, "sessions": 0}, False,
                            64, 0, night(base, 0, "b" * 64))


def test_a_map_of_an_older_format_is_refused_with_what_to_do():
    identity = id_map.MapIdentity(KEY.salt_fingerprint, 4, TOKENIZER, "scheme", {})
    old = {**id_map.empty_version(identity).record(), "format_version": 1}
    with pytest.raises(id_map.IdMapError, match="format version 1.*Start a new map"):
        map_record.read_record(map_record.record_bytes(old), "versions/000001.json", KEY)


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
        version_1["next_id"]["blocks"], version_1["next_id"]["sessions"])
    assert start == current(tmp_path / "map")["history"][-1]["start"]
    assert anonymize_night(tiny_tokenizer, list(nights), tmp_path / "both") == 0
    assert trace_bytes(tmp_path / "n1") + trace_bytes(tmp_path / "n2") == trace_bytes(tmp_path / "both")


def test_cleanup_keeps_published_and_live_segments(tmp_path):
    identity = id_map.MapIdentity("f" * 16, 4, {}, "scheme", {})
    published = id_map.next_version(
        str(tmp_path), id_map.empty_version(identity),
        written(tmp_path, "segments/000001-winner/blocks-00000.parquet"),
        {"blocks": 1, "sessions": 0}, False, 64, 0, night(id_map.empty_version(identity)))
    (tmp_path / "segments" / "000001-winner").mkdir(parents=True)
    id_map.publish(str(tmp_path), id_map.empty_version(identity), published, KEY)
    for folder in ("000001-winner", "000001-loser", "000002-live"):
        (tmp_path / "segments" / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / "segments" / folder / "blocks-00000.parquet").write_bytes(b"x")
    removed = id_map.discard_abandoned(str(tmp_path), published, KEY)
    assert [Path(p).parent.name for p in removed] == ["000001-loser"]
    left = {p.parent.name for p in (tmp_path / "segments").rglob("*.parquet")}
    assert left == {"000001-winner", "000002-live"}


def test_a_second_writer_is_refused_at_publish_time(tmp_path):
    identity = id_map.MapIdentity("f" * 16, 4, {}, "scheme", {})
    def version(base):
        return id_map.next_version(str(tmp_path), base, written(tmp_path),
                                   {"blocks": 1, "sessions": 0}, False, 64, 0, night(base))

    empty = id_map.empty_version(identity)
    id_map.publish(str(tmp_path), empty, version(empty), KEY)  # the other run, first to finish
    with pytest.raises(JobStopped, match="extended by another run"):
        id_map.publish(str(tmp_path), empty, version(empty), KEY)
    assert id_map.current_version_number(str(tmp_path)) == 1


def test_another_shard_count_re_splits_the_map_and_keeps_ids(tiny_tokenizer, tmp_path, nights, salt_file):
    common = ["--id-map", str(tmp_path / "map"), "--salt-file", str(salt_file)]
    assert anonymize_night(tiny_tokenizer, [nights[0]], tmp_path / "n1", *common) == 0
    assert current(tmp_path / "map")["hash_shards"] == 64
    assert anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "n2", *common, "--hash-shards", "7") == 0
    assert anonymize_night(tiny_tokenizer, list(nights), tmp_path / "both") == 0
    assert trace_bytes(tmp_path / "n1") + trace_bytes(tmp_path / "n2") == trace_bytes(tmp_path / "both")
    metadata = current(tmp_path / "map")
    assert metadata["hash_shards"] == 7 and metadata["history"][-1]["compacted"] is True
    shards = {id_map.shard_of_segment(name) for name in metadata["files"]["blocks"]}
    assert shards <= set(range(7)) and len({name.split("/")[1] for name in metadata["files"]["blocks"]}) == 1
    # The next night keeps the map's count without being told, and does not fold again.
    assert anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "n2-again", *common) == 0
    assert current(tmp_path / "map")["hash_shards"] == 7


def test_segment_files_group_by_the_shard_their_name_holds_in_path_order():
    def segment(path: str) -> SegmentFile:
        return SegmentFile(path, {}, {})

    files = [segment("m/segments/000002-b/blocks-00003.parquet"),
             segment("m/segments/000001-a/blocks-00003.parquet"),
             segment("m/segments/000001-a/blocks-00000.parquet")]
    grouped = id_map.segment_files_by_shard(files)
    assert {shard: [f.path for f in group] for shard, group in grouped.items()} == {
        0: ["m/segments/000001-a/blocks-00000.parquet"],
        3: ["m/segments/000001-a/blocks-00003.parquet", "m/segments/000002-b/blocks-00003.parquet"]}


def test_segments_settle_in_a_folder_their_content_names_whatever_run_wrote_them(tmp_path):
    rows = np.array([(1, 2, 0), (3, 4, 1)], dtype=NUMBERED)
    settled = []
    for run in ("0123456789ab", "ba9876543210"):
        directory = tmp_path / run
        shard = id_map.write_segment_shard(str(directory), 1, run, "blocks", 0, [], [rows])
        moved = id_map.settle_segments(str(directory), 1, {"blocks": [shard], "sessions": []})
        settled.append((moved["blocks"][0]._replace(path=id_map.relative(
            str(directory), moved["blocks"][0].path)), sorted(
            str(p.relative_to(directory)) for p in directory.rglob("*"))))
    assert settled[0] == settled[1]  # same name, same checksums, nothing else left
    assert settled[0][0].path.split("/")[1] != "000001-0123456789ab"
    other = id_map.write_segment_shard(str(tmp_path / "x"), 1, RUN, "blocks", 0, [], [rows[:1]])
    moved = id_map.settle_segments(str(tmp_path / "x"), 1, {"blocks": [other], "sessions": []})
    assert moved["blocks"][0].path.split("/")[-2] != settled[0][0].path.split("/")[1]


def _map_of_nights(directory: Path, *nights: str) -> list[bytes]:
    """A map of one version per night (no ids added: records only), as commits write it."""
    base = id_map.empty_version(id_map.MapIdentity(KEY.salt_fingerprint, 4, TOKENIZER,
                                                   "scheme", {}))
    records = []
    for tag in nights:
        new = id_map.next_version(str(directory), base, written(directory),
                                  {"blocks": 0, "sessions": 0}, False, 64, 99,
                                  night(base, 0, tag * 64))
        records.append(id_map.publish(str(directory), base, new, KEY))
        base = replace(new, record_sha256=hashlib.sha256(records[-1]).hexdigest())
    return records


def test_a_maps_history_is_verified_whole_from_version_one_to_its_newest(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    records = _map_of_nights(ours, "a", "b", "c")
    assert id_map.verified_newest(str(ours), KEY)[1] == records[-1]
    _map_of_nights(theirs, "d", "e")
    nights = [entry["night"] for entry in id_map.recorded_history(str(ours), KEY)]
    assert nights == ["a" * 64, "b" * 64, "c" * 64]  # the newest record's: every night
    for spliced in (2, 1):  # each record verifies on its own, but follows no record of ours
        shutil.copy(theirs / "versions" / f"00000{spliced}.json",
                    ours / "versions" / f"00000{spliced}.json")
        with pytest.raises(IdMapError, match="do not form one chain") as caught:
            id_map.verified_newest(str(ours), KEY)
        assert "\n" not in str(caught.value)
        with pytest.raises(IdMapError, match="do not form one chain"):  # the run's open
            id_map.open_map(str(ours), id_map.empty_version(id_map.MapIdentity(
                KEY.salt_fingerprint, 4, TOKENIZER, "scheme", {})).identity, KEY)
        # the gate confirms nights by the newest record, which names ours only
        assert [e["night"] for e in id_map.recorded_history(str(ours), KEY)] == nights
