"""Red team round 24, damaged id maps: reproducers of holes left after the twenty-third round's
fixes. Each asserts the promised behaviour and is marked xfail (strict) until it is fixed.

Faults are injected as round 23's were: a prelude run in the CLI's process (a Beam night's
launcher is forked from it) wraps one of kvtrace's own functions, so nothing depends on timing.
Object stores are an S3 mock (moto) in the test's process, as in
tests/e2e/test_gate_redteam_round4.py."""

from __future__ import annotations

import shutil

import pytest

from helpers import (
    KVTRACE,
    MAP_NIGHT_ZERO_MS,
    MAP_SALT,
    anonymize,
    anonymize_night,
    kvtrace_child,
    map_night,
    map_of_nights,
    peak_rss_mb,
    staged_record_prelude,
    write_jsonl,
)

pytestmark = pytest.mark.slow

# What the staged night.json is damaged by, between the job that writes it and the launcher
# that commits from it: not its segment files (round 23 derives those from the run's folder),
# but the night's facts the launcher still takes on the record's word.
_STAGED_DAMAGE = {
    "the_manifests_start_moved": 'record["manifest"]["id_map"]["time_from_ms"] += 1',
    "its_last_time_lowered": 'record["times"]["last_ms"] = 0',
}


@pytest.mark.beam
@pytest.mark.parametrize("damage", sorted(_STAGED_DAMAGE))
def test_a_beam_nights_staged_record_damaged_in_its_facts_commits_nothing(
    tiny_tokenizer, tmp_path, damage
):
    """Promise (docs/ID_MAP.md, 'On the Beam engine': 'The commit is derived from the run's own
    segment folder, not taken on the record's word ... a damaged record is a one-line error,
    nothing committed'; brief: a damaged map is never silently extended, a night publishes
    whole or not at all). Round 23 derived the segment files and the ids added from the run's
    folder, but the launcher (anonymize_night.finish_staged -> _staged_commit) still takes the
    rest of night.json on its word: the manifest (only checked to be an object), the earliest
    time and the night's times (checked for type, range and nulls only). The manifest is then
    both recorded in the map (its id_map start, under the MAC) and published as it is: no
    gate runs in the launcher.

    Measured on a map of three nights and a fourth on the Beam engine (this test: two and a
    third, the same damage):
    - manifest id_map.time_from_ms + 1: version 4 records start time 259200001 for a night
      whose first row is at 259200000, and the trace is published with that manifest; `kvtrace
      audit` then refuses it ('the first row is not at time 0 (or the manifest's
      id_map.time_from_ms)'): a night published that the gate rejects, its map extended.
    - times.last_ms 0: version 4's published_to_ms stays at night 3's (172800000), silently
      (the audit passes); a later night with a request at 216000000, before this night's
      259200000, is then accepted and published (check_night_follows judges against the
      recorded last time): the map's nights no longer follow one clock."""
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


def test_an_id_map_opened_in_a_folder_of_other_files_deletes_none_of_them(tiny_tokenizer, tmp_path):
    """Promise (docs/NIGHTLY.md: 'temp files of killed commits are removed by the next run';
    brief: nothing lost, bad input gets a one-line error): kvtrace removes only the temp files
    its own commits left. But as a map opens (map_opening.open_repaired_map) and as a mark is
    moved (anchor.advance_anchor), exclusive.remove_stale_temp_files deletes every entry of the
    map's folder (and of the folder of marks) whose name merely holds '.tmp-', folders too
    (storage.remove_unheld: shutil.rmtree), whatever wrote it. An operator who gives an
    existing folder of their own as --id-map (or --id-map-marks: measured the same) is not
    refused: the night builds its map there, and a folder `thesis.tmp-final/` of theirs, with
    its files, is gone, silently (exit 0)."""
    (tmp_path / "salt").write_bytes(MAP_SALT)
    work = tmp_path / "work"
    (work / "thesis.tmp-final").mkdir(parents=True)
    (work / "thesis.tmp-final" / "chapter1.tex").write_text("years of work\n")
    said = kvtrace_child(
        "anonymize",
        "--input",
        str(map_night(tmp_path, 0)),
        "--tokenizer",
        tiny_tokenizer,
        "--block-size",
        "4",
        "--output",
        str(tmp_path / "out0"),
        "--quiet",
        "--id-map",
        str(work),
        "--id-map-marks",
        str(tmp_path / "marks"),
        "--salt-file",
        str(tmp_path / "salt"),
        timeout=120,
    )
    assert "Traceback" not in said.stderr
    kept = work / "thesis.tmp-final" / "chapter1.tex"
    assert kept.exists(), f"deleted by the night (exit {said.returncode}): {said.stderr[-2000:]}"


