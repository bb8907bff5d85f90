"""Red team round 3, the write protocol and the trace readers: reproducers of holes left after
the second round's fixes. Each asserts the promised behaviour, so each fails until it is fixed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import anonymize, chat, write_jsonl
from kvtrace.cli import main
from kvtrace.transforms.write.manifest import read_run_counts

pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parents[1]
ROUND3 = "red team round 3"

TRACE = [
    {
        "timestamp": 1000 * i,
        "input_length": 40 + i,
        "output_length": 5,
        "hash_ids": [1, 2, 10 + i],
        "session": i % 2,
    }
    for i in range(6)
]


def _in_mount_namespace(script: str, *args: str) -> subprocess.CompletedProcess:
    """Run a shell script in a private mount namespace (its mounts are seen by no one else);
    skipped where the system allows none."""
    if (
        shutil.which("unshare") is None
        or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0
    ):
        pytest.skip("no private mount namespaces here")
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", *args],
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])},
    )


def test_json_never_replaces_its_input_through_a_bind_mount(tmp_path):
    """plan_locations compares places (paths with links resolved: publish.place), never what
    they are: a folder mounted at a second path (a bind mount, or the same export mounted
    twice) is two places. `analyze A/t.jsonl --json B/t.jsonl`, B a bind mount of A, passes the
    plan, reads the trace and renames the report over it: the input is gone, exit 0. (Comparing
    each placed parent's (st_dev, st_ino) would catch it.)"""
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    trace = write_jsonl(first / "t.jsonl", TRACE)
    before = trace.read_bytes()
    done = _in_mount_namespace(
        'mount --bind "$1" "$2" || exit 99; exec "$3" -m kvtrace.cli analyze "$1/t.jsonl" '
        '--block-size 4 --json "$2/t.jsonl"',
        str(first),
        str(second),
        sys.executable,
    )
    if done.returncode == 99:
        pytest.skip("bind mounts are not allowed here")
    assert trace.read_bytes() == before, "the input trace was replaced by the --json report"
    assert done.returncode == 2, done.stderr


@pytest.mark.parametrize("command", ["validate", "analyze"])
def test_a_lone_shard_of_several_is_not_read_as_a_whole_trace(
    tiny_tokenizer, tmp_path, monkeypatch, command
):
    """trace_inputs.check_whole reads a shard with no manifest beside it as a trace of its own
    when no other kvtrace file sits there (the 'lone shard' rule), though its own name says it
    is one of several: a copy that has so far brought trace-00001-of-00003.jsonl alone (the
    manifest and the other shards not yet copied) is 'valid' to validate and analysed as the
    night (2 of its 6 rows), exit 0. A shard named k-of-N with N > 1 is never whole alone."""
    from kvtrace.transforms.write import shards

    monkeypatch.setattr(shards, "MAX_BLOCKS_PER_SHARD", 20)  # three shards of a small night
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 86_400_000 * i) for i in range(6)])
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, [src], out, "--block-size", "4") == 0
    part = tmp_path / "copy"
    part.mkdir()
    shutil.copy(out / "trace-00001-of-00003.jsonl", part)  # the copy so far
    assert main([command, str(part), "--block-size", "4"]) != 0


