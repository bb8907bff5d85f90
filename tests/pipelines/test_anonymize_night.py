"""The night's end on plain values, without Beam: the gate, numbering with and without an id map,
stats and manifest, dead letters, and a whole night published (or refused) by finish_night."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kvtrace.pipelines import anonymize_night
from kvtrace.pipelines.anonymize_config import AnonymizeConfig, IdMapRun
from kvtrace.pipelines.anonymize_night import (
    Encoded,
    finish_night,
    kind_keys,
    map_reading,
    night_manifest,
    night_requests,
    number_ids,
    pass_gate,
    publish_night,
    write_dead_letters,
    write_stats,
)
from kvtrace.transforms.dead_letters import DeadLetter, SortedRuns, Tally
from kvtrace.transforms.encode.blocks import chain_hashes, chain_seed, salt_fingerprint, token_bytes
from kvtrace.transforms.encode.hashed_batch import HashedBatch, HashedRequest
from kvtrace.transforms.encode.salt import SaltError, SaltSource
from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.ids.dense_ids import UniqueTotals, dense_ids
from kvtrace.transforms.ids.id_map import MapIdentity, current_version_number
from kvtrace.transforms.ids.map_opening import open_repaired_map
from kvtrace.transforms.write.manifest import RecordCounts
from kvtrace.transforms.write.publish import DEAD_LETTER_FILE
from kvtrace.transforms.write.totals import ExportTotals

SALT = b"a salt for the night's end, 32 bytes or more"
BLOCK_SIZE = 2


def request(ts: int, tokens: list[int], session: bytes | None = None) -> HashedRequest:
    return HashedRequest(
        timestamp_ms=ts,
        fingerprint=ts,
        input_length=len(tokens),
        output_length=3,
        session_key=session,
        block_hashes=chain_hashes(token_bytes(tokens), BLOCK_SIZE, chain_seed(SALT)),
    )


def night(*requests: HashedRequest) -> HashedBatch:
    return HashedBatch.pack(list(requests))


def config(folder: Path, name: str = "out", **changes) -> AnonymizeConfig:
    for part in ("staging", "rejected"):
        (folder / f"{name}-{part}").mkdir(parents=True, exist_ok=True)
    given = {"salt": SaltSource("random", inline=SALT), **changes}
    return AnonymizeConfig(
        inputs=(("in.jsonl", 100),),
        output=str(folder / name),
        staging=str(folder / f"{name}-staging"),
        tokenizer="owner/model",
        dead_letter=str(folder / f"{name}-rejected"),
        block_size=BLOCK_SIZE,
        **given,
    )


def letter(reason: str = "bad_json") -> DeadLetter:
    return DeadLetter("in.jsonl", b"{not json", reason, "it is not JSON")


def test_the_gate_passes_counts_and_refuses_too_much_rejected_or_time_before_the_origin(tmp_path):
    job = config(tmp_path, max_rejected_fraction=0.5)
    counts = pass_gate(job, 4, Tally.of([letter()]), 1_000, None)
    assert counts == RecordCounts(4, 1, 0, 100, (("bad_json", 1),), 1)
    with pytest.raises(JobStopped, match=r"no records read from --input \(1 file, 100 bytes\)"):
        pass_gate(job, 0, Tally(), None, None)
    assert pass_gate(job, 4, Tally(), None, 5_000).rejected == 0  # no request: nothing early
    with pytest.raises(JobStopped, match="too much input rejected.*bad_json"):
        pass_gate(job, 4, Tally.of([letter()] * 3), 1_000, None)
    with pytest.raises(JobStopped, match=r"earliest request \(1000 ms\) precedes"):
        pass_gate(job, 4, Tally(), 1_000, 5_000)


def test_without_an_id_map_ids_are_dense_from_zero_and_nothing_is_read(tmp_path):
    job = config(tmp_path)
    batch = night(request(10, [1, 2, 3, 4]), request(20, [1, 2, 9, 9]))
    assert map_reading(job, "blocks") is None
    keys = kind_keys(job)["blocks"](batch)
    numbered = number_ids(job, "blocks", keys)
    assert numbered.ids.tolist() == dense_ids(keys).ids.tolist() == [0, 1, 0, 2]
    assert numbered.added_count == 3


def test_stats_are_returned_and_the_manifest_lists_their_bytes(tmp_path):
    job = config(tmp_path)
    batch = night(request(10, [1, 2, 3]), request(20, [1, 2]))
    counts = RecordCounts(3, 1, 0, 100)
    stats = write_stats(job, counts, ExportTotals.of_batch(batch), UniqueTotals(2, 3), 0)
    written = (tmp_path / "out-staging" / "stats.json").read_bytes()
    assert json.loads(written) == stats and stats["requests"] == 2
    run_counts = json.loads((tmp_path / "out-rejected" / "run-counts.json").read_text())
    assert run_counts["read"] == 3 and run_counts["rejected"] == 1
    manifest = night_manifest(job, [("x/trace-00000-of-00001.jsonl", "ab" * 32)], stats, 10, 10)
    assert manifest["sha256"]["stats.json"] == hashlib.sha256(written).hexdigest()
    assert manifest["files"] == ["stats.json", "trace-00000-of-00001.jsonl"]
    assert manifest["records"] == {"exported": 2} and manifest["id_map"] is None
    stream = night_manifest(job, [], stats, 70, 10, {"blocks": 5, "sessions": 1})
    assert stream["id_map"] == {"block_ids_from": 5, "sessions_from": 1, "time_from_ms": 60}


def test_dead_letters_staged_and_held_merge_into_one_file_in_their_declared_order(tmp_path):
    runs = SortedRuns(str(tmp_path))
    for reason in ("z_reason", "a_reason"):
        runs.add(letter(reason))
    path = write_dead_letters(str(tmp_path), [letter("m_reason")], runs.close())
    lines = Path(path).read_text().splitlines()
    assert lines == sorted(lines) and len(lines) == 3
    assert sorted(json.loads(line)["error"] for line in lines) == [
        "a_reason",
        "m_reason",
        "z_reason",
    ]


def test_no_dead_letter_leaves_no_file(tmp_path):
    assert write_dead_letters(str(tmp_path), [], SortedRuns(str(tmp_path)).close()) is None
    assert not list(tmp_path.iterdir())


def test_a_night_publishes_its_trace_letters_stats_and_manifest(tmp_path):
    job = config(tmp_path)
    encoded = Encoded(
        [night(request(1_000, [1, 2, 3, 4])), night(request(1_500, [1, 2, 5]))], [letter()], 3
    )
    manifest = finish_night(job, encoded)
    published = tmp_path / "out"
    assert json.loads((published / "manifest.json").read_text()) == manifest
    assert manifest["records"] == {"exported": 2}
    rows = [
        json.loads(line)
        for path in sorted(published.glob("trace-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert [(row["timestamp"], row["hash_ids"]) for row in rows] == [(0, [0, 1]), (500, [0, 2])]
    assert not (tmp_path / "out-staging").exists()  # moved whole into the output's place
    letters = (tmp_path / "out-rejected" / DEAD_LETTER_FILE).read_text().splitlines()
    assert [json.loads(line)["error"] for line in letters] == ["bad_json"]


def test_a_night_refused_at_the_gate_publishes_nothing(tmp_path):
    job = config(tmp_path, max_rejected_fraction=0.1)
    encoded = Encoded([night(request(1_000, [1, 2]))], [letter(), letter()], 3)
    with pytest.raises(JobStopped, match="too much input rejected"):
        finish_night(job, encoded)
    assert not (tmp_path / "out").exists()
    assert not list((tmp_path / "out-staging").glob("trace-*"))


def test_nights_extend_an_id_map_opened_and_committed_in_turn(tmp_path):
    """A second night numbers the first night's blocks and sessions as the first did, its new
    ones from where the map left off, reading the map's rows that can hold its keys."""
    salt = SaltSource("env", "KVTRACE_TEST_NIGHT_SALT")
    identity = MapIdentity(salt_fingerprint(SALT), BLOCK_SIZE, {}, "scheme", {}, "probe")
    first = night(request(1_000, [1, 2, 3, 4], session=b"s" * 16))
    second = night(
        request(2_000, [1, 2, 3, 4], session=b"s" * 16),
        request(2_500, [1, 2, 7, 7], session=b"t" * 16),
    )
    ids = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KVTRACE_TEST_NIGHT_SALT", SALT.decode())
        for number, batch in enumerate((first, second)):
            base = open_repaired_map(str(tmp_path / "map"), identity, salt, str(tmp_path / "marks"))
            assert base.version == number
            run = IdMapRun(str(tmp_path / "map"), base, str(tmp_path / "marks"))
            job = config(tmp_path, f"night{number}", salt=salt, id_map=run)
            reading = map_reading(job, "blocks")
            assert reading.next_id == (0, 2)[number] and not reading.whole
            assert bool(reading.segments) == bool(number)  # the first night's, after it
            finish_night(job, Encoded([batch], [], len(batch)))
            ids.append(
                [
                    json.loads(line)
                    for line in (tmp_path / f"night{number}" / "trace-00000-of-00001.jsonl")
                    .read_text()
                    .splitlines()
                ]
            )
    assert current_version_number(str(tmp_path / "map")) == 2
    assert [row["hash_ids"] for row in ids[0]] == [[0, 1]]
    assert [row["hash_ids"] for row in ids[1]] == [[0, 1], [0, 2]]
    assert [row["session"] for row in ids[1]] == [ids[0][0]["session"], 1]
    assert [row["timestamp"] for row in ids[1]] == [1_000, 1_500]  # from the map's origin