def test_a_record_of_brackets_before_a_mac_member_is_refused_in_bounded_memory(
    tiny_tokenizer, tmp_path
):
    """Promise (brief: bounded memory when reading a map of huge claimed sizes; docs/BOUNDS.md,
    'id map version record': 256 MiB, its MAC verified on the bytes as stored, never parsed
    whole unverified; rounds 21-22: such a record is 'refused at a night's usual peak'). The
    parse is gone, but the scan that finds the MAC (map_record._signed_by -> _at_depth_1 ->
    _depth_change) works on copies of everything before the first `,"mac":"<64 hex>"` it
    finds: the slice raw[start:match.start()], then its escapes removed, its non-structure
    bytes deleted (translate), `""` removed and strings cut (re.sub), each a new bytes object
    as long as the brackets in it. Whoever can write the map's files (no salt) puts 128 MiB of
    `[]` before such a member in the newest version's place: the night peaks at ~593 MB (a
    clean night ~142 MB) before its one-line refusal; at the 250 MiB the read allows, ~1.08 GB
    (~4.3 bytes of memory per byte of the record). The same scan runs as audit --id-map and
    id-map upgrade and rebind open a map."""
    common = map_of_nights(tiny_tokenizer, tmp_path, 2)
    newest = tmp_path / "map" / "versions" / "000002.json"
    newest.write_bytes(b'{"a":[' + b"[]" * (64 << 20) + b'],"mac":"' + b"0" * 64 + b'"}\n')
    night = ["anonymize", "--input", str(map_night(tmp_path, 2)), "--tokenizer", tiny_tokenizer]
    night += ["--block-size", "4", "--output", str(tmp_path / "out2"), "--quiet", *common]
    code, peak, stderr = peak_rss_mb(KVTRACE + night)
    assert code == 2, stderr
    assert "000002.json" in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not (tmp_path / "out2").exists()
    assert peak < 450, f"peak RSS {peak} MB for a 128 MiB record"


def _another_night_as_leftovers_are_deleted(night: list[str], leftover: str) -> str:
    """A prelude: another night on the same map, run to its end just as this run deletes the
    leftover folder's files (after listing them), as a run started once this one's commit
    stood would interleave: deterministic, no timing."""
    return f"""
import subprocess, sys
import kvtrace.transforms.storage as storage
_delete = storage.delete
def _after_another_night(paths):
    if any({leftover!r} in path for path in paths):
        subprocess.run([sys.executable, "-m", "kvtrace.cli", *{night!r}], capture_output=True)
    return _delete(paths)
storage.delete = _after_another_night
"""


