"""The id map is keyed, and every read checks it: a version record altered in any field, in any
way (another value, another type, a repeated, missing or unknown key), is refused with one line
naming the file, whether or not its checksums were recomputed; a record re-keyed by someone
holding the salt still cannot carry a value of the wrong type or range, and segment rows of
another shard or beyond next_id are refused as they are read. A format-3 record is refused
wherever it appears; a map built before keying is keyed once, on purpose.

The unit tests; the whole CLI runs are in tests/e2e/test_id_map_keyed_nights.py."""

from __future__ import annotations

import pytest

from kvtrace.transforms.encode.blocks import chain_seed
from kvtrace.transforms.errors import IdMapError
from kvtrace.transforms.ids import id_map, map_record
from kvtrace.transforms.ids.map_record import map_key, read_record

SALT = b"keyed-map-test-salt-of-32-bytes!"


KEY = map_key(SALT)


def test_the_map_key_is_a_subkey_of_its_own():
    key = map_key(SALT)
    assert len(key.mac) == 32 and key.mac not in (SALT, chain_seed(SALT))
    assert key.mac != map_key(SALT + b"!").mac
    assert key.mac.hex() not in repr(key) and str(key.mac) not in repr(key)


def test_identities_differ_by_type_as_well_as_value():
    base = id_map.MapIdentity(KEY.salt_fingerprint, 4, {}, "scheme", {"thinking": 1})
    for other in (
        id_map.MapIdentity(KEY.salt_fingerprint, 4.0, {}, "scheme", {"thinking": 1}),
        id_map.MapIdentity(KEY.salt_fingerprint, 4, {}, "scheme", {"thinking": True}),
    ):
        assert base.differences(other)
    assert not base.differences(
        id_map.MapIdentity(KEY.salt_fingerprint, 4, {}, "scheme", {"thinking": 1})
    )


def test_records_read_are_bounded_in_size(monkeypatch):
    monkeypatch.setattr(map_record, "MAX_RECORD_BYTES", 1024)
    with pytest.raises(IdMapError, match="over"):
        read_record(b" " * 1025, "versions/000001.json", KEY)


def _keyed_record(kwargs: dict) -> bytes:
    identity = id_map.MapIdentity(KEY.salt_fingerprint, 4, {}, "scheme", kwargs)
    start = {"block_ids_from": 0, "sessions_from": 0, "time_from_ms": 0}
    version = id_map.next_version(
        "m",
        id_map.empty_version(identity),
        {"blocks": [], "sessions": []},
        {"blocks": 1, "sessions": 0},
        False,
        4,
        0,
        id_map.Night(start, "a" * 64),
        id_map.NightTimes({3: 1}, 0),
    )
    return id_map.version_bytes(version, KEY)


def test_the_mac_verified_is_the_records_own_member_not_one_nested_before_it():
    """chat_template_kwargs sort before the record's mac and may hold a member of that name,
    and brackets in their strings: the MAC is the top level's (brackets counted outside
    strings), so the record reads, and a copy of it keyed by another salt does not."""
    kwargs = {"a": "]]}", "mac": "ab" * 32, "z": ["[{", {"b": 1, "mac": "cd" * 32}]}
    raw = _keyed_record(kwargs)
    assert raw.count(b',"mac":"') == 3 and raw.index(b',"mac":"') < raw.index(b'"history"')
    assert read_record(raw, "v", KEY)["chat_template_kwargs"] == kwargs
    with pytest.raises(IdMapError, match="MAC does not verify"):
        read_record(raw, "v", map_key(SALT + b"!"))


def test_no_reader_parses_an_unverified_record_whole(monkeypatch):
    """Unverified bytes (no MAC that verifies) are never parsed whole: every reader of a record
    refuses it, or reads its chain, from a few top-level members of bounded size; only keying
    a format-3 map (read_keyless_record) parses one, within its bounds."""
    from kvtrace.transforms.ids import anchor

    monkeypatch.setattr(map_record, "MAX_RECORD_CONTAINERS", 10)
    parses = []
    monkeypatch.setattr(map_record.json, "loads", lambda *a, **k: parses.append(a))
    head = b'{"format":"kvtrace-id-map","format_version":%d,"previous_sha256":"' + b"a" * 64
    lists = head % 7 + b'","x":[{"format_version":3},' + b"[]," * 10 + b"[]]}\n"
    with pytest.raises(IdMapError, match="000002.json: its MAC does not verify.*no salt"):
        read_record(lists, "versions/000002.json", KEY)
    assert map_record.format_of(lists, "versions/000002.json") == 7
    with pytest.raises(IdMapError, match="000002.json is of id map format 7, not 3"):
        map_record.read_keyless_record(lists, "versions/000002.json")
    with pytest.raises(IdMapError, match="000002.json.*14 objects and lists"):
        map_record.read_keyless_record(head % 3 + lists[len(head % 7) :], "versions/000002.json")
    assert anchor.previous_sha256(lists) == "a" * 64
    assert parses == []


