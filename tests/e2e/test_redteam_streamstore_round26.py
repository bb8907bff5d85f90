"""Red team round 26, streaming's folders and failures: reproducers of holes in its promises
(every message exported once or lettered with a reason, the run counts adding up to what
stands; a window published whole or not at all, never replaced by another run; never a
traceback), run on Beam's DirectRunner with a TestStream (its source's clock: the watermark),
the stream's folders on a local disk or on S3 (moto's mock, tests/conftest.py `s3`)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from helpers import STREAM_SALT, STREAM_START_MS, letters, stream_counts

pytestmark = pytest.mark.slow

BUCKET = "streams"


def window_then_more(with_later: bool = True) -> object:
    """Four requests of window 0 and a poison message, then (with_later) a request past window
    0's deadline, and one more of window 2: a TestStream."""
    from apache_beam.testing.test_stream import TestStream

    from helpers import message, stream_chat

    now = int(time.time())  # the source's clock (s)
    first = [message(stream_chat(STREAM_START_MS + 1000 * i, i)) for i in range(4)]
    stream = TestStream()
    if not with_later:
        return stream.add_elements(first).advance_watermark_to_infinity()
    return (
        stream.add_elements([*first, b"not json"])
        .advance_watermark_to(now + 1)
        .add_elements([message(stream_chat(STREAM_START_MS + 150_000, 7))])  # passes window 0
        .advance_watermark_to(now + 2)  # window 0 published
        .add_elements([message(stream_chat(STREAM_START_MS + 160_000, 8))])
        .advance_watermark_to_infinity()
    )