def test_a_committed_night_is_published_when_another_run_cleared_the_leftovers_first(
    tiny_tokenizer, tmp_path
):
    """Promise (id_map.py: 'Of two runs extending one version, the first to commit publishes';
    docs/ID_MAP.md: the commit, its mark and the cleanup that follows are one section; brief:
    a night publishes whole, a failure is one line that says what happened). After its commit
    a night deletes what killed or beaten runs left (id_map.discard_abandoned: it lists the
    segment folders' files, then storage.delete -> os.remove each), and so does every run as
    it opens the map. Two runs that clear the same leftovers race: the one that deletes second
    finds a file gone and fails. A map holding a killed run's leftover folder for the next
    version (segments/000003-...), night 2 commits version 3; a second night, started once
    that commit stood, opens the map (its cleanup removes the leftover) and commits version 4
    while night 2 is between listing the leftover and deleting it. Night 2, whose version
    stands, then ends 'error: the job failed: [Errno 2] No such file or directory:
    .../segments/000003-aaaaaaaaaaaa/blocks-00001.index.npz; published version 3 of the id map
    ... before the failure' (exit 1) and publishes no trace: the night the map recorded is
    lost until rerun. Seen unprovoked too: three nights started together on one map (two
    local, one Beam), one of four trials."""
    common = map_of_nights(tiny_tokenizer, tmp_path, 2)
    leftover = tmp_path / "map" / "segments" / "000003-aaaaaaaaaaaa"
    leftover.mkdir()
    (leftover / "blocks-00001.parquet").write_bytes(b"a killed run's")
    (leftover / "blocks-00001.index.npz").write_bytes(b"a killed run's")
    later = write_jsonl(
        tmp_path / "later.jsonl",
        [
            {
                "timestamp": MAP_NIGHT_ZERO_MS + 3 * 86_400_000,
                "output_length": 5,
                "messages": [{"role": "user", "content": "Where is Oslo ? Oslo is in Norway ."}],
            }
        ],
    )
    shared = ["--tokenizer", tiny_tokenizer, "--block-size", "4", "--quiet", *common]
    other = ["anonymize", "--input", str(later), "--output", str(tmp_path / "out3"), *shared]
    said = kvtrace_child(
        "anonymize",
        "--input",
        str(map_night(tmp_path, 2)),
        "--output",
        str(tmp_path / "out2"),
        *shared,
        prelude=_another_night_as_leftovers_are_deleted(other, leftover.name),
        timeout=180,
    )
    assert (tmp_path / "out3" / "manifest.json").exists()  # the other night ran in between
    assert said.returncode == 0, said.stderr[-2000:]
    assert (tmp_path / "out2" / "manifest.json").exists()


def test_upgrade_refuses_a_keyed_map_whose_versions_are_not_one_chain(tiny_tokenizer, tmp_path):
    """Promise (docs/ID_MAP.md, 'Format 3 maps': 'On a keyed map it only verifies every record
    and the mark and anchors it'; 'A run opens the map only once its whole history is the
    newest record's own (id_map.verified_newest)'; brief: the id map is verified whole). On a
    keyed map id_map.upgrade_map verifies each record by its own MAC (key_format_3_map ->
    _verified_is_keyless) and walks from the newest down to the marked version only, never
    the chain below it. Another map of the same salt's version 2 put in place of this map's
    (a record that verifies on its own) makes every night refuse the map ('the versions of
    the id map ... do not form one chain from version 1 to 3'), yet `kvtrace id-map upgrade`
    says 'already keyed, nothing rewritten; version 3 anchored' and exits 0 (`rebind` binds
    the place to it as well): the operator is told the map is sound."""
    common = map_of_nights(tiny_tokenizer, tmp_path, 3)
    other = tmp_path / "other"
    other.mkdir()
    (other / "salt").write_bytes(MAP_SALT)
    for day in range(2):
        night = write_jsonl(
            other / f"night{day}.jsonl",
            [
                {
                    "timestamp": MAP_NIGHT_ZERO_MS + day * 86_400_000,
                    "output_length": 5,
                    "messages": [{"role": "user", "content": f"another map's night {day} ."}],
                }
            ],
        )
        flags = ["--id-map", str(other / "map"), "--id-map-marks", str(other / "marks")]
        flags += ["--salt-file", str(other / "salt"), "--quiet"]
        assert anonymize_night(tiny_tokenizer, [night], other / f"out{day}", *flags) == 0
    shutil.copy(other / "map" / "versions" / "000002.json", tmp_path / "map" / "versions")
    said = kvtrace_child("id-map", "upgrade", str(tmp_path / "map"), *common[2:], timeout=120)
    errors = [line for line in said.stderr.splitlines() if line.startswith("error:")]
    assert said.returncode != 0 and len(errors) == 1, said.stdout + said.stderr[-2000:]