@pytest.mark.parametrize(
    "shard, day, shown",
    [
        ("x" * 1_000_000, "5", r'"xxx+ \(str\) where a whole number'),
        (0, " 5", r'" 5" \(str\) where a day'),
    ]
    + [(0, "5_0", r'"5_0" \(str\) where a day')],
)
def test_a_night_records_value_is_read_as_a_map_reads_it_and_shown_cut(tmp_path, shard, day, shown):
    """The launcher reads a night's record (anonymize_night.NIGHT_RECORD) with the map's own
    checks: a day is a day's number as published_days names it, never what int() accepts; a
    value refused is shown escaped and cut, in one short line."""
    from kvtrace.pipelines.anonymize_night import NIGHT_RECORD, finish_staged
    from kvtrace.transforms.ids.id_map import empty_version

    identity = MapIdentity(salt_fingerprint(SALT), BLOCK_SIZE, {}, "scheme", {}, "probe")
    run = IdMapRun(str(tmp_path / "map"), empty_version(identity), str(tmp_path / "marks"))
    job = config(tmp_path, id_map=run)
    entry = {"shard": shard, "data": {}, "index": {}, "rows": 1}
    record = {
        "manifest": {},
        "beside": {},
        "segments": {"blocks": [entry] if shard else [], "sessions": []},
        "added": {"blocks": 0, "sessions": 0},
        "earliest_ms": None,
        "times": {"days": {day: 1}, "last_ms": 5},
    }
    (Path(job.dead_letter) / NIGHT_RECORD).write_text(json.dumps(record))
    with pytest.raises(JobStopped, match=r"night\.json cannot be read \(" + shown) as refused:
        finish_staged(job)
    assert len(str(refused.value)) < 300 and "\n" not in str(refused.value)
    assert current_version_number(str(tmp_path / "map")) == 0


