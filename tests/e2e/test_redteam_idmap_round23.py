"""Red team round 23, damaged id maps: reproducers of holes left after the twenty-second round's
fixes. Each asserts the promised behaviour, so each fails until it is fixed.

Faults are injected by a prelude run in the CLI's process (a Beam night's launcher is forked
from it) that wraps one of kvtrace's own functions: a staged record damaged on its way back
from the job, a second run of the night at a chosen step. Nothing depends on timing."""

from __future__ import annotations

import json
import subprocess

import pytest

from helpers import KVTRACE, kvtrace_child, map_night, map_of_nights, staged_record_prelude

pytestmark = pytest.mark.slow

# What the staged night.json is damaged by, between the job that writes it and the launcher
# that commits from it: one block segment file's entry gone, or one id fewer added.
_STAGED_DAMAGE = {
    "a_segment_entry_dropped": 'record["segments"]["blocks"] = record["segments"]["blocks"][:-1]',
    "one_id_fewer_added": 'record["added"]["blocks"] -= 1',
}


@pytest.mark.beam
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
        prelude=staged_record_prelude(_STAGED_DAMAGE[damage]),
        timeout=180,
    )
    errors = [line for line in said.stderr.splitlines() if line.startswith("error:")]
    assert said.returncode != 0 and len(errors) == 1, said.stderr[-2000:]
    assert "Traceback" not in said.stderr
    assert not (tmp_path / "map" / "versions" / "000003.json").exists()
    assert not (tmp_path / "out2").exists()


def _another_night_after_the_checks(night: list[str]) -> str:
    """A prelude: a second run of the night on the same map, run to its end just after this
    run's last check before its segments settle (id_map.check_carried_files), as a cron
    started twice would interleave: deterministic, no timing."""
    return f"""
import subprocess, sys
import kvtrace.transforms.ids.id_map as id_map
_check = id_map.check_carried_files
def _then_another_night(*args, **kwargs):
    _check(*args, **kwargs)
    subprocess.run([sys.executable, "-m", "kvtrace.cli", *{night!r}], capture_output=True)
id_map.check_carried_files = _then_another_night
"""


@pytest.mark.parametrize("engine", ["local", pytest.param("beam", marks=pytest.mark.beam)])
def test_a_night_whose_run_folder_a_winning_run_cleaned_is_told_it_lost_the_race(
    tiny_tokenizer, tmp_path, engine
):
    """Promise (docs/ID_MAP.md, Rollback: 'Before a night commits, it first checks that no
    other run extended the map since it read it (that loser is told so: run the night again,
    one run per map at a time)'; brief: bad input or state gets a one-line error that says
    what happened). The same night started twice on one map (a cron run twice): the second
    run commits version 3 between the first's checks and its segments settling, and its
    cleanup (id_map.discard_abandoned: every folder of a version decided, 3, that the version
    does not list) deletes the first run's own segment folder, which is still live. The first
    then fails renaming its files: 'error: the job failed: [Errno 2] No such file or
    directory: .../segments/000003-RUNID/blocks-00000.parquet -> ...', on either engine: an
    error of the system, not the race it lost, and no word that the map is whole and the
    night was published by the other run."""
    common = map_of_nights(tiny_tokenizer, tmp_path, 2)
    source = map_night(tmp_path, 2)
    twice = source.with_name("night2-again.jsonl")
    twice.write_bytes(source.read_bytes())
    shared = ["--tokenizer", tiny_tokenizer, "--block-size", "4", "--quiet", *common]
    other = ["anonymize", "--input", str(twice), "--output", str(tmp_path / "out2b"), *shared]
    said = kvtrace_child(
        "anonymize",
        "--input",
        str(source),
        "--output",
        str(tmp_path / "out2"),
        "--engine",
        engine,
        *shared,
        prelude=_another_night_after_the_checks(other),
        timeout=180,
    )
    assert (tmp_path / "out2b" / "manifest.json").exists()  # the other run won
    errors = [line for line in said.stderr.splitlines() if line.startswith("error:")]
    assert said.returncode != 0 and len(errors) == 1, said.stderr[-2000:]
    assert "extended by another run" in errors[0], errors[0]
    assert not (tmp_path / "out2").exists()


def test_two_segment_files_of_one_size_swapped_are_not_carried_into_the_next_version(
    tiny_tokenizer, tmp_path
):
    """Promise (docs/ID_MAP.md, 'What this gives': 'A file damaged in place (its size kept) is
    refused before a commit lists it again'; round 22's reproducer names 'a segment file
    swapped with another of the same size' among what its fix refuses). The carried-files
    check (id_map.check_carried_files -> segments.check_listed) reads each file's index by its
    sha256 and its footer by the record's footer_sha256. A segment's footer describes only its
    layout (row groups' places and sizes, the schema): no byte of it depends on the rows, so
    two files of one row count and size have the same footer, byte for byte (this map's
    version 1 lists blocks-00046 and blocks-00062, 821 bytes each, one footer_sha256). Swapped
    (by a bad restore, a misdirected copy, or any writer of the map's files), both pass the
    check: the next night commits version 3 listing both under their old checksums, each
    holding the other shard's keys. The damage is found only by the first night whose keys
    reach one of those shards, or the next folding night, up to 32 nights later: the window
    round 22 closed for one damaged footer stays open for a swap."""
    common = map_of_nights(tiny_tokenizer, tmp_path, 2)
    record = json.loads((tmp_path / "map" / "versions" / "000002.json").read_bytes())
    # Files of one size (their footers were one before each footer held its rows' digest).
    by_shape: dict[int, list[str]] = {}
    for name, sums in sorted(record["checksums"].items()):
        if name.endswith(".parquet"):
            by_shape.setdefault(sums["bytes"], []).append(name)
    twins = max(by_shape.values(), key=len)
    first, second = (tmp_path / "map" / name for name in twins[:2])
    first_bytes, second_bytes = first.read_bytes(), second.read_bytes()
    assert first_bytes != second_bytes
    first.write_bytes(second_bytes)
    second.write_bytes(first_bytes)
    night = [*KVTRACE, "anonymize", "--input", str(map_night(tmp_path, 2))]
    night += ["--tokenizer", tiny_tokenizer, "--block-size", "4"]
    night += ["--output", str(tmp_path / "out2"), "--quiet", *common]
    said = subprocess.run(night, capture_output=True, text=True, timeout=120, check=False)
    assert said.returncode != 0, said.stderr[-2000:]
    assert first.name in said.stderr or second.name in said.stderr, said.stderr[-2000:]
    assert not (tmp_path / "map" / "versions" / "000003.json").exists()