@pytest.mark.beam
def test_an_id_map_on_s3_is_extended_by_its_first_night(tiny_tokenizer, tmp_path, s3, capsys):
    """Promise (docs/ID_MAP.md and `kvtrace id-map --help`: a map is 'local, gs:// or s3://';
    exclusive.py: on S3 a commit checks that the name is free, then creates it; brief: a
    night publishes whole or not at all, a failure is one line that says what happened). A
    commit marks each new segment folder COMMITTED with an empty object
    (map_files.create_mark -> storage.create, nothing written) and Beam's S3 writer
    (apache_beam.io.aws.s3io.S3Uploader.finish) completes a multipart upload of an empty file
    with no part, which S3 refuses (MalformedXML: a multipart upload needs at least one part;
    the S3 mock answers as AWS does). So the first night on an s3:// map creates
    versions/000001.json, then fails: 'error: the job failed: S3ClientError: (An error
    occurred (MalformedXML) when calling the CompleteMultipartUpload operation ...);
    published version 1 of the id map s3://... before the failure', no trace and no CURRENT;
    every later night fails the same way as the map opens (id_map.finish_interrupted_commit
    marks the folder again), so the map can never be extended nor its first night
    published."""
    (tmp_path / "salt").write_bytes(MAP_SALT)
    flags = ["--block-size", "4", "--quiet", "--id-map", "s3://maps/map"]
    flags += ["--id-map-marks", str(tmp_path / "marks"), "--salt-file", str(tmp_path / "salt")]
    s3.create_bucket(Bucket="maps")
    code = anonymize(tiny_tokenizer, [map_night(tmp_path, 0)], tmp_path / "out0", *flags)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="maps").get("Contents", [])]
    assert code == 0, capsys.readouterr().err[-2000:]
    assert "map/CURRENT" in keys and any(k.endswith("/COMMITTED") for k in keys), keys
    assert (tmp_path / "out0" / "manifest.json").exists()


@pytest.mark.beam
def test_a_remote_folder_of_marks_is_accepted_by_the_maps_second_night(
    tiny_tokenizer, tmp_path, s3, capsys
):
    """Promise (docs/ID_MAP.md, Rollback: '--id-map-marks DIR (local, gs://, s3://)', 'give
    the same folder every night'; configs/dataflow.yaml and deploy/schedule/cronjob.yaml ship
    a gs:// and an s3:// map with a folder of marks beside it). The write plan checks every
    remote folder it writes as an output (publish.check_written: `if is_url(path):
    check_output(path)`), private ones too: an --id-map or --id-map-marks on gs:// or s3://
    holding anything but an output's files is 'a folder of files kvtrace did not write'. The
    first night writes the map's mark and place files there; the second is refused before
    any work: 'error: --output s3://marks/kv holds files kvtrace did not write
    (31215b...json, map-85f16b...json); a run replaces an output folder whole, so it must be
    new, empty, or an earlier kvtrace output' (exit 2), naming a flag it was not given. An
    s3:// or gs:// --id-map is refused the same way for its CURRENT (measured on the S3 mock
    once its empty COMMITTED object is written: the test above): no remote map, nor a local
    one anchored remotely, ever publishes a second night."""
    (tmp_path / "salt").write_bytes(MAP_SALT)
    flags = ["--block-size", "4", "--quiet", "--id-map", str(tmp_path / "map")]
    flags += ["--id-map-marks", "s3://marks/kv", "--salt-file", str(tmp_path / "salt")]
    s3.create_bucket(Bucket="marks")
    for day in range(2):
        out = tmp_path / f"out{day}"
        code = anonymize(tiny_tokenizer, [map_night(tmp_path, day)], out, *flags)
        assert code == 0, f"night {day}: " + capsys.readouterr().err[-2000:]
    assert (tmp_path / "map" / "versions" / "000002.json").exists()