def test_the_beam_engine_during_a_publish_reads_one_whole_output(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Round 2 made the local reader read a folder through one descriptor opened with its
    manifest; the Beam engines (analyze/reuse --engine beam) read each file on its own
    (trace_shards.read_chunk -> read_trace([path])), each opening the folder anew and checking
    its one shard against the manifest found then, and _check_exported counts rows only when
    every shard of a folder is read in one call. A publish between two files' reads (done here
    at that moment) mixes two whole outputs: 7 rows, of neither night (6 and 6), exit 0."""
    from kvtrace.transforms.stats import trace_shards
    from kvtrace.transforms.write import shards

    monkeypatch.setattr(shards, "MAX_BLOCKS_PER_SHARD", 20)  # three shards of a small night
    old = write_jsonl(tmp_path / "old.jsonl", [chat(i, 86_400_000 * i) for i in range(6)])
    new = write_jsonl(
        tmp_path / "new.jsonl", [chat(i + 4, 86_400_000 * i, rotate=3) for i in range(6)]
    )
    out, staged = tmp_path / "out", tmp_path / "next"
    assert anonymize(tiny_tokenizer, [old], out, "--block-size", "4") == 0
    assert anonymize(tiny_tokenizer, [new], staged, "--block-size", "4") == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in staged.iterdir())
    wanted = []
    for night in (out, staged):
        assert main(["analyze", str(night), "--json", str(tmp_path / f"{night.name}.json")]) == 0
        wanted.append(json.loads((tmp_path / f"{night.name}.json").read_text()))
    read = trace_shards.read_trace
    calls = []

    def then_published(files):
        trace = read(files)
        calls.append(files)
        if len(calls) == 1:  # the next night's publish, at this moment
            os.rename(out, tmp_path / "previous")
            os.rename(staged, out)
        return trace

    monkeypatch.setattr(trace_shards, "read_trace", then_published)
    report = tmp_path / "report.json"
    code = main(["analyze", str(out), "--engine", "beam", "--json", str(report)])
    assert len(calls) == 3
    if code == 0:
        assert json.loads(report.read_text()) in wanted, "a mix of two outputs was analysed"


@pytest.mark.parametrize(
    "command",
    [
        ["validate", "TRACE", "--block-size", "4", "--json", "NIGHT/stats.json"],
        [
            "export",
            "TRACE",
            "--block-size",
            "4",
            "--to",
            "aiperf",
            "--overwrite",
            "-o",
            "NIGHT/trace-00000-of-00001.jsonl",
        ],
        ["analyze", "TRACE", "--block-size", "4", "--json", "NIGHT/analysis.json"],
    ],
)
def test_a_file_output_never_goes_into_another_commands_published_folder(
    tiny_tokenizer, tmp_path, command
):
    """check_written checks a file output as a file only (check_file): a folder output may not
    replace another command's output, and a private one may not go inside one
    (_check_private), but a report or export file is written into a published night it does
    not read, over its stats.json or a shard, or beside them: exit 0, and the night is no
    longer whole (readers refuse it: 'stats.json differs from its manifest'; audit: NOT
    publishable; the next anonymize of it is refused: a file kvtrace did not write)."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)])
    night = tmp_path / "night"
    assert anonymize(tiny_tokenizer, [src], night, "--block-size", "4") == 0
    before = {p.name: p.read_bytes() for p in night.iterdir()}
    trace = write_jsonl(tmp_path / "t.jsonl", TRACE)
    args = [a.replace("TRACE", str(trace)).replace("NIGHT", str(night)) for a in command]
    code = main(args)
    assert {p.name: p.read_bytes() for p in night.iterdir()} == before, (
        "a published output was changed by another command's file output"
    )
    assert code == 2


def test_a_published_runs_letters_survive_a_run_with_another_dead_letter_folder(
    tiny_tokenizer, tmp_path
):
    """DeadLetterRun tells whether a killed run's output was published by the run's mark on the
    output folder (an extended attribute); but the mark is one per output while letters are
    per dead-letter folder, and every run of the output unmarks it (recover_letters, settle)
    looking only in its own --dead-letter folder. A run killed after publishing (letters staged
    in D), then a run of the same output with --dead-letter D2 that fails (the output stays the
    killed run's): the mark is gone, so the next run with D removes the letters as never
    published. The output stands with its run's one rejected record in no letter anywhere.
    (Fixed: the mark names the run's dead-letter folder too, and every later run of the output
    settles the marked run's letters there first: publish.settle_marked_letters.)"""
    bad = tmp_path / "in.jsonl"
    bad.write_text(
        '{"timestamp": 5, "messages": 7}\n'
        + "".join(json.dumps(chat(i, 1000 * i)) + "\n" for i in range(6))
    )
    out, letters, other = tmp_path / "out", tmp_path / "D", tmp_path / "D2"
    common = [
        "anonymize",
        "--input",
        str(bad),
        "--output",
        str(out),
        "--tokenizer",
        tiny_tokenizer,
        "--block-size",
        "4",
    ]
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys\nfrom kvtrace.transforms.write import publish\n"
            "publish.DeadLetterRun.settle = lambda self, ok: os._exit(137)\n"
            "from kvtrace.cli import main\nsys.exit(main(sys.argv[1:]))",
            *common,
            "--dead-letter",
            str(letters),
        ],
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])},
    )
    assert killed.returncode == 137, killed.stderr  # killed after publishing, before settling
    published = (out / "manifest.json").read_bytes()
    [staged] = letters.glob(".*.kvtrace-staging-*")  # the run's counts, beside its letters
    assert read_run_counts(str(staged))["rejected"] == 1
    run_id = staged.name.rsplit("-", 1)[1]
    # Two later runs of the same output that fail (too much rejected): it stays the killed run's.
    assert main([*common, "--dead-letter", str(other), "--max-rejected-fraction", "0"]) != 0
    assert main([*common, "--dead-letter", str(letters), "--max-rejected-fraction", "0"]) != 0
    assert (out / "manifest.json").read_bytes() == published
    kept = [
        p
        for p in tmp_path.rglob("*")
        if p.is_file() and "wrong_type" in p.read_text(errors="replace") and p.parent != tmp_path
    ]
    assert kept, "the published output's rejected record is in no dead letter"
    assert kept == [letters / f"rejected-{run_id}.jsonl"], "published once, as the killed run's"


