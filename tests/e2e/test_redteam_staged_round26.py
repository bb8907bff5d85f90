"""Red team round 26, a Beam night's commit: reproducers of holes at the boundary between the
job that stages a night (the Beam engine's child: rows, letters, block hashes, the record) and
the launcher that checks what was staged and publishes it (anonymize_night.finish_staged,
publish_staged, check_staged). Each asserts the promised behaviour (the launcher publishes only
what it can prove the job wrote for this night, else one line and nothing published; read =
exported + rejected, each rejected record with its letter) and is marked xfail (strict) until
it is fixed.

Faults are injected as rounds 23-24's were: a prelude run in the CLI's process (the Beam
engine's child is forked from it) wraps one of kvtrace's own functions right before or after a
named step, so nothing depends on timing: what a worker still running, a compromised or buggy
worker, or another process writing into the staging folders would leave there."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers import SALT, chat, kvtrace_child, peak_rss_mb, write_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.beam]

PRIVATE = "my card is 4111 1111 1111 1111"


def _night(folder: Path, tokenizer: str, *extra: str, requests: int = 8) -> list[str]:
    """A Beam night of a few chats and one line that is no JSON (one dead letter)."""
    (folder / "salt").write_text(SALT)
    records = [chat(i, 1_000 * i, session=f"s{i % 3}") for i in range(requests)]
    source = write_jsonl(folder / "in.jsonl", [*records, b"{broken"])
    return [
        "anonymize",
        "--engine",
        "beam",
        "--input",
        str(source),
        "--block-size",
        "4",
        "--salt-file",
        str(folder / "salt"),
        "--tokenizer",
        tokenizer,
        "--output",
        str(folder / "out"),
        "--quiet",
        *extra,
    ]


def _refused_in_one_line(said) -> None:
    errors = [line for line in said.stderr.splitlines() if line.startswith("error:")]
    assert said.returncode != 0 and len(errors) == 1, said.stderr[-2000:]
    assert "Traceback" not in said.stderr


def _published_text(out: Path) -> str:
    """Every published trace file's bytes (as text), a link followed where it resolves."""
    return "".join(
        path.read_bytes().decode("utf-8", "replace")
        for path in sorted(out.iterdir())
        if path.is_file()
    )


# The CLI's process (the launcher's publisher: anonymize_beam.run_beam -> publish_staged), once
# the child has verified the staging folder, committed the id map's version and staged the
# manifest: the staging folder's files replaced by another whole output kvtrace wrote (another
# night's, its own manifest.json listing them), as a second run staging there would leave it.
_ANOTHER_OUTPUT_STAGED = """
import os, shutil
import kvtrace.pipelines.anonymize_beam as beam_engine
_publish = beam_engine.publish_staged
def _replaced(config, manifest):
    for name in os.listdir(config.staging):
        os.remove(os.path.join(config.staging, name))
    for name in os.listdir({other!r}):
        shutil.copyfile(os.path.join({other!r}, name), os.path.join(config.staging, name))
    return _publish(config, manifest)
beam_engine.publish_staged = _replaced
"""


def test_a_staging_folder_replaced_after_the_child_checked_it_publishes_nothing(
    tiny_tokenizer, tmp_path
):
    """Promise (docs/NIGHTLY.md: 'A Beam night's launcher publishes only what it verified ...
    the folder is checked against its manifest once more from the bytes about to be published,
    just before the swap'; brief: a night publishes whole or not at all). The child derives the
    manifest from the staging folder (staged_manifest), commits the id map's version on it and
    returns it to the CLI's process; but that process's last check (publish_staged ->
    check_staged) holds the folder to the manifest.json it reads back from the staging folder,
    not to the manifest the child verified, committed and returned (publish_staged's own
    `manifest` argument, which it hands on to the block hashes only). A folder rewritten after
    the child's check together with its manifest.json passes: measured, another night's whole
    output (5 other requests, numbered by no id map) is published as this night's, exit 0, and
    `kvtrace audit` passes it, while the id map's new version records this night's 8 requests
    and ids (published_days {'0': 8}, next_id blocks 17); and a shard given a row
    `{..., "prompt": "my card is ..."}` with manifest.json's digest of it rewritten is published
    too. Fix: publish_staged holds the staged manifest's bytes to canonical_json of the manifest
    the child returned (check_staged given it, not reading it back) before anything else."""
    other = tmp_path / "other"
    (tmp_path / "other-in").mkdir()
    made = kvtrace_child(
        *_night(tmp_path / "other-in", tiny_tokenizer, "--engine", "local", requests=5)
    )
    assert made.returncode == 0, made.stderr[-2000:]
    (tmp_path / "other-in" / "out").rename(other)
    said = kvtrace_child(
        *_night(tmp_path, tiny_tokenizer, "--id-map", str(tmp_path / "map")),
        prelude=_ANOTHER_OUTPUT_STAGED.format(other=str(other)),
        timeout=120,
    )
    _refused_in_one_line(said)
    assert not (tmp_path / "out").exists()


