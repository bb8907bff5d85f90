"""The id map is keyed, and every read checks it: a version record altered in any field, in any
way (another value, another type, a repeated, missing or unknown key), is refused with one line
naming the file, whether or not its checksums were recomputed; a record re-keyed by someone
holding the salt still cannot carry a value of the wrong type or range, and segment rows of
another shard or beyond next_id are refused as they are read. A format-3 record is refused
wherever it appears; a map built before keying is keyed once, on purpose."""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import anonymize_night, chat, trace_bytes, write_jsonl
from kvtrace.transforms.errors import IdMapError, JobStopped
from kvtrace.transforms.ids import id_map, map_record
from kvtrace.transforms.ids.dense_ids import NUMBERED
from kvtrace.transforms.ids.map_record import (
    KINDS,
    MapKey,
    keyed,
    map_key,
    read_record,
    record_bytes,
)
from kvtrace.transforms.ids.segments import (
    checksum,
    index_path,
    parquet_checksum,
    read_matching,
    read_segment,
    write_segment,
)

DAY_MS = 86_400_000
SALT = b"keyed-map-test-salt-of-32-bytes!"
KEY = map_key(SALT)
# Values a hostile or broken copy might hold in place of any field.
HOSTILE = [-5, 2**63 - 1, 2**63, 1.0, True, False, "1", None, [], {}, "", 0.5]


def nightless(history: list[dict]) -> list[dict]:
    """A history as kvtrace wrote it before id map format 6: no entry names its night."""
    return [{k: entry[k] for k in ("version", "added", "compacted")} for entry in history]


# The first night of a map: it begins at 0, 0, 0.
FIRST_NIGHT = id_map.Night({"block_ids_from": 0, "sessions_from": 0, "time_from_ms": 0}, "0" * 64)


def _night(folder: Path, day: int) -> Path:
    records = [
        chat(
            i + 3 * day, day * DAY_MS + 1_000 + 611 * i, f"user-{day}-{i % 5}", rotate=(i + day) % 4
        )
        for i in range(30)
    ]
    return write_jsonl(folder / f"night{day}.jsonl", records)


@pytest.fixture(scope="module")
def built(tiny_tokenizer, tmp_path_factory):
    """A map of two nights over 3 hash shards, the third night's logs and the output of an
    undamaged third night."""
    folder = tmp_path_factory.mktemp("keyed")
    (folder / "salt").write_bytes(SALT)
    nights = [_night(folder, day) for day in range(3)]
    common = ["--salt-file", str(folder / "salt"), "--hash-shards", "3"]
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
    shutil.copytree(folder / "map", folder / "reference-map")
    # with its marks: a committed map with none is refused (only a first commit finds none)
    shutil.copytree(folder / "salt.id-map-marks", folder / "reference-marks")
    assert (
        anonymize_night(
            tiny_tokenizer,
            [nights[2]],
            folder / "expected",
            "--id-map",
            str(folder / "reference-map"),
            "--id-map-marks",
            str(folder / "reference-marks"),
            *common,
        )
        == 0
    )  # a copy: its own
    return folder, nights[2], common


@pytest.fixture(scope="module")
def scratch(built, tmp_path_factory) -> Path:
    """A copy of the map that tests alter and restore (record() puts the record back)."""
    folder, _, _ = built
    copy = tmp_path_factory.mktemp("scratch") / "map"
    shutil.copytree(folder / "map", copy)
    return copy


def _record_path(map_dir: Path) -> Path:
    return map_dir / "versions" / f"{id_map.current_version_number(str(map_dir)):06d}.json"


def _record(map_dir: Path) -> dict[str, Any]:
    return json.loads(_record_path(map_dir).read_bytes())


@pytest.fixture(scope="module")
def identity(built) -> id_map.MapIdentity:
    """The settings of the runs that built the map (and of every run reading it here)."""
    folder, _, _ = built
    return id_map.MapVersion.from_record(_record(folder / "map")).identity