@pytest.mark.parametrize("command", ["analyze", "validate"])
def test_the_block_size_is_read_from_the_output_whose_rows_are_read(
    tiny_tokenizer, tmp_path, monkeypatch, command
):
    """Round 2 made the rows of a folder come through one descriptor opened with its manifest
    (trace_io.read_trace), but the block size they are analysed with is read before, by path,
    from whatever manifest.json is there then (trace_inputs.declared_block_size). A publish
    between the two (done here at that moment) has the next night's rows (block size 8)
    analysed with the previous night's block size (4): analyze reports numbers of neither
    output (exit 0), and validate calls the whole new night NOT VALID."""
    from kvtrace.transforms.read import trace_io

    old = write_jsonl(tmp_path / "old.jsonl", [chat(i, 1000 * i) for i in range(4)])
    new = write_jsonl(tmp_path / "new.jsonl", [chat(i + 4, 1000 * i, rotate=3) for i in range(5)])
    out, staged = tmp_path / "out", tmp_path / "next"
    assert anonymize(tiny_tokenizer, [old], out, "--block-size", "4") == 0
    assert anonymize(tiny_tokenizer, [new], staged, "--block-size", "8") == 0
    wanted = []
    for night in (out, staged):
        report = tmp_path / f"{night.name}.json"
        assert main([command, str(night), "--json", str(report)]) == 0
        wanted.append(json.loads(report.read_text()))
    promised = trace_io.published_shards

    def then_published(files):
        if not (tmp_path / "previous").exists():  # the next night's publish, at this moment
            os.rename(out, tmp_path / "previous")
            os.rename(staged, out)
        return promised(files)

    monkeypatch.setattr(trace_io, "published_shards", then_published)
    report = tmp_path / "report.json"
    code = main([command, str(out), "--json", str(report)])
    assert (tmp_path / "previous").exists()
    if code == 0 or report.exists():
        got = json.loads(report.read_text())
        assert got in wanted, "rows of one output analysed with another's block size"
    assert code == 0, "a whole output refused"


