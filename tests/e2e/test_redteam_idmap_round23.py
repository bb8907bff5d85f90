"""Red team round 23, damaged id maps: reproducers of holes left after the twenty-second round's
fixes. Each asserts the promised behaviour, so each fails until it is fixed.

A fault in a Beam night's staged record is injected as a record damaged on its way back from
the job would be (a prelude run in the CLI's process, which the launcher is forked from): one
of kvtrace's own functions wrapped, so nothing depends on timing."""

from __future__ import annotations

import pytest

from helpers import kvtrace_child, map_night, map_of_nights

pytestmark = pytest.mark.slow

# What the staged night.json is damaged by, between the job that writes it and the launcher
# that commits from it: one block segment file's entry gone, or one id fewer added.
_STAGED_DAMAGE = {
    "a_segment_entry_dropped": 'record["segments"]["blocks"] = record["segments"]["blocks"][:-1]',
    "one_id_fewer_added": 'record["added"]["blocks"] -= 1',
}


def _damaging_the_staged_record(damage: str) -> str:
    return f"""
import kvtrace.pipelines.anonymize_night as night
_stage = night._stage_record
def _damaged(config, record):
    if "segments" in record:
        {damage}
    return _stage(config, record)
night._stage_record = _damaged
"""


@pytest.mark.beam
@pytest.mark.xfail(strict=True, reason="red team round 23")
@pytest.mark.parametrize("damage", sorted(_STAGED_DAMAGE))
def test_a_beam_nights_staged_record_damaged_short_of_its_files_commits_nothing(
    tiny_tokenizer, tmp_path, damage
):
    """Promise (docs/ID_MAP.md, 'On the Beam engine': 'a damaged record is a one-line error,
    nothing committed'; anonymize_night._staged_commit: 'a record damaged on its way back from
    the job commits nothing'; brief: never wrong ids, never silently extended). The launcher
    checks each segment file the staged night.json lists against the file (check_listed), but
    not that the record lists every file the job wrote, nor that the ids it says were added
    are the rows those files hold: `added` and the list are taken on the record's word.

    With one block file's entry gone, version 3 commits next_id 23 over 19 of the night's 20
    files: the keys of the missing shard are in no file, so the next night numbers them anew
    (measured: night 2's hash_ids [6, 15, 16, 17, 18, 19, 20, 21, 22]; the same prompt a night
    later [6, 15, 16, 17, 18, 23, 20, 21, 22]): published traces stop sharing the prefix they
    share, silently. With one id fewer added, next_id is 22 while a committed row holds id
    22: the next night that does not read that shard gives id 22 to a new key (two keys, one
    id); one that reads it is refused only then, the map already extended over it."""
    common = map_of_nights(tiny_tokenizer, tmp_path, 2)
    night = ["anonymize", "--input", str(map_night(tmp_path, 2)), "--tokenizer", tiny_tokenizer]
    night += ["--block-size", "4", "--output", str(tmp_path / "out2"), "--quiet"]
    said = kvtrace_child(
        *night,
        "--engine",
        "beam",
        *common,
        prelude=_damaging_the_staged_record(_STAGED_DAMAGE[damage]),
        timeout=180,
    )
    errors = [line for line in said.stderr.splitlines() if line.startswith("error:")]
    assert said.returncode != 0 and len(errors) == 1, said.stderr[-2000:]
    assert "Traceback" not in said.stderr
    assert not (tmp_path / "map" / "versions" / "000003.json").exists()
    assert not (tmp_path / "out2").exists()