def test_an_id_map_needs_a_salt_that_outlives_the_run(tmp_path):
    identity = MapIdentity(salt_fingerprint(SALT), BLOCK_SIZE, {}, "scheme", {}, "probe")
    with pytest.raises(SaltError, match="--id-map needs the same salt every run"):
        open_repaired_map(
            str(tmp_path / "map"), identity, SaltSource("random", inline=SALT), str(tmp_path)
        )
    assert not (tmp_path / "map").exists()


def test_earliest_is_an_optional_time(tmp_path):
    assert night().earliest_ms() is None
    assert night(request(30, [1]), request(20, [2])).earliest_ms() == 20


@pytest.mark.parametrize(
    "step,error",
    [
        ("write_shards", OSError(28, "No space left on device")),
        ("night_manifest", KeyboardInterrupt()),  # a stop, as the CLI raises it
    ],
)
def test_a_night_that_fails_between_its_segments_and_its_commit_leaves_none(
    tmp_path, monkeypatch, step, error
):
    """The run's segment folder is owned from its first file to the commit (run_segments): a
    failure or a stop at any step between takes it (and the map folders it made), and the next
    night commits as if the failed one never ran."""
    salt = SaltSource("env", "KVTRACE_TEST_NIGHT_SALT")
    monkeypatch.setenv("KVTRACE_TEST_NIGHT_SALT", SALT.decode())
    identity = MapIdentity(salt_fingerprint(SALT), BLOCK_SIZE, {}, "scheme", {}, "probe")
    batch = night(request(1_000, [1, 2, 3, 4], session=b"s" * 16))

    def run(name: str) -> None:
        base = open_repaired_map(str(tmp_path / "map"), identity, salt, str(tmp_path / "marks"))
        job = config(
            tmp_path,
            name,
            salt=salt,
            id_map=IdMapRun(str(tmp_path / "map"), base, str(tmp_path / "marks")),
        )
        finish_night(job, Encoded([batch], [], len(batch)))

    def failing(*args, **kwargs):
        assert list((tmp_path / "map" / "segments").iterdir())  # written by now
        raise error

    with monkeypatch.context() as patch:
        patch.setattr(anonymize_night, step, failing)
        with pytest.raises(type(error)):
            run("failed")
    assert not (tmp_path / "map").exists()  # a new map's folders, which it made, too
    run("next")
    assert current_version_number(str(tmp_path / "map")) == 1