@pytest.mark.parametrize("second", ["./{out}", "{abs}", "./{out}/trace-00000-of-00001.parquet"])
def test_an_output_named_twice_is_read_once(tiny_tokenizer, tmp_path, monkeypatch, second):
    """trace_inputs.trace_files drops repeats and Parquet twins by the string of the path only
    ('twins and repeats dropped'; 'no row is counted twice'): the same published folder named
    as `out` and `./out` (or by its absolute path, or its Parquet twin as ./out/...) is read
    twice, each copy passing its manifest's checks: analyze reports 12 requests of a 6-request
    night, exit 0 (export would replay every request twice)."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(6)])
    assert anonymize(tiny_tokenizer, [src], tmp_path / "out", "--block-size", "4") == 0
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "report.json"
    code = main(
        ["analyze", "out", second.format(out="out", abs=tmp_path / "out"), "--json", str(report)]
    )
    assert code == 0
    assert json.loads(report.read_text())["total_requests"] == 6, "rows counted twice"


def test_a_folder_that_cannot_be_renamed_is_refused_before_the_work(tiny_tokenizer, tmp_path):
    """publish._swap_in falls back from renameat2(RENAME_EXCHANGE) to two renames only on
    EINVAL/ENOSYS/EOPNOTSUPP, and the plan never tries whether the output's folder can take a
    folder rename: on an overlay filesystem mounted without redirect_dir (rootless containers'
    native overlay: redirect_dir=nofollow), every folder rename fails with EXDEV. anonymize
    does all its work, then fails at the publish ('error: [Errno 18] Invalid cross-device
    link'); nothing can ever be published there, and the plan promised 'nothing computed for a
    location that cannot be published'."""
    lower, upper, work, merged = (tmp_path / n for n in ("l", "u", "w", "m"))
    for folder in (lower, upper, work, merged):
        folder.mkdir()
    write_jsonl(lower / "in.jsonl", [chat(i, 1000 * i) for i in range(4)])
    done = _in_mount_namespace(
        'mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3" "$4" || exit 99; '
        'exec "$5" -m kvtrace.cli anonymize --input "$4/in.jsonl" --output "$4/out" '
        '--tokenizer "$6" --block-size 4',
        str(lower),
        str(upper),
        str(work),
        str(merged),
        sys.executable,
        tiny_tokenizer,
    )
    if done.returncode == 99:
        pytest.skip("overlay mounts are not allowed here")
    published = (upper / "out" / "manifest.json").exists()
    assert published or "anonymizing" not in done.stderr, (
        f"the work was done for an output that cannot be published: {done.stderr[-300:]}"
    )


def test_a_rolled_back_id_map_is_refused_however_it_is_spelled(tiny_tokenizer, tmp_path):
    """The id map's anchor (ids/anchor.py) is named by the map directory's absolute path with
    links kept (map_location: os.path.abspath), so one map spelled through a link to its
    parent folder has another mark, and none: a map rolled back to an older version (a restored
    backup) is refused as `real/map` but extended as `alias/map` (alias -> real), numbering new
    keys from the old next_id again, ids that published traces already use."""
    salt = tmp_path / "salt"
    salt.write_text("0123456789abcdef0123456789abcdef")
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to("real")
    first = write_jsonl(tmp_path / "n1.jsonl", [chat(i, 1000 * i) for i in range(4)])
    # night 2 comes after night 1, as a map's nights must (id_map.check_night_follows)
    second = write_jsonl(
        tmp_path / "n2.jsonl", [chat(i + 4, 10_000 + 1000 * i, rotate=3) for i in range(4)]
    )

    def night(src: Path, out: str, mapdir: Path) -> int:
        return main(
            [
                "anonymize",
                "--input",
                str(src),
                "--output",
                str(tmp_path / out),
                "--tokenizer",
                tiny_tokenizer,
                "--block-size",
                "4",
                "--salt-file",
                str(salt),
                "--id-map",
                str(mapdir),
            ]
        )

    real = tmp_path / "real" / "map"
    assert night(first, "o1", real) == 0
    shutil.copytree(real, tmp_path / "backup")
    assert night(second, "o2", real) == 0  # version 2 published, and marked
    shutil.rmtree(real)
    shutil.copytree(tmp_path / "backup", real)  # the map rolled back to version 1
    assert night(second, "o3", real) != 0  # refused, as promised
    assert night(second, "o4", tmp_path / "alias" / "map") != 0, "a rolled-back map extended"


@pytest.mark.parametrize("command", ["validate", "analyze"])
def test_a_glob_of_a_whole_output_is_read_not_called_a_partial_copy(
    tiny_tokenizer, tmp_path, command
):
    """`out/*` matches the whole published folder (manifest.json and stats.json among its
    files); trace_files passes every match to check_whole as a trace file read, and the
    manifest is not among the files it lists for itself: the whole output is refused as
    'not a whole kvtrace output: manifest.json differs from its manifest (copied partly?)',
    exit 2, though nothing in it was changed (its shards alone, or the folder, read fine)."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)])
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, [src], out, "--block-size", "4") == 0
    assert main([command, str(out)]) == 0
    assert main([command, str(out / "*")]) == 0, "a whole output refused as a partial copy"


@pytest.mark.parametrize("flag", ["--output", "--dead-letter"])
def test_a_folder_output_whose_files_the_input_glob_reads_is_refused(
    tiny_tokenizer, tmp_path, monkeypatch, flag
):
    """Reach.meets takes a written folder for read by a glob only when the folder itself
    matches all of the glob's wildcards (len(below) >= len(wildcards)), never when the files it
    will hold do: with --input 'logs/*/*.jsonl', --output logs/night (and its dead letters,
    logs/night-rejected) pass the plan, and the next night's run reads last night's trace
    shard and its raw-prompt dead letters as request logs (3 files instead of 1)."""
    day = tmp_path / "logs" / "day1"
    day.mkdir(parents=True)
    (day / "in.jsonl").write_text(
        '{"timestamp": 5, "messages": 7}\n'
        + "".join(json.dumps(chat(i, 1000 * i)) + "\n" for i in range(6))
    )
    monkeypatch.chdir(tmp_path)
    where = {
        "--output": ["--output", "logs/night"],
        "--dead-letter": ["--output", "night", "--dead-letter", "logs/letters"],
    }[flag]
    code = main(
        [
            "anonymize",
            "--input",
            "logs/*/*.jsonl",
            *where,
            "--tokenizer",
            tiny_tokenizer,
            "--block-size",
            "4",
        ]
    )
    assert code == 2, "an output the input pattern reads was published"


def test_analyze_output_never_removes_a_file_no_run_wrote(tmp_path):
    """analyze's output folder has no manifest: check_output takes any folder holding only
    files named analysis.txt / analysis.json for an earlier analyze output (OWN_FILES, by name
    alone), so a folder of the user's own notes by that name is replaced whole and the notes
    removed, exit 0 ('it removes only what an earlier run published'). A marker kvtrace writes
    (a manifest, or the sha256 of what it published) would tell its own files from these."""
    trace = write_jsonl(tmp_path / "t.jsonl", TRACE)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "analysis.txt").write_text("my own notes on last quarter's traffic\n")
    code = main(["analyze", str(trace), "--block-size", "4", "--output", str(notes)])
    assert (
        notes / "analysis.txt"
    ).read_text() == "my own notes on last quarter's traffic\n" or code == 2, (
        "a file no kvtrace run wrote was removed"
    )