# What the child's job leaves in the staging folder beside the files it wrote, before it
# stages the night's record (anonymize_night._stage_record): a link named as a trace shard to
# where the run's own dead letters are published (it dangles until they are), a FIFO and a
# subfolder, none of which kvtrace writes.
_ENTRIES_KVTRACE_NEVER_WRITES = """
import os
import kvtrace.pipelines.anonymize_night as night
_stage = night._stage_record
def _entries(config, record):
    if "manifest" in record:
        letters = os.path.join(os.path.dirname(config.staging), "out-rejected")
        run = config.staging.rsplit("-", 1)[1]
        link = os.path.join(config.staging, "trace-00001-of-00002.jsonl")
        os.symlink(os.path.join(letters, f"rejected-{run}.jsonl"), link)
        os.mkfifo(os.path.join(config.staging, "notes"))
        os.mkdir(os.path.join(config.staging, "more"))
    return _stage(config, record)
night._stage_record = _entries
"""


def test_a_staging_folder_holding_entries_kvtrace_never_writes_publishes_nothing(
    tiny_tokenizer, tmp_path
):
    """Promise (docs/NIGHTLY.md: the manifest 'is derived from the staging folder itself ...
    a file left out, a leftover one ... is a one-line error, nothing published'; STATUS: 'kvtrace
    audit accepts only what kvtrace writes'; brief: nothing private published). The launcher
    checks the staged files' bytes, never the entries that hold them, and runs no gate: the
    staging folder is listed by storage.files_in, which keeps regular files and links that
    resolve to one, so a dangling link, a FIFO, a socket or a subfolder is no file to either
    check (staged_manifest, check_staged), and publish_folder swaps the whole folder in.
    Measured: the published trace folder holds `trace-00001-of-00002.jsonl ->
    OUT-rejected/rejected-RUNID.jsonl`, which resolves to the run's private dead letters (each
    holding its record's line) once they are settled (a copy that follows links, `cp -L`,
    `gsutil cp -r`, `aws s3 sync`, publishes them), the FIFO `notes` and the folder `more`;
    exit 0, and `kvtrace audit` then flags all three (NOT publishable). Variants, each
    published (exit 0): a staged shard hard-linked from outside (st_nlink 2: a write to the
    outside name afterwards changed the published trace in place; the audit passes it too), a
    staged shard given a `user.note` extended attribute holding private text (copied by
    `cp -a`, `rsync -X`; the audit flags it), the staging folder itself swapped for a link to a
    folder of the same files (the output published as a link, still marked private; its letters
    then stay staged, as the output is not the folder their pointer names, while the summary
    names `rejected-RUNID.jsonl`, which does not exist); and leftovers by the hundred thousand
    are each digested and held in the derived manifest before the refusal (300,000 empty files:
    the child's peak 254 -> 552 MB).
    Fix: the launcher holds the staging folder, as it lists it (os.scandir, lstat), to the
    names kvtrace writes there and to the audit's own entry checks (transforms/stats/audit:
    regular files only, one link, no attribute but the SELinux label, no subfolder; the folder
    itself no link), refusing at the first other entry, in the pass that digests them
    (staged_files, check_staged)."""
    said = kvtrace_child(
        *_night(tmp_path, tiny_tokenizer), prelude=_ENTRIES_KVTRACE_NEVER_WRITES, timeout=120
    )
    _refused_in_one_line(said)
    assert not (tmp_path / "out").exists()


# Between the job's end and the commit: the run's staged dead letters (the one letters file in
# the letters' staging folder) emptied, as a disk error or a worker's second attempt leaves it.
_LETTERS_EMPTIED = """
import os
import kvtrace.pipelines.anonymize_night as night
_stage = night._stage_record
def _emptied(config, record):
    for name in os.listdir(config.dead_letter):
        if name.startswith("rejected-"):
            open(os.path.join(config.dead_letter, name), "wb").close()
    return _stage(config, record)
night._stage_record = _emptied
"""