def read_everything(map_dir: Path, identity: id_map.MapIdentity, key: MapKey = KEY) -> int:
    """What a night reads of a map, and more: its version, every segment row whole and by key
    lookup. Returns the rows read."""
    directory = str(map_dir)
    version = id_map.open_map(directory, identity, key)
    id_map.discard_abandoned(directory, version, key)
    count = 0
    for kind in KINDS:
        for segment in version.segment_files(directory, kind):
            rows = np.concatenate(
                [t for _, t in read_segment(segment, version.hash_shards)] + [np.empty(0, NUMBERED)]
            )
            assert len(read_matching(segment, rows).rows) == len(rows)
            count += len(rows)
    return count


def refused(map_dir: Path, identity: id_map.MapIdentity, key: MapKey = KEY) -> str:
    """The one-line message reading the map stops with."""
    with pytest.raises((IdMapError, JobStopped)) as caught:
        read_everything(map_dir, identity, key)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    return message


class Altered:
    """The map's current record replaced while in the block, put back after."""

    def __init__(self, map_dir: Path, data: bytes):
        self.path, self.data = _record_path(map_dir), data

    def __enter__(self) -> None:
        self.original = self.path.read_bytes()
        self.path.write_bytes(self.data)

    def __exit__(self, *_: Any) -> None:
        self.path.write_bytes(self.original)


def _leaves(value: Any, path: tuple = ()) -> list[tuple]:
    """Every path to a value in a JSON record (objects and lists, and their contents)."""
    found = [path]
    if isinstance(value, dict):
        found += [p for k, v in value.items() for p in _leaves(v, (*path, k))]
    elif isinstance(value, list):
        found += [p for i, v in enumerate(value) for p in _leaves(v, (*path, i))]
    return found


def _at(record: Any, path: tuple) -> Any:
    for step in path:
        record = record[step]
    return record


def _replaced(record: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    copy = json.loads(json.dumps(record))
    holder = copy
    for step in path[:-1]:
        holder = holder[step]
    holder[path[-1]] = value
    return copy


def _variants(old: Any) -> list[Any]:
    """Values of another type or out of range for what a field held, and the same number
    under another type (1 == 1.0 == True in Python, but not in a record)."""
    near = [old + 1, float(old)] if type(old) is int else []
    return [v for v in HOSTILE + near if not (type(v) is type(old) and v == old)]


def test_an_unaltered_map_reads_whole(identity, scratch):
    record = _record(scratch)
    assert record["format_version"] == map_record.FORMAT_VERSION and "sha256" not in record
    assert read_everything(scratch, identity) == sum(record["next_id"].values())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_field_altered_is_refused_by_the_mac(identity, scratch, data):
    record = _record(scratch)
    path = data.draw(st.sampled_from(_leaves(record)[1:]), label="path")
    value = data.draw(st.sampled_from(_variants(_at(record, path))), label="value")
    with Altered(scratch, record_bytes(_replaced(record, path, value))):
        message = refused(scratch, identity)
    assert "000002.json" in message


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_rekeyed_record_still_holds_only_values_kvtrace_writes(identity, scratch, data):
    """As if the salt's holder (or a kvtrace bug) wrote it: types and ranges are still checked."""
    record = _record(scratch)
    content = {k: v for k, v in record.items() if k != "mac"}
    path = data.draw(st.sampled_from(_leaves(content)[1:]), label="path")
    old = _at(content, path)
    nullable = path in (("tokenization",), ("timestamp_origin_ms",))
    wrong = [
        v
        for v in HOSTILE + ([float(old)] if type(old) is int else [])
        if type(v) is not type(old) and not (nullable and v is None)
    ]
    wrong += [-5, 2**63 - 1] if type(old) is int else []
    value = data.draw(st.sampled_from(wrong), label="value")
    with Altered(scratch, keyed(_replaced(content, path, value), KEY)):
        refused(scratch, identity)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), keyless=st.booleans())