def test_a_night_split_at_its_numbering_numbers_the_kept_published_requests_and_writes_the_same(
    tmp_path,
):
    """The stream numbers a window elsewhere (its id map in shard keys): the keys it is given
    are the night's after the timestamp kind and the published times, and writing with those
    ids is finish_night's bytes."""
    # 1,000 ms relative requests and one epoch date: the minority kind is a letter, not a key.
    batches = [night(request(1_000, [1, 2, 3, 4]), request(1_500, [1, 2, 5]))]
    batches.append(night(request(1_700_000_000_000, [7, 8])))
    given: dict[str, list] = {}

    def recorded(kind, keys):
        given[kind] = keys
        return dense_ids(keys)

    whole = config(tmp_path, "whole")
    manifest = finish_night(whole, Encoded(batches, [letter()], 4), recorded)
    split = config(tmp_path, "split")
    night_ = night_requests(split, Encoded(batches, [letter()], 4), None)
    assert len(night_.whole) == 2  # the epoch date is a dead letter
    keys = {kind: keys_of(night_.whole) for kind, keys_of in kind_keys(split).items()}
    for kind in keys:
        assert keys[kind].tobytes() == given[kind].tobytes()
    numbered = {kind: dense_ids(kind_keys_) for kind, kind_keys_ in keys.items()}
    assert publish_night(split, night_, numbered)["sha256"] == manifest["sha256"]
    for name in manifest["files"]:
        assert (tmp_path / "split" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    assert (tmp_path / "split-rejected").joinpath(DEAD_LETTER_FILE).read_bytes() == (
        tmp_path / "whole-rejected"
    ).joinpath(DEAD_LETTER_FILE).read_bytes()


DAY = 86_400_000


def row_times(step: int, *times: int) -> anonymize_night.RowTimes:
    """RowTimes fed rows at times (ms from an origin at 0), published at granularity step."""
    rows = anonymize_night.RowTimes(0, 0, step)
    rows.add(b"".join(b'{"timestamp": %d, "input_length": 1}\n' % t for t in times), "t.jsonl")
    return rows


@pytest.mark.parametrize(
    "step, days, fits",
    [
        (1, {0: 2, 1: 1}, True),
        (1, {0: 3}, False),  # the row at DAY is day 1's, exactly
        (1_000, {0: 3}, True),  # published at DAY, it may have been 500 ms before
        (1_000, {0: 1, 1: 2}, False),  # only one row may lie on day 1
        (1_000, {0: 2, 2: 1}, False),  # none on day 2
        (1_000, {0: 2}, False),  # fewer than the rows
    ],
)
def test_a_staged_records_days_must_be_an_assignment_of_its_rows_to_days(step, days, fits):
    """The launcher holds a Beam night's requests per day to its staged rows: each row given a
    day its unrounded time may lie on (a time rounded half up to the granularity)."""
    from kvtrace.transforms.ids.id_map import NightTimes

    rows = row_times(step, 0, DAY - 1_000, DAY)
    if fits:
        rows.check(0, NightTimes(days, DAY))
    else:
        with pytest.raises(ValueError, match="its requests per day are not those of its 3 rows"):
            rows.check(0, NightTimes(days, DAY))


@pytest.mark.parametrize(
    "earliest, last, refusal",
    [
        (1, 2_000, "its earliest time starts the night at 1, its rows at 0"),
        (0, 0, "its last time is 0, its rows' 2000"),
    ],
)
def test_a_staged_records_first_and_last_times_must_be_its_rows(earliest, last, refusal):
    from kvtrace.transforms.ids.id_map import NightTimes

    with pytest.raises(ValueError, match=refusal):
        row_times(1, 0, 2_000).check(earliest, NightTimes({0: 2}, last))


def test_a_staged_row_must_begin_with_its_time():
    with pytest.raises(ValueError, match="does not begin with its time"):
        anonymize_night.RowTimes(0, 0, 1).add(b'{"input_length": 1, "timestamp": 0}\n', "t.jsonl")


@pytest.mark.parametrize(
    "fault",
    [
        "none",
        "appended",
        "leftover",
        "missing",
        "replaced",
        "link",
        "hard link",
        "fifo",
        "subfolder",
        "attribute",
        "folder link",
    ],
)
def test_a_staged_folder_is_published_only_as_its_manifest_lists_it(tmp_path, fault):
    """check_staged, last before the swap: the staged manifest the night's own (not another
    whole output's, its manifest.json beside it), every file it lists, with its digest, and no
    other, each a regular file of one link carrying nothing kvtrace does not set, in a folder
    that is no link (the audit's own entry checks); a one-line JobStopped otherwise."""
    import os
    from types import SimpleNamespace

    from kvtrace.transforms.trace_format import canonical_json

    folder = tmp_path / "staging"
    folder.mkdir()
    shard = "trace-00000-of-00001.jsonl"
    (folder / shard).write_bytes(b"rows\n")
    (folder / "stats.json").write_bytes(b"{}")
    sha256 = {shard: hashlib.sha256(b"rows\n").hexdigest()}
    sha256["stats.json"] = hashlib.sha256(b"{}").hexdigest()
    manifest = {"sha256": sha256}
    (folder / "manifest.json").write_bytes(canonical_json(manifest))
    staging = folder
    if fault == "appended":
        (folder / shard).write_bytes(b"rows\nlate\n")
    elif fault == "leftover":
        (folder / "other.jsonl").write_bytes(b"")
    elif fault == "missing":
        (folder / "stats.json").unlink()
    elif fault == "replaced":  # another output, its own manifest listing it
        (folder / shard).write_bytes(b"other\n")
        other = {"sha256": sha256 | {shard: hashlib.sha256(b"other\n").hexdigest()}}
        (folder / "manifest.json").write_bytes(canonical_json(other))
    elif fault == "link":
        (folder / "stats.json").unlink()
        (folder / "stats.json").symlink_to(tmp_path / "elsewhere")
    elif fault == "hard link":
        os.link(folder / shard, tmp_path / "outside")
    elif fault == "fifo":
        os.mkfifo(folder / "trace-00001-of-00002.jsonl")
    elif fault == "subfolder":
        (folder / "trace-00001-of-00002.jsonl").mkdir()
    elif fault == "attribute":
        try:
            os.setxattr(folder / shard, "user.note", b"my card is 4111")
        except OSError:
            pytest.skip("no user extended attributes here")
    elif fault == "folder link":
        staging = tmp_path / "link"
        staging.symlink_to(folder)
    job = SimpleNamespace(staging=str(staging))
    night = anonymize_night.StagedNight(manifest)
    if fault == "none":
        anonymize_night.check_staged(job, night)
        return
    with pytest.raises(JobStopped, match="is not what was verified") as refused:
        anonymize_night.check_staged(job, night)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "lines, times",
    [
        (b"", []),
        (b'{"timestamp": 0, "x": 1}\n{"timestamp": 1099511627775, "x": 1}\n', [0, 1099511627775]),
        (b'{"timestamp": 01, "x": 1}\n', None),  # a leading zero: not as kvtrace writes it
        (b'{"timestamp": -1, "x": 1}\n', None),
        (b'{"timestamp": 12345678901234567, "x": 1}\n', None),  # past any published int
        (b'{"x": 1, "timestamp": 5}\n', None),
    ],
)
def test_a_staged_rows_time_is_read_from_its_start_as_kvtrace_writes_it(lines, times):
    found = anonymize_night._leading_times(lines)
    assert (found if found is None else found.tolist()) == times