# The same, for the block hashes staged beside their folder (write_shard's, owner-only).
_BLOCK_HASHES_EMPTIED = """
import os
import kvtrace.pipelines.anonymize_night as night
from kvtrace.transforms.write.shards import block_hashes_staging
_stage = night._stage_record
def _emptied(config, record):
    staged = block_hashes_staging(config.block_hashes, config.staging)
    for name in os.listdir(staged):
        open(os.path.join(staged, name), "wb").close()
    return _stage(config, record)
night._stage_record = _emptied
"""


def test_a_nights_letters_emptied_before_the_commit_are_not_published_as_its_own(
    tiny_tokenizer, tmp_path
):
    """Promise (brief: nothing lost, every record exported or dead-lettered with a reason;
    read = exported + rejected; the launcher publishes only letters it can prove the job wrote
    for this night). The launcher checks the staged rows, the record and the segment folder,
    but never the letters' staging folder: the letters file, the run counts (run-counts.json,
    what the summary prints) and the measured parts are published and believed as the job left
    them (publish.DeadLetterRun.settle renames whatever stands). Measured: the letters file
    emptied (or removed) after the job, and the night publishes, exit 0, saying `9 read = 8
    exported + 1 rejected ... invalid_json 1: OUT-rejected/rejected-RUNID.jsonl (one line
    each)`, a file of 0 lines (or none at all): the rejected record is lost without a word.
    Fix: stage_night records the letters file's digest and count (letters_written already
    carries the count) and the run counts; finish_staged derives both from the letters'
    staging folder as staged_manifest derives the trace's (the letters counted by line, the
    run counts' exported those of the staged rows, read = exported + rejected), and
    check_staged holds the letters' folder to them once more before the publication."""
    said = kvtrace_child(*_night(tmp_path, tiny_tokenizer), prelude=_LETTERS_EMPTIED, timeout=120)
    letters = sorted((tmp_path / "out-rejected").glob("rejected-*.jsonl"))
    if said.returncode == 0:  # published: then with its one letter
        assert [len(f.read_bytes().splitlines()) for f in letters] == [1], said.stdout[:300]
    else:
        _refused_in_one_line(said)
        assert not (tmp_path / "out").exists() and not letters


def test_a_nights_block_hashes_emptied_before_the_commit_are_not_published(
    tiny_tokenizer, tmp_path
):
    """Promise (as the letters' above; docs/OUTPUT.md: the block hashes are published after
    the output they belong to, naming its manifest). The staged block hashes are never checked
    either: publish_block_hashes writes `manifest.json.sha256` naming the published manifest
    beside whatever the staging folder holds and swaps it in. Measured (--hash-scheme dynamo
    --emit-block-hashes): the staged file emptied after the job, and the night publishes,
    exit 0, a 0-byte `block-hashes-00000-of-00001.parquet` beside a digest saying it belongs
    to the trace. Fix: as the letters' (the block hash files' digests in the record, derived
    again from their staging folder, checked before the swap)."""
    hashes = tmp_path / "hashes"
    said = kvtrace_child(
        *_night(
            tmp_path, tiny_tokenizer, "--hash-scheme", "dynamo", "--emit-block-hashes", str(hashes)
        ),
        prelude=_BLOCK_HASHES_EMPTIED,
        timeout=120,
    )
    if said.returncode == 0:  # published: then the night's block hashes, a Parquet file
        files = sorted(hashes.glob("block-hashes-*.parquet"))
        assert files and all(f.read_bytes()[:4] == b"PAR1" for f in files), said.stderr
    else:
        _refused_in_one_line(said)
        assert not hashes.exists() and not (tmp_path / "out").exists()


# A worker's shard writer (write/shards.write_shard, a step of the job) writing a row kvtrace
# never writes: a field beyond the trace's own, holding private text. Its digest, the manifest
# and the night's record are the job's own, so they agree with the folder.
_A_WORKERS_FOREIGN_ROW = f"""
import kvtrace.transforms.write.shards as shards
_jsonl = shards.jsonl_bytes
def _foreign(columns):
    lines = _jsonl(columns).splitlines(keepends=True)
    lines[0] = lines[0][:-2] + b', "prompt": "{PRIVATE}"}}\\n'
    return b"".join(lines)
shards.jsonl_bytes = _foreign
"""


