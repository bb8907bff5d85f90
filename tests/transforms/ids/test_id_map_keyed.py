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