def test_a_format_3_record_of_many_values_is_refused_before_its_parse(monkeypatch):
    """Keying's whole parse of a format-3 record is bounded by its values too (each follows a
    comma, a colon or a bracket): short strings past MAX_RECORD_COMMAS are refused unparsed."""
    monkeypatch.setattr(map_record, "MAX_RECORD_COMMAS", 10)
    parses = []
    monkeypatch.setattr(map_record.json, "loads", lambda *a, **k: parses.append(a))
    strings = b'{"format":"kvtrace-id-map","format_version":3,"x":[' + b'"ab",' * 10 + b'"ab"]}'
    with pytest.raises(IdMapError, match="000001.json.*over the 10 values a record holds"):
        map_record.read_keyless_record(strings, "versions/000001.json")
    assert parses == []


def test_a_value_an_unverified_record_names_is_shown_escaped_in_one_line():
    raw = b'{"format":"kvtrace-id-map","format_version":7,"salt_fingerprint":"a\\nb\\u001b"}'
    with pytest.raises(
        IdMapError, match=r'names salt fingerprint "a\\nb\\u001b" \(str\)'
    ) as refused:
        read_record(raw, "versions/000002.json", KEY)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "kwargs",
    [{'}"format_version': 3}, {'}"previous_sha256': "c" * 64}, {'{"previous_sha256': "c" * 64}]
    + [{'a]"previous_sha256': "c" * 64}, {'}"x': 1}],
)
def test_a_key_holding_an_escaped_quote_and_a_members_name_is_not_that_member(kwargs):
    """A member is read only where a key begins: a chat_template_kwargs key holding `}"` or
    `{"` and a member's name neither stands for that member nor hides the record's own."""
    from kvtrace.transforms.ids.anchor import previous_sha256

    record = {
        "format": map_record.MAP_FORMAT,
        "format_version": 7,
        "chat_template_kwargs": kwargs,
        "previous_sha256": "a" * 64,
    }
    raw = map_record.keyed(record, KEY)
    assert map_record.format_of(raw, "versions/000002.json") == 7
    assert previous_sha256(raw) == "a" * 64


def test_an_unverified_members_value_is_read_within_its_bound():
    """A member's value longer than MAX_MEMBER_BYTES reads as absent, never parsed; members
    nested deeper than the top level, or inside strings, are not the record's."""
    value = "b" * map_record.MAX_MEMBER_BYTES
    raw = b'{"a":{"previous_sha256":"c"},"s":"{\\"x\\":1,\\"format\\":2}","x":[1],'
    raw += b' "format" : "f", "previous_sha256":"%s"}' % value.encode()
    assert map_record.unverified_members(raw, ("format", "previous_sha256", "x")) == {
        "format": "f",
        "x": [1],
    }


@pytest.mark.parametrize("chunk", [1, 2, 3, 5])
def test_the_depth_scan_carries_strings_and_escapes_across_its_chunks(monkeypatch, chunk):
    """The MAC's depth scan works chunk by chunk: a chunk edge inside a string, or between a
    backslash and what it escapes, changes nothing it finds."""
    monkeypatch.setattr(map_record, "_DEPTH_CHUNK", chunk)
    kwargs = {"a": '\\"]]}\\\\', "mac": "ab" * 32, "z": ['[{\\\\"', {"b": "\\", "mac": "cd" * 32}]}
    raw = _keyed_record(kwargs)
    assert read_record(raw, "v", KEY)["chat_template_kwargs"] == kwargs
    with pytest.raises(IdMapError, match="MAC does not verify"):
        read_record(raw, "v", map_key(SALT + b"!"))


def test_a_record_of_brackets_is_refused_without_a_copy_of_it():
    """Brackets before a MAC member are counted in bounded chunks: the refusal of a 16 MiB
    record allocates a few chunks, never copies of the record."""
    import tracemalloc

    raw = b'{"a":[' + b"[]" * (8 << 20) + b'],"mac":"' + b"0" * 64 + b'"}\n'
    tracemalloc.start()
    try:
        with pytest.raises(IdMapError, match="000002.json is not a kvtrace id map version"):
            read_record(raw, "versions/000002.json", KEY)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * map_record._DEPTH_CHUNK, peak