def failures_here(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """What stops the stream from within (stream_drain.fail), this test's own: its list and
    its drain flag, so no test leaves another one a stream set to drain."""
    import threading

    from kvtrace.pipelines import stream_drain

    failures: list[BaseException] = []
    monkeypatch.setattr(stream_drain, "_FAILURES", failures)
    monkeypatch.setattr(stream_drain, "DRAINING", threading.Event())
    return failures


def rows_in(output: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in output.glob("window-*/trace-*.jsonl"))


def on_s3(tmp_path: Path, tokenizer: str) -> object:
    """The stream's output, dead letters and staging on S3, as `--output s3://...` gives them
    (the staging beside the output: publish.staging_folder)."""
    from helpers import streaming_config

    config = streaming_config(tmp_path, tokenizer)
    job = dataclasses.replace(
        config.job,
        output=f"s3://{BUCKET}/live",
        dead_letter=f"s3://{BUCKET}/live-rejected",
        staging=f"s3://{BUCKET}/.live.kvtrace-staging-run",
    )
    return dataclasses.replace(config, job=job)


def s3_lines(s3: object, prefix: str, suffix: str) -> int:
    """Lines of the objects under prefix whose names end with suffix."""
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    return sum(
        len(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().splitlines())
        for key in keys
        if key.startswith(prefix) and key.endswith(suffix)
    )


@pytest.mark.beam
def test_an_object_store_refusing_the_writer_loses_none_of_what_the_stream_read(
    s3, tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: a window the writer cannot publish, "a full disk, any refusal or error of its
    file system", is never lost: its requests become letters, the stream drains and stops in
    one line (docs/STREAMING.md, Stopping; round 25's test, here on an object store, where the
    stream's folder is documented to live: 'an object store's stream folder stays unmarked').
    The one failure handler (WriteWindows._write_plan, and _unpublished for the letters)
    catches JobStopped, OutputRefused and OSError; Beam's S3 file system raises its own
    S3ClientError (an Exception, not an OSError) for a refused upload (AccessDenied: a bucket
    policy, expired credentials; NoSuchBucket), from storage.create. It escapes the writer:
    Beam retries the bundle (publishing window-000000 again each time) and the job dies with
    a traceback, undrained: the requests of the windows still open, acknowledged on pull, are
    published nowhere, lettered nowhere, counted nowhere (no run counts at all), and no line
    says so. Here S3 refuses the upload of cumulative.json (a bucket policy on that key):
    window-000000's four requests and the poison message's letter are published, the two
    requests of window 2 are gone."""
    from apache_beam.io.aws.clients.s3 import boto3_client, messages

    from helpers import run_stream

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    failures = failures_here(monkeypatch)
    s3.create_bucket(Bucket=BUCKET)
    upload = boto3_client.Client.create_multipart_upload

    def refused(client: object, request: object) -> object:  # as S3 answers a denied PutObject
        if request.object.endswith("cumulative.json.tmp"):
            raise messages.S3ClientError("Access Denied", 403)
        return upload(client, request)

    monkeypatch.setattr(boto3_client.Client, "create_multipart_upload", refused)
    run_stream(on_s3(tmp_path, tiny_tokenizer), window_then_more())
    (line,) = [str(failure) for failure in failures]
    assert "\n" not in line
    rows = s3_lines(s3, "live/window-", ".jsonl")
    assert rows + s3_lines(s3, "live-rejected/rejected-", ".jsonl") == 7


@pytest.mark.beam
def test_a_file_name_not_utf8_in_the_streams_folder_loses_none_of_what_the_stream_read(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: as above. Same cause, on a local disk: the handler's closed list of what it
    catches. After each window write_cumulative stamps the folder's content time from its
    files' names (manifest.set_content_times -> folder_content_time, `listing.encode()`): a
    file whose name is not UTF-8 at the folder's top (a note, a sync tool's file: any
    process but kvtrace's commands may write there) raises UnicodeEncodeError, a ValueError,
    after window-000000 went into place. It escapes the writer, Beam retries the bundle and
    the job dies undrained: window 2's two requests and the poison message's letter are
    published, lettered and counted nowhere. Fixed both ways: a name is hashed as its bytes
    (os.fsencode), so this one is no error and the stream goes on (no stop: the one-line
    assertion is the next test's, where the step raises a ValueError of its own)."""
    import os

    from helpers import run_stream, streaming_config

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    failures = failures_here(monkeypatch)
    config = streaming_config(tmp_path, tiny_tokenizer)
    open(os.path.join(os.fsencode(config.job.output), b"notes-\xff.txt"), "wb").close()
    run_stream(config, window_then_more())
    assert not failures
    rows = rows_in(Path(config.job.output))
    assert rows + len(letters(Path(config.job.dead_letter))) == 7


@pytest.mark.beam
def test_any_error_of_a_step_after_the_window_loses_none_of_what_the_stream_read(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: as above, whatever a step raises: here stamping the folder's content time
    raises a ValueError (not an OSError) after window-000000 went into place; the handler
    catches every Exception, the stream stops in one line, and every record read is
    published or lettered."""
    from helpers import run_stream, streaming_config
    from kvtrace.pipelines import anonymize_streaming

    def broken(folder: str) -> None:
        raise ValueError("a step's own error")

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    monkeypatch.setattr(anonymize_streaming, "set_content_times", broken)
    failures = failures_here(monkeypatch)
    config = streaming_config(tmp_path, tiny_tokenizer)
    run_stream(config, window_then_more())
    (line,) = [str(failure) for failure in failures]
    assert "\n" not in line
    rows = rows_in(Path(config.job.output))
    assert rows == 4
    assert rows + len(letters(Path(config.job.dead_letter))) == 7
    assert stream_counts(config.job.dead_letter) == {"read": 7, "exported": 4, "rejected": 3}


@pytest.mark.beam
def test_a_window_in_place_whose_letters_fail_is_counted_as_published(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: every message exported once or lettered with a reason, and the run counts are
    what stands (docs/STREAMING.md, Stopping: 'a failure after the window went into place ...
    counts the window as exported'). _write_plan judges the window in place by whether
    _publish_window returned its manifest, not by what stands: _publish_window renames the
    window's folder into place (publish_night) and then settles its letters (DeadLetterRun.
    settle); when that settle fails (here something stands at the letters' name, as a folder
    not the stream's stands at a window's name in round 23's claim; a full disk refuses a
    rename too when the folder's entries need a new block), the window stands
    published, yet the handler restores the counts and letters every one of its requests
    `unpublished_window` ('window-000000 was not published: ...'): the run counts say
    exported 0 of 7 while window-000000's four rows stand in the output (and no
    cumulative.json counts them). Had its letters failed too, the stop's line would say the
    four were 'neither published nor lettered'."""
    from helpers import run_stream, streaming_config

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    failures = failures_here(monkeypatch)
    config = streaming_config(tmp_path, tiny_tokenizer)
    dead = Path(config.job.dead_letter)
    (dead / f"rejected-{config.stream_key()}-window-000000.jsonl").mkdir(parents=True)
    run_stream(config, window_then_more())
    assert failures  # the stream stopped on the failure
    rows = rows_in(Path(config.job.output))
    assert rows == 4  # window-000000 stands
    assert stream_counts(dead) == {"read": 7, "exported": rows, "rejected": 7 - rows}
    assert not list(dead.glob(".*"))  # its letters unsettled: dropped, lettered another way


@pytest.mark.beam
def test_letters_whose_publish_fails_are_never_taken_for_published(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: every record exported or lettered, or, should its letter not be written, the
    stop's one line counts it as "neither published nor lettered" (docs/STREAMING.md,
    Stopping). Same cause, the other way round: after a lone letters run fails, _write_plan
    takes its letters for published when anything stands at their name
    (storage.exists(self._published(plan))), not when they do. Here the run's rename
    (_rename_with_letters: cumulative.json renamed, then DeadLetterRun.settle) fails on what
    stands at rejected-KEY-letters-000001.jsonl: the handler returns as if published. The
    record (its text) stays in a hidden staging folder, lettered nowhere, no run counts are
    written at all, and the line names only the IsADirectoryError; the letters' pointer
    (.cumulative.json.tmp.letters, naming the private dead-letter folder's path) is left in
    the stream's published folder."""
    import re

    from apache_beam.testing.test_stream import TestStream

    from helpers import run_stream, streaming_config

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    failures = failures_here(monkeypatch)
    config = streaming_config(tmp_path, tiny_tokenizer)
    dead = Path(config.job.dead_letter)
    (dead / f"rejected-{config.stream_key()}-letters-000001.jsonl").mkdir(parents=True)
    poison = b"a private prompt logged as text, not JSON"
    run_stream(config, TestStream().add_elements([poison]).advance_watermark_to_infinity())
    (line,) = [str(failure) for failure in failures]
    lettered = [
        letter
        for path in dead.glob("rejected-*.jsonl")
        if path.is_file()
        for letter in path.read_text().splitlines()
    ]
    counted = re.search(r"\b1 records? read were neither published nor lettered", line)
    assert len(lettered) == 1 or counted, line
    assert not list(Path(config.job.output).glob(".*.letters"))  # no pointer left published


@pytest.mark.beam
def test_a_last_window_whose_totals_fail_is_counted(tiny_tokenizer, tmp_path, monkeypatch):
    """Promise: the stream drains and stops with 'run counts written: read = exported +
    rejected' (docs/STREAMING.md, Stopping). Round 25's handler counts a window in place
    whose cumulative.json could not be written as exported (in the writer's state) and returns:
    the run counts are written only by a later plan's letters (write_letters). When no plan
    follows (the window was the stream's last, or the drain's), they are never written: the
    four requests read and published are counted nowhere (no run-counts file at all), the
    stream's only record of what it read."""
    from helpers import run_stream, streaming_config

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    failures = failures_here(monkeypatch)
    config = streaming_config(tmp_path, tiny_tokenizer)
    (Path(config.job.output) / ".cumulative.json.tmp").mkdir()  # cumulative.json unwritable
    run_stream(config, window_then_more(with_later=False))
    assert failures  # the stream stopped on the failure
    assert rows_in(Path(config.job.output)) == 4
    assert stream_counts(config.job.dead_letter) == {"read": 4, "exported": 4, "rejected": 0}


@pytest.mark.beam
def test_a_batch_night_never_replaces_a_streams_window_on_an_object_store(
    s3, tiny_tokenizer, tmp_path, monkeypatch, capsys
):
    """Promise: nothing lost (a published window stays as published) and nothing written inside
    a command's output (round 23's test_a_batch_night_never_replaces_a_streams_published_window,
    fixed by the local stream folder's output mark). An object store's stream folder stays
    unmarked (anonymize_streaming.make_stream_folder) and carries no manifest, so to the plan
    (publish._check_not_in_an_output, folder_writer) s3://.../live is no command's output: a
    batch night given --output s3://.../live/window-000000 (a re-run of an hour, a typo)
    finds an earlier kvtrace output there (the window's manifest), replaces it and exits 0.
    The stream's published records of that window are gone, its run counts still say
    exported, its ids now another run's."""
    from helpers import run_stream, stream_chat, write_jsonl
    from kvtrace.cli import main

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    s3.create_bucket(Bucket=BUCKET)
    run_stream(on_s3(tmp_path, tiny_tokenizer), window_then_more(with_later=False))
    key = "live/window-000000/manifest.json"
    before = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    night = write_jsonl(
        tmp_path / "night.jsonl", [stream_chat(STREAM_START_MS + i, 10 + i) for i in range(3)]
    )
    code = main(
        [
            "anonymize",
            "--input",
            str(night),
            "--output",
            f"s3://{BUCKET}/live/window-000000",
            "--tokenizer",
            tiny_tokenizer,
            "--block-size",
            "4",
        ]
    )
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == before
    assert code == 2 and "lies inside" in capsys.readouterr().err


@pytest.mark.beam
def test_a_new_stream_of_an_emptied_output_never_replaces_the_earlier_streams_block_hashes(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: nothing lost; streams share a block-hashes folder (FOLDER/KEY-window-*/)
    "without replacing each other's files" (docs/STREAMING.md, Dead letters), and a stream
    starts only where it replaces nothing of an earlier one (check_new_stream: "only an earlier
    stream of this same output (its folder since emptied) could have left files the new one
    would replace", which it refuses in the dead-letter folder). The block-hashes folder is
    named by the same key and never checked: a stream's output archived (moved away) and a new
    stream started at the same path, given its own --dead-letter as the refusal asks and the
    same --emit-block-hashes folder, passes every launch check and replaces the earlier
    stream's HASHES/KEY-window-000000/ (its engine hashes, private, and the manifest digest
    naming the archived window) with its own."""
    import os

    from apache_beam.testing.test_stream import TestStream

    from helpers import message, stream_chat, streaming_config
    from kvtrace.pipelines import anonymize_streaming
    from kvtrace.transforms.encode.schemes import HashScheme
    from kvtrace.transforms.errors import ConfigError
    from kvtrace.transforms.write.publish import OutputRefused

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    config = streaming_config(tmp_path, tiny_tokenizer)
    hashes = tmp_path / "hashes"
    job = dataclasses.replace(
        config.job, hash_scheme=HashScheme("dynamo"), block_hashes=str(hashes)
    )

    def launch(first: int, dead_letter: str) -> None:
        """A stream of three requests through run_streaming's launch (its source a TestStream)."""
        records = [stream_chat(STREAM_START_MS + 1000 * i, first + i) for i in range(3)]
        stream = TestStream().add_elements([message(r) for r in records])
        monkeypatch.setattr(
            anonymize_streaming,
            "read_source",
            lambda source: stream.advance_watermark_to_infinity(),
        )
        own = dataclasses.replace(job, dead_letter=dead_letter)
        anonymize_streaming.run_streaming(dataclasses.replace(config, job=own), ["--streaming"])

    launch(0, str(tmp_path / "rejected-1"))
    before = {p.relative_to(hashes): p.read_bytes() for p in hashes.rglob("*") if p.is_file()}
    assert before  # the first stream's window-000000 hashes
    os.rename(job.output, tmp_path / "stream-archived")  # the stream's folder, emptied
    os.mkdir(job.output)
    try:
        launch(10, str(tmp_path / "rejected-2"))
    except (ConfigError, OutputRefused):
        pass  # refused: as good
    after = {p.relative_to(hashes): p.read_bytes() for p in hashes.rglob("*") if p.is_file()}
    assert after == before


@pytest.mark.beam
def test_a_streams_letters_are_never_written_inside_another_streams_folder_on_an_object_store(
    s3, tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: nothing private published (dead letters hold the records' text: 'never
    publish them'), and no private folder inside a command's output (the plan's
    _check_not_in_an_output refuses one inside a local stream's marked folder). Same cause as
    above: an object store's stream folder is no command's output to the plan, so a second
    stream launched with --dead-letter s3://.../live/rejected (inside the first stream's
    published prefix) passes every check, exits 0, and writes its letters, the text of a
    poison message here, and its run counts inside the first stream's folder."""
    from apache_beam.testing.test_stream import TestStream

    from helpers import run_stream
    from kvtrace.cli import main
    from kvtrace.pipelines import anonymize_streaming

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    s3.create_bucket(Bucket=BUCKET)
    run_stream(on_s3(tmp_path, tiny_tokenizer), window_then_more(with_later=False))
    poison = b"a private prompt logged as text, not JSON"
    stream = TestStream().add_elements([poison]).advance_watermark_to_infinity()
    monkeypatch.setattr(anonymize_streaming, "read_source", lambda source: stream)
    code = main(
        [
            "anonymize",
            "--streaming",
            "--input",
            "pubsub:projects/p/subscriptions/second",
            "--output",
            f"s3://{BUCKET}/second",
            "--dead-letter",
            f"s3://{BUCKET}/live/rejected",
            "--tokenizer",
            tiny_tokenizer,
            "--block-size",
            "4",
        ]
    )
    assert s3_lines(s3, "live/rejected/", "") == 0
    assert code == 2


@pytest.mark.beam
def test_a_window_whose_copy_fails_on_an_object_store_leaves_no_partial_copy(
    s3, tiny_tokenizer, tmp_path, monkeypatch
):
    """An object store publishes a window one object at a time, its manifest last: a copy
    refused part-way would leave the window's shards, no manifest, in the published prefix.
    The failure handler removes them; the window's requests are letters, counted."""
    from apache_beam.io.aws.clients.s3 import boto3_client, messages

    from helpers import run_stream

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    failures = failures_here(monkeypatch)
    s3.create_bucket(Bucket=BUCKET)
    copy = boto3_client.Client.copy

    def refused(client: object, request: object) -> object:
        if request.dest_key.startswith("live/window-") and request.dest_key.endswith(
            "manifest.json"
        ):
            raise messages.S3ClientError("Access Denied", 403)
        return copy(client, request)

    monkeypatch.setattr(boto3_client.Client, "copy", refused)
    config = on_s3(tmp_path, tiny_tokenizer)
    run_stream(config, window_then_more(with_later=False))
    assert failures
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    assert not [key for key in keys if key.startswith("live/window-")], keys
    assert s3_lines(s3, "live-rejected/rejected-", ".jsonl") == 4