@pytest.mark.beam
def test_a_run_that_rejected_nothing_writes_no_letters_file_on_an_object_store(s3):
    """No file, never an empty one made and then removed: an object store refuses an empty
    upload (S3: a multipart upload of no part), which failed every s3:// night without a letter;
    letters there are written as they are locally."""
    s3.create_bucket(Bucket="letters")
    assert anonymize_night.write_dead_letters("s3://letters/run", []) is None
    assert "Contents" not in s3.list_objects_v2(Bucket="letters")
    letter = DeadLetter("in.jsonl", b"{}", "wrong_type", "messages is a number")
    path = anonymize_night.write_dead_letters("s3://letters/run", [letter])
    assert path is not None and path.startswith("s3://letters/run/")
    (written,) = s3.list_objects_v2(Bucket="letters")["Contents"]
    assert b"wrong_type" in s3.get_object(Bucket="letters", Key=written["Key"])["Body"].read()


@pytest.mark.parametrize(
    "counts, lines, passes",
    [
        ({"read": 9, "exported": 8, "rejected": 1}, 1, True),
        ({"read": 8, "exported": 8, "rejected": 0}, None, True),  # no letters file
        ({"read": 9, "exported": 8, "rejected": 1}, 0, False),  # the letters emptied
        ({"read": 9, "exported": 8, "rejected": 1}, None, False),  # the letters removed
        ({"read": 10, "exported": 8, "rejected": 1}, 1, False),  # read != exported + rejected
        ({"read": 9, "exported": 7, "rejected": 2}, 2, False),  # exported not the rows'
        ({"read": 9.0, "exported": 8, "rejected": 1}, 1, False),
        ([9, 8, 1], 1, False),
    ],
)
def test_a_staged_nights_run_counts_are_those_of_its_rows_and_letters(counts, lines, passes):
    """_check_counts: what the summary says (the run counts) is what was staged: exported the
    rows the manifest derived from the folder, rejected the staged letters' lines (one letter
    each), read = exported + rejected; anything else refuses the night."""
    letters = None if lines is None else {"sha256": "0" * 64, "lines": lines}
    beside = anonymize_night.Beside({"letters": letters}, json.dumps(counts).encode())
    manifest = {"records": {"exported": 8}}
    if passes:
        anonymize_night._check_counts(beside, manifest)
    else:
        with pytest.raises(ValueError, match="read = its 8 rows"):
            anonymize_night._check_counts(beside, manifest)
