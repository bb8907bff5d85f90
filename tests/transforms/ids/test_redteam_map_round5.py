"""Red team round 5 (rt5-det): the id map. Each test asserts a promise and fails today."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import anonymize_night, trace_bytes, write_jsonl

pytestmark = pytest.mark.slow

ROUND5 = "red team round 5"
SALT = b"keyed-map-test-salt-of-32-bytes!"
DAY_MS = 86_400_000
ZERO = 1_700_000_000_000


def _one_request(folder: Path, name: str, prompt: str, day: int = 0) -> Path:
    return write_jsonl(folder / f"{name}.jsonl", [{
        "timestamp": ZERO + day * DAY_MS, "output_length": 5,
        "messages": [{"role": "user", "content": prompt}]}])


def _map_id(map_dir: Path) -> str:
    return json.loads((map_dir / "versions" / "000001.json").read_bytes())["map_id"]


@pytest.mark.xfail(strict=True, reason=ROUND5)
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
    assert anonymize_night(tiny_tokenizer, [first], tmp_path / "a0", "--id-map",
                           str(tmp_path / "map-a"), *common) == 0
    code = anonymize_night(tiny_tokenizer, [other], tmp_path / "b0", "--id-map",
                           str(tmp_path / "map-b"), *common)
    assert code == 0 and trace_bytes(tmp_path / "b0"), (
        f"map-b's first night was refused (map-a's id {_map_id(tmp_path / 'map-a')}, map-b's "
        f"{_map_id(tmp_path / 'map-b')}): two maps of other keys share one id and one mark")
    later = _one_request(tmp_path, "tenant-b-1", "over and over again", day=1)
    assert anonymize_night(tiny_tokenizer, [later], tmp_path / "b1", "--id-map",
                           str(tmp_path / "map-b"), *common) == 0