def test_a_record_damaged_anywhere_is_refused_in_one_line(scratch, data, keyless):
    """Fuzz: bytes of a record overwritten, cut out or put in: refused with an IdMapError,
    never another exception (a format-3 record, checked by the sha256 of its content when it
    is keyed on purpose, may still read when only its layout changed, and then reads as it
    was)."""
    record = _record(scratch)
    if keyless:
        for later in (
            "mac",
            "timestamp_kind",
            "map_id",
            "previous_sha256",
            *map_record.TIMES,
        ):  # after format 3
            del record[later]
        record["history"] = nightless(record["history"])
        record["format_version"] = map_record.KEYLESS_FORMAT
        record["sha256"] = map_record.keyless_checksum(record)
    raw = bytearray(record_bytes(record))
    start = data.draw(st.integers(0, len(raw) - 1), label="at")
    span = data.draw(st.integers(0, 8), label="span")
    raw[start : start + span] = data.draw(
        st.binary(max_size=8).filter(lambda b: b != raw[start : start + span]), label="put"
    )
    read = map_record.read_keyless_record if keyless else functools.partial(read_record, key=KEY)
    try:
        found = read(bytes(raw), "versions/000002.json")
    except IdMapError as err:
        assert "\n" not in str(err) and "versions/000002.json" in str(err)
    else:
        assert keyless and found == record


@pytest.mark.parametrize("next_id", [-5, 2**63 - 1, 1.0, True, "1", None])
@pytest.mark.parametrize("rekeyed", [False, True])
def test_next_id_of_another_value_or_type_is_refused(identity, scratch, next_id, rekeyed):
    record = _record(scratch)
    content = {k: v for k, v in record.items() if k != "mac"}
    altered = {**content, "next_id": {**content["next_id"], "blocks": next_id}}
    data = keyed(altered, KEY) if rekeyed else record_bytes(altered | {"mac": record["mac"]})
    with Altered(scratch, data):
        message = refused(scratch, identity)
    assert ("next_id" in message) if rekeyed else ("MAC does not verify" in message)


@pytest.mark.parametrize("edit", ["repeat", "unknown", "missing", "spacing", "overflow", "mac"])
def test_a_record_not_in_kvtraces_form_is_refused_even_with_the_same_content(
    identity, scratch, edit
):
    record = _record(scratch)
    raw = _record_path(scratch).read_bytes()
    if edit == "repeat":  # the same key twice, the same value: the parsed content is unchanged
        data = _signed(raw.removesuffix(b"}\n") + b',"version":%d}\n' % record["version"])
    elif edit == "unknown":
        content = {k: v for k, v in record.items() if k != "mac"} | {"note": "x"}
        data = keyed(content, KEY)
    elif edit == "missing":
        data = keyed({k: v for k, v in record.items() if k not in ("mac", "history")}, KEY)
    elif edit == "mac":  # not even hex (compare_digest refuses non-ASCII strings)
        data = record_bytes(record | {"mac": "\u00e9" * 64})
    elif edit == "overflow":  # a float no record holds (inf once parsed)
        data = _signed(re.sub(rb'"timestamp_origin_ms":\d+', b'"timestamp_origin_ms":1e999', raw))
    else:
        data = json.dumps(record, sort_keys=True).encode()  # the MAC still matches its content
    with Altered(scratch, data):
        message = refused(scratch, identity)
    assert {
        "repeat": "a key repeats",
        "unknown": "unknown key 'note'",
        "missing": "no 'history'",
        "spacing": "not the form kvtrace writes",
        "overflow": "1e999 is out of range",
        "mac": "MAC does not verify",
    }[edit] in message


def _signed(edited: bytes) -> bytes:
    """Bytes edited after their mac member, MACed again as keyed would (a holder of the salt's
    edit): the MAC verifies, so only the parse's checks can refuse them (unverified bytes are
    never parsed: map_record.unverified_members)."""
    at = edited.index(b',"mac":"')
    body = edited[:at] + edited[at + len(b',"mac":"') + 65 :]
    mac = hmac.new(KEY.mac, body, hashlib.sha256).hexdigest().encode()
    return body[:at] + b',"mac":"' + mac + b'"' + body[at:]