def test_a_shard_a_worker_wrote_unlike_kvtrace_is_not_published(tiny_tokenizer, tmp_path):
    """Promise (brief: accept only what kvtrace itself would write; nothing private published;
    docs/AUDIT.md: 'The gate passes only what kvtrace itself writes'). The cause of the test
    above, in the files' bytes this time: the launcher derives the
    manifest from the staging folder and holds the record to it, but of the rows it reads only
    each line's leading time (RowTimes): what follows, the Parquet twin and stats.json are
    taken as the workers wrote them. A worker writing rows kvtrace does not (compromised, or
    of another kvtrace build: nothing pins a worker's version to the launcher's, as the salt
    is pinned) publishes them. Measured: a first row `{"timestamp": 0, ..., "session": 0,
    "prompt": "my card is ..."}` published, exit 0; `kvtrace audit` of the folder then says
    `FLAG ...jsonl: line 1: fields beyond the trace's own: prompt` (and a shard whose JSONL
    lost a row: `...parquet: not the bytes kvtrace writes for the rows of its JSONL twin`).
    Fix: staged_manifest's one pass holds each shard to the audit's own row checks
    (transforms/stats/audit: fields, ranges, the Parquet twin as the JSONL's bytes, stats.json
    as the rows give it), so the launcher publishes only a folder its gate would pass."""
    said = kvtrace_child(
        *_night(tmp_path, tiny_tokenizer), prelude=_A_WORKERS_FOREIGN_ROW, timeout=120
    )
    out = tmp_path / "out"
    if said.returncode == 0:
        assert PRIVATE not in _published_text(out)
        rows = (out / "trace-00000-of-00001.jsonl").read_text().splitlines()
        assert all("prompt" not in json.loads(row) for row in rows)
    else:
        _refused_in_one_line(said)
        assert not out.exists()


# The job's segment file's index grown huge before the record is staged (a sparse GiB: a disk
# error, a worker writing past its end), the record saying its size as the worker would: its
# true one (its sha256 left as it was).
_A_HUGE_STAGED_INDEX = """
import os
import kvtrace.pipelines.anonymize_night as night
from kvtrace.transforms.ids import id_map
_stage = night._stage_record
def _grown(config, record):
    if "segments" in record:
        run = config.id_map
        entry = record["segments"]["blocks"][0]
        path = id_map.segment_path(
            run.directory, run.base.version + 1, run.run_id, "blocks", entry["shard"]
        )
        os.truncate(path[: -len(".parquet")] + ".index.npz", 1 << 30)
        entry["index"]["bytes"] = 1 << 30
    return _stage(config, record)
night._stage_record = _grown
"""


def test_a_huge_staged_segment_file_is_refused_in_bounded_memory(tiny_tokenizer, tmp_path):
    """Promise (brief: bounded memory on a huge staged file; docs/BOUNDS.md, 'a Beam night's
    staged record': 'an index's size its file's before it is read', so that an index size of
    10^15 is 'a one-line refusal, not a MemoryError'). The claim is now bounded by the file's
    true size (_check_run_folder), but the file is not bounded by anything: the launcher then
    reads the index whole into memory to digest it (_verified -> segments.check_listed ->
    _read_whole: handle.read(size + 1)) before it finds its sha256 wrong. Measured: a 1 GiB
    sparse index and the record's size of it, and the launcher peaks at 1.31 GB (a clean night
    254 MB) before its one-line refusal; the data file likewise (a 1 GiB sparse file whose last
    8 bytes give a footer of 1 GiB - 16: _read_footer reads it whole, 1.31 GB). Its line also
    says `id map file ... is damaged ... Restore the id map from a backup`, of a staged file no
    version lists. Fix: _bounded / _check_run_folder bound each staged file by what
    write_segment writes for the rows the entry claims (an index: its Bloom filter and row
    groups for that many rows; a footer: its row groups' metadata), and check_listed digests
    the index in chunks, loading it only once verified."""
    night = _night(tmp_path, tiny_tokenizer, "--id-map", str(tmp_path / "map"))
    code = f"{_A_HUGE_STAGED_INDEX}\nimport sys\nfrom kvtrace.cli import main\n"
    code += "sys.exit(main(sys.argv[1:]))"
    status, peak, stderr = peak_rss_mb([sys.executable, "-c", code, *night])
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert status != 0 and len(errors) == 1, stderr[-2000:]
    assert not (tmp_path / "out").exists()
    assert peak < 700, f"peak RSS {peak} MB for a 1 GiB staged index"