def _swap_segments(map_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Shards 0 and 1 of the last segment traded, files and indexes, checksums recomputed."""
    folder = record["files"]["blocks"][-1].split("/")[1]
    first, second = [n for n in record["files"]["blocks"] if n.split("/")[1] == folder][:2]
    checksums = dict(record["checksums"])
    for a, b in ((first, second), (index_path(first), index_path(second))):
        data_a, data_b = (map_dir / a).read_bytes(), (map_dir / b).read_bytes()
        (map_dir / a).write_bytes(data_b)
        (map_dir / b).write_bytes(data_a)
        checksums[a], checksums[b] = checksums[b], checksums[a]
    return {k: v for k, v in record.items() if k != "mac"} | {"checksums": checksums}


@pytest.mark.parametrize("rekeyed", [False, True])
def test_segments_swapped_between_shards_with_checksums_recomputed_are_refused(
    identity, built, tmp_path, rekeyed
):
    folder, _, _ = built
    map_dir = tmp_path / "map"
    shutil.copytree(folder / "map", map_dir)
    record = _record(map_dir)
    altered = _swap_segments(map_dir, record)
    _record_path(map_dir).write_bytes(
        keyed(altered, KEY) if rekeyed else record_bytes(altered | {"mac": record["mac"]})
    )
    message = refused(map_dir, identity)
    assert (
        ("holds keys of another hash shard" in message)
        if rekeyed
        else ("MAC does not verify" in message)
    )


def test_a_segment_with_ids_beyond_next_id_is_refused_as_it_is_read(identity, built, tmp_path):
    folder, _, _ = built
    map_dir = tmp_path / "map"
    shutil.copytree(folder / "map", map_dir)
    record = _record(map_dir)
    name = record["files"]["blocks"][-1]
    version = id_map.MapVersion.from_record(record)
    segment = next(
        s for s in version.segment_files(str(map_dir), "blocks") if s.path.endswith(name)
    )
    rows = np.concatenate([t for _, t in read_segment(segment, version.hash_shards)])
    rows["id"][0] = record["next_id"]["blocks"]  # an id the map never gave out
    written = write_segment(str(map_dir / name), [rows])
    checksums = record["checksums"] | {name: written.data, index_path(name): written.index}
    assert written.data == parquet_checksum((map_dir / name).read_bytes())
    assert written.index == checksum((map_dir / index_path(name)).read_bytes())
    content = {k: v for k, v in record.items() if k != "mac"} | {"checksums": checksums}
    _record_path(map_dir).write_bytes(keyed(content, KEY))  # re-keyed: only the rows tell
    assert "ids outside [0," in refused(map_dir, identity)


def test_a_wrong_salt_is_refused_with_what_to_do(identity, scratch):
    other = map_key(b"another-salt-of-enough-bytes-32!")
    message = refused(scratch, replace(identity, salt_fingerprint=other.salt_fingerprint), other)
    assert "MAC does not verify with this run's salt" in message
    assert "restore the id map from a backup" in message and "salt fingerprint" in message


def test_a_night_refuses_an_altered_map_in_one_line_and_publishes_nothing(
    tiny_tokenizer, built, tmp_path, capsys
):
    folder, night, common = built
    map_dir = tmp_path / "map"
    shutil.copytree(folder / "map", map_dir)
    record = _record(map_dir)
    _record_path(map_dir).write_bytes(
        record_bytes(_swap_segments(map_dir, record) | {"mac": record["mac"]})
    )
    capsys.readouterr()
    assert (
        anonymize_night(
            tiny_tokenizer, [night], tmp_path / "out", "--id-map", str(map_dir), *common
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "versions/000002.json" in err, err
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert not (map_dir / "versions" / "000003.json").exists()


def _as_format_3(map_dir: Path) -> None:
    """Every version record rewritten as kvtrace wrote them before keying (format 3)."""
    for path in sorted((map_dir / "versions").glob("*.json")):
        _downgraded(path)


def test_a_format_3_map_is_refused_until_keyed_on_purpose(
    identity, tiny_tokenizer, built, tmp_path, capsys
):
    folder, night, common = built
    map_dir = tmp_path / "map"
    shutil.copytree(folder / "map", map_dir)
    _as_format_3(map_dir)
    assert "of id map format 3: unkeyed" in refused(map_dir, identity)
    capsys.readouterr()
    assert (
        anonymize_night(
            tiny_tokenizer, [night], tmp_path / "refused", "--id-map", str(map_dir), *common
        )
        != 0
    )
    assert "key it once with its salt" in capsys.readouterr().err
    # as `kvtrace id-map upgrade` keys it, and marks it: a keyed map with no mark is refused
    marks = str(folder / "salt.id-map-marks")
    assert id_map.upgrade_map(str(map_dir), KEY, marks) == (2, [1, 2])
    assert id_map.key_format_3_map(str(map_dir), KEY) == []  # done: every record keyed
    assert (
        anonymize_night(
            tiny_tokenizer, [night], tmp_path / "out", "--id-map", str(map_dir), *common
        )
        == 0
    )
    assert trace_bytes(tmp_path / "out") == trace_bytes(folder / "expected")
    keyed_record = _record(map_dir)
    assert keyed_record["version"] == 3 and "mac" in keyed_record
    assert read_everything(map_dir, identity) == sum(keyed_record["next_id"].values())


def test_keying_checks_each_format_3_record_by_its_sha256_and_salt(identity, built, tmp_path):
    folder, _, _ = built
    map_dir = tmp_path / "map"
    shutil.copytree(folder / "map", map_dir)
    _as_format_3(map_dir)
    record = _record(map_dir)
    original = _record_path(map_dir).read_bytes()
    _record_path(map_dir).write_bytes(record_bytes({**record, "timestamp_origin_ms": 0}))
    with pytest.raises(IdMapError, match="does not match its sha256"):
        id_map.key_format_3_map(str(map_dir), KEY)
    _record_path(map_dir).write_bytes(original)
    with pytest.raises(IdMapError, match="nothing was keyed"):
        id_map.key_format_3_map(str(map_dir), map_key(b"another-salt-of-enough-bytes-32!"))
    assert id_map.key_format_3_map(str(map_dir), KEY) == [1, 2]  # versions 1 and 2
    assert read_everything(map_dir, identity) == sum(_record(map_dir)["next_id"].values())


def _downgraded(path: Path) -> None:
    """A keyed record rewritten as format 3, its sha256 recomputed: no salt needed."""
    record = json.loads(path.read_bytes())
    for later in (
        "mac",
        "timestamp_kind",
        "map_id",
        "previous_sha256",
        *map_record.TIMES,
    ):  # after format 3
        del record[later]
    record["history"] = nightless(record["history"])
    record["format_version"] = map_record.KEYLESS_FORMAT
    path.write_bytes(record_bytes(record | {"sha256": map_record.keyless_checksum(record)}))


def test_a_keyed_record_downgraded_to_format_3_is_refused_wherever_it_appears(
    identity, built, tmp_path
):
    """The newest record or an older one (read when cleaning up), its sha256 recomputed."""
    folder, _, _ = built
    for number in (1, 2):
        map_dir = tmp_path / f"map{number}"
        shutil.copytree(folder / "map", map_dir)
        _downgraded(map_dir / "versions" / f"{number:06d}.json")
        (map_dir / "segments" / "000001-abandoned0000").mkdir()  # cleanup reads version 1
        (map_dir / "segments" / "000001-abandoned0000" / "blocks-00000.parquet").write_bytes(b"")
        assert f"{number:06d}.json is of id map format 3" in refused(map_dir, identity)


def test_a_format_3_record_above_a_keyed_one_is_an_edit_to_the_read_and_to_keying(
    identity, built, tmp_path
):
    """Keying would key the edit and make it the map's: the read calls it an edit (it does not
    send the operator to key it), keying refuses it, and a staged file that is not the record's
    keyed form does not make it one kvtrace left."""
    folder, _, _ = built
    map_dir = tmp_path / "map"
    shutil.copytree(folder / "map", map_dir)
    newest = map_dir / "versions" / "000002.json"
    _downgraded(newest)
    message = refused(map_dir, identity)
    assert "000002.json is of id map format 3 above a keyed version" in message
    assert "upgrade" not in message
    forged = newest.read_bytes()
    for staged in (None, (map_dir / "versions" / "000001.json").read_bytes()):
        if staged is not None:
            Path(f"{newest}{id_map.KEYED_STAGE}").write_bytes(staged)
        with pytest.raises(IdMapError, match="in a map keyed already .version 1 is.") as caught:
            id_map.key_format_3_map(str(map_dir), KEY)
        assert "\n" not in str(caught.value) and newest.read_bytes() == forged


def test_an_interrupted_keying_leaves_no_format_3_record_above_a_keyed_one_and_finishes(
    identity, built, tmp_path, monkeypatch
):
    """Killed between its renames (newest first), keying leaves the older records in format 3
    (read as a map to key, not as an edit); the rerun keys them from what the first run
    staged, and the map reads as it did before it was unkeyed."""
    from kvtrace.transforms import storage

    folder, _, _ = built
    map_dir = tmp_path / "map"
    shutil.copytree(folder / "map", map_dir)
    _as_format_3(map_dir)
    rename, renamed = storage.rename, []

    def killed_after_one_record(source: str, target: str) -> None:
        if target.endswith(".json") and renamed:
            raise KeyboardInterrupt  # the run killed here
        renamed.extend([target] if target.endswith(".json") else [])
        rename(source, target)

    monkeypatch.setattr(storage, "rename", killed_after_one_record)
    with pytest.raises(KeyboardInterrupt):
        id_map.key_format_3_map(str(map_dir), KEY)
    monkeypatch.undo()
    assert renamed == [str(map_dir / "versions" / "000002.json")]
    id_map.read_version_record(str(map_dir), 2, KEY)  # keyed
    with pytest.raises(IdMapError, match="unkeyed, so anyone can rewrite it.*upgrade"):
        id_map.read_version_record(str(map_dir), 1, KEY)
    assert id_map.key_format_3_map(str(map_dir), KEY) == [1]
    assert id_map.key_format_3_map(str(map_dir), KEY) == []  # a keyed map: only verified
    keyed_id = json.loads((map_dir / "versions" / "000001.json").read_bytes())["map_id"]
    previous = None  # each keyed record chained to the one before it, all of one id
    for path in sorted((folder / "map" / "versions").iterdir()):  # what the map held before
        before = json.loads(path.read_bytes())  # its nights' record lost with format 3
        expected = keyed(
            {k: v for k, v in before.items() if k != "mac"}
            | {
                "history": nightless(before["history"]),
                "map_id": keyed_id,
                "previous_sha256": previous,
                "published_days": {},  # its nights' times lost with format 3 too
                "published_to_ms": None,
            },
            KEY,
        )
        assert (map_dir / "versions" / path.name).read_bytes() == expected
        previous = hashlib.sha256(expected).hexdigest()
    assert sorted(p.name for p in (map_dir / "versions").iterdir()) == [
        "000001.json",
        "000002.json",
    ]
    assert read_everything(map_dir, identity) == read_everything(folder / "map", identity)


def test_settings_a_record_cannot_hold_are_refused_when_the_map_opens(tmp_path):
    identity = id_map.MapIdentity(KEY.salt_fingerprint, 4, {}, "scheme", {"t": float("nan")})
    with pytest.raises(IdMapError, match="cannot record this run's settings"):
        id_map.open_map(str(tmp_path / "map"), identity, KEY)


def test_a_version_past_the_id_bound_is_not_published(tmp_path):
    identity = id_map.MapIdentity(KEY.salt_fingerprint, 4, {}, "scheme", {})
    with pytest.raises(JobStopped, match="would pass"):
        id_map.next_version(
            str(tmp_path),
            id_map.empty_version(identity),
            {"blocks": [], "sessions": []},
            {"blocks": map_record.MAX_IDS + 1, "sessions": 0},
            False,
            3,
            0,
            FIRST_NIGHT,
        )
