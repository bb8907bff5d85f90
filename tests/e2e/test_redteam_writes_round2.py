"""Red team round 2, the write protocol and the trace readers: reproducers of holes left after
the first round's fixes. Each asserts the promised behaviour, so each fails until it is fixed."""

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

pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parents[1]

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


def _run(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvtrace.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            **(env or {}),
            "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]),
        },
    )


def _crash(point: int, mode: str, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TESTS / "crashpoints.py"), str(point), mode, *args],
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])},
    )


def test_a_folder_named_with_glob_characters_is_read_not_another_folder(
    tiny_tokenizer, tmp_path, capsys
):
    """trace_inputs.trace_files reads a folder as the glob FOLDER/trace-*.jsonl, unescaped: for
    a folder named night[1], `[1]` is a character class, so `analyze night[1]` silently
    analyzes night1, another output (its manifest checks night1's shards, so it passes). The
    replay commands anonymize prints (`kvtrace export night[1] ...`) export the wrong night."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(6)])
    other = write_jsonl(tmp_path / "other.jsonl", [chat(i, 1000 * i, rotate=2) for i in range(3)])
    assert anonymize(tiny_tokenizer, [src], tmp_path / "night[1]", "--block-size", "4") == 0
    assert anonymize(tiny_tokenizer, [other], tmp_path / "night1", "--block-size", "4") == 0
    capsys.readouterr()
    report = tmp_path / "report.json"
    assert main(["analyze", str(tmp_path / "night[1]"), "--json", str(report)]) == 0
    assert json.loads(report.read_text())["total_requests"] == 6, (
        "analyze night[1] read the folder night1"
    )


@pytest.mark.parametrize("command", [["analyze"], ["validate"], ["audit"]])
def test_json_never_replaces_an_input_whose_name_has_glob_characters(tmp_path, command):
    """plan_locations (Reach.of) takes every read location with `[`, `*` or `?` for a glob, even
    a file that exists by that name (expand_inputs reads it as that file): `t[1].jsonl` as a
    glob matches only `t1.jsonl`, so --json t[1].jsonl is not found to be the input, and the
    trace is replaced by the report, exit 0."""
    trace = write_jsonl(tmp_path / "t[1].jsonl", TRACE)
    before = trace.read_bytes()
    extra = [] if command[0] == "audit" else ["--block-size", "4"]
    code = main([command[0], str(trace), *extra, "--json", str(trace)])
    assert trace.read_bytes() == before, "the input trace was replaced by the --json report"
    assert code == 2


def test_a_tilde_in_a_path_is_read_and_written_where_it_is_checked(tmp_path):
    """plan_locations expands `~` (written_place, read_place: os.path.expanduser) but the
    readers and writers do not: `analyze '~/t.jsonl' --json ./~/t.jsonl` is checked as
    $HOME/t.jsonl against ./~/t.jsonl (no overlap), then reads and replaces ./~/t.jsonl, the
    same file, exit 0. (A quoted `~` reaches kvtrace from configs and launchers.)"""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    (work / "~").mkdir(parents=True)
    trace = write_jsonl(work / "~" / "t.jsonl", TRACE)
    before = trace.read_bytes()
    done = _run(
        ["analyze", "~/t.jsonl", "--block-size", "4", "--json", str(trace)],
        work,
        {"HOME": str(home)},
    )
    assert trace.read_bytes() == before, "the input trace was replaced by the --json report"
    assert done.returncode == 2, done.stderr


BAILIAN = [
    {
        "chat_id": i,
        "parent_chat_id": -1,
        "timestamp": float(i),
        "input_length": 16,
        "output_length": 5,
        "type": "text",
        "turn": 1,
        "hash_ids": [i],
    }
    for i in range(5)
]


@pytest.mark.parametrize("command", ["synthesize", "reuse", "convert-folder"])
def test_a_failed_run_publishes_nothing(tmp_path, capsys, command):
    """A run with no readable row fails (exit 1: synthesize says 'error: no trace rows could be
    read'; convert says nothing) after publishing an empty output over the earlier, good one:
    run_synthesize and convert publish inside file_output/folder_output before the command
    looks at what it read (convert-folder: an empty shard and a manifest saying 0 rows; reuse:
    an empty plot over the earlier one, run_reuse publishing before cache.reuse's _has_rows)."""
    if command == "synthesize":
        good = write_jsonl(tmp_path / "good.jsonl", TRACE)
        args, out = ["synthesize", "--block-size", "4", "-o"], tmp_path / "s"
    elif command == "reuse":
        good = write_jsonl(tmp_path / "good.jsonl", TRACE)
        args, out = ["reuse", "--block-size", "4", "--output"], tmp_path / "p.png"
    else:
        good = write_jsonl(tmp_path / "good.jsonl", BAILIAN)
        args = ["convert", "--output"]
        out = tmp_path / "c"
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"x": 1}])
    assert main([args[0], str(good), *args[1:], str(out)]) == 0
    snapshot = (
        (lambda: {p.name: p.read_bytes() for p in out.iterdir()})
        if out.is_dir()
        else out.read_bytes
    )
    earlier = snapshot()
    capsys.readouterr()
    code = main([args[0], str(bad), *args[1:], str(out)])
    assert code == 1
    assert snapshot() == earlier, "the failed run replaced the output with an empty one"


def _snapshot(path: Path) -> object:
    if path.is_dir():
        return {p.name: p.read_bytes() for p in sorted(path.iterdir())}
    return path.read_bytes()


@pytest.mark.parametrize("mode", ["kill", "enospc"])
@pytest.mark.parametrize("command", ["synthesize", "analyze"])
def test_an_output_and_its_json_report_are_published_together(tmp_path, mode, command):
    """synthesize -o S --json J publishes S, then stages and publishes J as a second file
    (analyze --output O --json J: J first, then O): a kill (or a full disk) between the two
    leaves one output new and the other the previous run's (crash-point harness), and on a
    full disk the run exits 2 with one output published. A run publishes whole or not at
    all. Fixed: both staged, published together, the report last, the output put back if the
    report's publish fails; a full disk at any step leaves both previous or both new. POSIX
    renames one name at a time, so one kill window is left (docs/OUTPUT.md): before the report's
    rename, the new output beside the previous report, and only there."""
    first = write_jsonl(tmp_path / "first.jsonl", TRACE[:3])
    second = write_jsonl(tmp_path / "second.jsonl", TRACE)
    out, summary = tmp_path / "out", tmp_path / "s.json"
    flag = "-o" if command == "synthesize" else "--output"
    args = lambda trace: [  # noqa: E731
        command,
        str(trace),
        "--block-size",
        "4",
        flag,
        str(out),
        "--json",
        str(summary),
    ]
    assert main(args(second)) == 0
    new = (_snapshot(out), summary.read_bytes())
    assert main(args(first)) == 0
    previous = (_snapshot(out), summary.read_bytes())
    assert new[0] != previous[0] and new[1] != previous[1]
    counted = _crash(0, "kill", args(second))
    steps = int(counted.stderr.rsplit("steps: ", 1)[1])
    mixed = []
    for point in range(1, steps + 1):
        assert main(args(first)) == 0
        crashed = _crash(point, mode, args(second))
        assert crashed.returncode != 0
        seen = (_snapshot(out), summary.read_bytes())
        if seen not in (previous, new):
            mixed.append((point, seen == (new[0], previous[1])))  # the report last
    window = 1 if mode == "kill" else 0  # the kill before the report's rename
    assert len(mixed) <= window and all(output_first for _, output_first in mixed), (
        f"one output new, the other the previous run's, after steps {mixed}"
    )


def test_render_says_which_rows_it_skipped(tmp_path, tiny_tokenizer, capsys):
    """render reads the trace (read_trace notes malformed lines) but never says so: a trace
    with a broken line renders 'rendered 3 of 3 rows', exit 0, no warning; analyze, synthesize
    and validate all warn ('1 malformed trace line(s) skipped'). Nothing is lost silently."""
    trace = write_jsonl(tmp_path / "t.jsonl", [*TRACE[:3], b"{broken"])
    code = main(
        [
            "render",
            str(trace),
            "--block-size",
            "4",
            "--tokenizer",
            tiny_tokenizer,
            "--no-verify",
            "-o",
            str(tmp_path / "r.jsonl"),
        ]
    )
    err = capsys.readouterr().err
    assert "malformed" in err or code != 0, err


@pytest.mark.parametrize("lost", ["manifest.json", "trace-00002-of-00003.jsonl"])
@pytest.mark.parametrize("command", ["validate", "analyze"])
def test_a_glob_of_a_partial_kvtrace_folder_is_refused(
    tiny_tokenizer, tmp_path, monkeypatch, command, lost
):
    """A kvtrace folder is read only whole (trace_inputs.check_whole): without its manifest,
    or without one of its shards, the folder itself is refused. The same folder read through a
    glob of its shards (out/trace-*.jsonl) skips check_whole: without the manifest the shards
    are read as lone files, and without a shard the rest are read (each one's sha256 matches;
    _check_exported counts rows only when every shard was read): validate says 'valid' and
    analyze reports 5 of the 6 rows, exit 0."""
    from kvtrace.transforms.write import shards

    monkeypatch.setattr(shards, "MAX_BLOCKS_PER_SHARD", 20)  # three shards of a small night
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 86_400_000 * i) for i in range(6)])
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, [src], out, "--block-size", "4") == 0
    assert (out / "trace-00002-of-00003.jsonl").exists()
    (out / lost).unlink()  # a partial copy
    assert main([command, str(out)]) != 0  # refused, as promised
    assert main([command, str(out / "trace-*.jsonl"), "--block-size", "4"]) != 0


SALT = "0123456789abcdef0123456789abcdef"


def test_block_hashes_never_replace_another_commands_output(tiny_tokenizer, tmp_path):
    """--emit-block-hashes NIGHT, where NIGHT is last night's published trace: check_block_
    hashes_folder asks foreign_files, which finds nothing foreign in a folder whose kvtrace
    manifest lists its files, so the run publishes the block hashes in NIGHT's place: the
    published trace (shards, stats, manifest) is deleted, exit 0. Every other output refuses
    another command's folder ('is an output of kvtrace anonymize')."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)])
    salt = tmp_path / "salt"
    salt.write_text(SALT)
    salt.chmod(0o600)
    night = tmp_path / "night"
    assert anonymize(tiny_tokenizer, [src], night, "--block-size", "4") == 0
    published = sorted(p.name for p in night.iterdir())
    code = anonymize(
        tiny_tokenizer,
        [src],
        tmp_path / "out",
        "--block-size",
        "4",
        "--salt-file",
        str(salt),
        "--hash-scheme",
        "dynamo",
        "--emit-block-hashes",
        str(night),
    )
    assert sorted(p.name for p in night.iterdir()) == published, (
        "the published trace was replaced by block hashes"
    )
    assert code == 2


@pytest.mark.parametrize("flag", ["--dead-letter", "--id-map"])
def test_a_private_folder_is_never_put_inside_another_commands_output(
    tiny_tokenizer, tmp_path, flag
):
    """check_written checks a private folder (dead letters, id map) only for links, files and
    ownership, never for whose folder it is: --dead-letter NIGHT (or --id-map NIGHT), NIGHT a
    published trace, puts the raw rejected requests (or the map) into the folder meant for
    publishing, makes it owner-only, and every later run into NIGHT is refused ('holds files
    kvtrace did not write'); audit says NOT publishable."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)] + [b"{x"])
    salt = tmp_path / "salt"
    salt.write_text(SALT)
    salt.chmod(0o600)
    night = tmp_path / "night"
    assert anonymize(tiny_tokenizer, [src], night, "--block-size", "4") == 0
    published = sorted(p.name for p in night.iterdir())
    code = anonymize(
        tiny_tokenizer,
        [src],
        tmp_path / "out",
        "--block-size",
        "4",
        "--salt-file",
        str(salt),
        flag,
        str(night),
    )
    assert sorted(p.name for p in night.iterdir()) == published, (
        f"{flag} wrote into the published trace"
    )
    assert code == 2


def test_a_parquet_shard_is_read_from_the_bytes_that_were_checked(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """trace_io._read_file checks a Parquet shard's sha256 on one open (_sha256_of) and reads
    it on another (read_parquet_within): a publish that swaps the folder in between (here, the
    swap publish_folder makes, done by hand at that moment) has the reader check the old
    night's bytes and return the new night's rows, as if they were the manifest's. The JSONL
    path hashes the very bytes it parses."""
    from kvtrace.transforms.read import trace_io

    old = write_jsonl(tmp_path / "old.jsonl", [chat(i, 1000 * i) for i in range(4)])
    new = write_jsonl(tmp_path / "new.jsonl", [chat(i + 4, 1000 * i, rotate=3) for i in range(4)])
    out, other = tmp_path / "out", tmp_path / "other"
    assert anonymize(tiny_tokenizer, [old], out, "--block-size", "4") == 0
    assert anonymize(tiny_tokenizer, [new], other, "--block-size", "4") == 0
    checked = trace_io._sha256_of

    def hashed_then_published(path: str) -> str:
        digest = checked(path)
        os.rename(out, tmp_path / "gone")  # the next night is published in out's place
        os.rename(other, out)
        return digest

    monkeypatch.setattr(trace_io, "_sha256_of", hashed_then_published)
    shard = next(out.glob("trace-*.parquet"))
    checked_rows = [
        json.loads(line)["input_length"]
        for line in shard.with_suffix(".jsonl").read_text().splitlines()
    ]
    try:
        read = trace_io.read_trace([str(shard)]).input_length.tolist()
    except ValueError:
        return  # refused: the bytes read are not the ones checked
    assert read == checked_rows, "read the next night's rows as the checked shard's"


@pytest.mark.parametrize("flag", ["-o", "--json"])
def test_render_never_replaces_the_tokenizer_it_reads(tmp_path, tiny_tokenizer, flag):
    """render's location plan (plan_trace_command) lists the traces it reads, not its
    --tokenizer: -o (or --json) TOKENIZER/tokenizer.json passes the plan, the tokenizer is
    loaded, and the rendered requests (or the report) replace tokenizer.json, exit 0; the next
    run says 'not a tokenizer'. An output never replaces what the run reads."""
    tokenizer = tmp_path / "tok"
    shutil.copytree(tiny_tokenizer, tokenizer)
    before = (tokenizer / "tokenizer.json").read_bytes()
    trace = write_jsonl(tmp_path / "t.jsonl", TRACE)
    outputs = {"-o": str(tmp_path / "r.jsonl"), "--json": str(tmp_path / "r.json")}
    outputs[flag] = str(tokenizer / "tokenizer.json")
    code = main(
        [
            "render",
            str(trace),
            "--block-size",
            "4",
            "--tokenizer",
            str(tokenizer),
            "--no-verify",
            "-o",
            outputs["-o"],
            "--json",
            outputs["--json"],
        ]
    )
    assert (tokenizer / "tokenizer.json").read_bytes() == before, "the tokenizer was replaced"
    assert code == 2


def test_a_killed_run_never_leaves_the_block_hashes_folder_open(tiny_tokenizer, tmp_path):
    """publish_block_hashes publishes the private folder with publish_folder, which makes the
    staging folder 0755 (PUBLIC_FOLDER) before swapping it in, and chmods it back to 0700 only
    after: a run killed between (the crash-point harness, the steps after the swap) leaves the
    engine block hashes' folder world-readable and traversable (docs: '0600 in 0700 folders';
    BLOCK_HASHES.md: 'made owner-only again after the swap')."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)])
    salt = tmp_path / "salt"
    salt.write_text(SALT)
    salt.chmod(0o600)
    base = tmp_path / "base"
    args = [
        "anonymize",
        "--input",
        str(src),
        "--tokenizer",
        tiny_tokenizer,
        "--block-size",
        "4",
        "--salt-file",
        str(salt),
        "--hash-scheme",
        "dynamo",
    ]
    places = lambda work: [  # noqa: E731
        "--output",
        str(work / "out"),
        "--emit-block-hashes",
        str(work / "hashes"),
    ]
    assert main([*args, *places(base)]) == 0
    counted = _crash(0, "kill", [*args, *places(base)])
    steps = int(counted.stderr.rsplit("steps: ", 1)[1])
    opened = []
    for point in range(1, steps + 1):
        work = tmp_path / f"kill-{point}"
        shutil.copytree(base, work, symlinks=True)
        assert _crash(point, "kill", [*args, *places(work)]).returncode == 137
        if (work / "hashes").stat().st_mode & 0o077:
            opened.append(point)
        shutil.rmtree(work)
    assert not opened, f"block hashes folder left group/world-accessible after steps {opened}"


@pytest.mark.parametrize("command", ["export", "report"])
def test_a_file_that_appears_during_the_run_is_not_replaced_without_overwrite(
    tmp_path, monkeypatch, command
):
    """export and report refuse an existing -o without --overwrite, but only in the plan
    (check_file): StagedFile.publish is os.replace, so a file someone writes at -o while the
    run works (here, at the moment the trace is read) is replaced silently, exit 0. Folders
    are re-checked at publish ('something may have appeared while the run ran'); files are
    not (a link(2) or RENAME_NOREPLACE publish would refuse it)."""
    import kvtrace.pipelines.export
    import kvtrace.pipelines.report

    trace = write_jsonl(tmp_path / "t.jsonl", TRACE)
    out = tmp_path / "out.file"
    module, name = {
        "export": (kvtrace.pipelines.export, "read_trace"),
        "report": (kvtrace.pipelines.report, "read_cache_trace"),
    }[command]
    read, called = getattr(module, name), []

    def someone_writes_the_output(*args, **kwargs):
        called.append(args)
        out.write_bytes(b"someone else's file")
        return read(*args, **kwargs)

    monkeypatch.setattr(module, name, someone_writes_the_output)
    args = {
        "export": ["export", str(trace), "--to", "dynamo", "--block-size", "4"],
        "report": ["report", str(trace), "--block-size", "4", "--capacity", "8,32"],
    }[command]
    code = main([*args, "-o", str(out)])
    assert called
    assert out.read_bytes() == b"someone else's file", "replaced without --overwrite"
    assert code != 0


def test_a_reader_during_a_publish_reads_one_whole_output(tiny_tokenizer, tmp_path, monkeypatch):
    """publish_folder swaps a folder whole so that a reader meets the previous output or the
    new one; but a reader opens the folder by name for each file (the manifest, then each
    shard): a publish between the manifest's read and the shards' (done here at that moment)
    has `analyze OUT` refuse both whole outputs: 'OUT is not a whole kvtrace output: ...
    differs from its manifest (copied partly?)', exit 2. (Reading through one descriptor of
    the folder, openat, would read the one it opened.)"""
    from kvtrace.transforms.read import trace_io

    old = write_jsonl(tmp_path / "old.jsonl", [chat(i, 1000 * i) for i in range(4)])
    new = write_jsonl(tmp_path / "new.jsonl", [chat(i + 4, 1000 * i, rotate=3) for i in range(5)])
    out, staged = tmp_path / "out", tmp_path / "next"
    assert anonymize(tiny_tokenizer, [old], out, "--block-size", "4") == 0
    assert anonymize(tiny_tokenizer, [new], staged, "--block-size", "4") == 0
    promised = trace_io.published_shards

    def then_published(files):
        found = promised(files)
        os.rename(out, tmp_path / "previous")  # the next night's publish, at this moment
        os.rename(staged, out)
        return found

    monkeypatch.setattr(trace_io, "published_shards", then_published)
    report = tmp_path / "report.json"
    assert main(["analyze", str(out), "--json", str(report)]) == 0, "a whole output refused"
    assert json.loads(report.read_text())["total_requests"] in (4, 5)


def test_dot_dot_after_a_link_is_placed_where_the_system_resolves_it(tmp_path):
    """written_place and read_place fold `..` lexically (os.path.abspath) before resolving
    links, but the kernel resolves a/link/.. through the link: input a/link/../t.jsonl (link
    -> ../elsewhere/sub) is placed as a/t.jsonl while it reads elsewhere/t.jsonl, so --json
    elsewhere/t.jsonl passes the plan and replaces the very trace read, exit 0."""
    (tmp_path / "a").mkdir()
    (tmp_path / "elsewhere" / "sub").mkdir(parents=True)
    (tmp_path / "a" / "link").symlink_to("../elsewhere/sub")
    trace = write_jsonl(tmp_path / "elsewhere" / "t.jsonl", TRACE)
    before = trace.read_bytes()
    code = main(
        [
            "analyze",
            str(tmp_path / "a" / "link" / ".." / "t.jsonl"),
            "--block-size",
            "4",
            "--json",
            str(trace),
        ]
    )
    assert trace.read_bytes() == before, "the input trace was replaced by the --json report"
    assert code == 2


def test_the_lock_file_is_not_created_through_a_link(tmp_path):
    """output_lock opens parent/.NAME.kvtrace-lock with O_RDWR|O_CREAT and no O_NOFOLLOW: a
    (dangling) symbolic link planted by that name in a shared parent is followed, so the run
    creates the file it names, anywhere the user may write (every output location refuses a
    link: 'never through a link')."""
    trace = write_jsonl(tmp_path / "t.jsonl", TRACE)
    victim = tmp_path / "elsewhere" / "created-by-kvtrace"
    victim.parent.mkdir()
    (tmp_path / ".r.json.kvtrace-lock").symlink_to(victim)
    main(["analyze", str(trace), "--block-size", "4", "--json", str(tmp_path / "r.json")])
    assert not victim.exists(), "the lock was created through the planted link"


def test_a_full_disk_mid_run_is_a_stopped_job_on_the_local_engine(tiny_tokenizer, tmp_path):
    """cli: 'exit 2 for a run refused before it started, 1 for a job that stopped'. A disk
    that fills while the local engine writes its shards (crash-point harness, enospc at a
    step after the work began) exits 2, as if nothing had started (cli._run maps every
    OSError to 2); the Beam engine, the same disk full at the same write, exits 1 ('the job
    failed: ... No space left on device')."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)])
    args = [
        "anonymize",
        "--input",
        str(src),
        "--tokenizer",
        tiny_tokenizer,
        "--block-size",
        "4",
        "--output",
        str(tmp_path / "out"),
        "--engine",
        "local",
    ]
    crashed = _crash(4, "enospc", args)  # a file the job writes (2: the run's marker, before)
    assert "No space left on device" in crashed.stderr, crashed.stderr
    assert crashed.returncode == 1, crashed.stderr


@pytest.mark.parametrize("damage", ["parquet-cut", "stats-missing"])
def test_a_folder_missing_part_of_its_manifest_is_not_whole(tiny_tokenizer, tmp_path, damage):
    """check_whole compares the manifest with the JSONL shards only (PublishedFolder.shards):
    a copy whose Parquet twin is cut short, or that lacks stats.json, both listed with their
    sha256 in the manifest, is 'valid' to validate and exported (exit 0), though it is not the
    output as published (audit: NOT publishable); replayers reading the Parquet twin meet the
    cut file."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)])
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, [src], out, "--block-size", "4") == 0
    if damage == "parquet-cut":
        twin = next(out.glob("trace-*.parquet"))
        twin.write_bytes(twin.read_bytes()[:100])
    else:
        (out / "stats.json").unlink()
    assert main(["validate", str(out)]) != 0


@pytest.mark.parametrize("spelling", ["trace-*.jsonl", "trace-00000-of-00001.jsonl"])
@pytest.mark.parametrize("command", ["validate", "analyze"])
def test_json_inside_a_kvtrace_folder_read_through_its_shards_is_refused(
    tiny_tokenizer, tmp_path, command, spelling
):
    """--json inside the kvtrace folder read is refused when the folder is named (round 1's
    fix), not when the same folder is read through a glob of its shards or a shard's path:
    out/report.json matches no wildcard of out/trace-*.jsonl and is not the shard, so the
    report lands in the published output, which every later run into it then refuses ('holds
    files kvtrace did not write (report.json)') and audit calls NOT publishable."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)])
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, [src], out, "--block-size", "4") == 0
    code = main([command, str(out / spelling), "--json", str(out / "report.json")])
    assert not (out / "report.json").exists(), "the report was written into the trace folder"
    assert code == 2


@pytest.mark.parametrize("command", ["analyze", "anonymize"])
def test_an_output_that_is_a_mount_point_is_refused_before_the_work(
    tiny_tokenizer, tmp_path, command
):
    """An output folder that is a mount point (a volume mounted at /out, as containers do)
    cannot be swapped (renameat2 and rename: EBUSY), but the plan does not look: the work is
    done, the report printed, and then the run fails with a raw errno ('[Errno 16] Device or
    resource busy'), leaving anonymize's dead-letter folder made beside it. A location that
    cannot be published is refused before any work. (A private mount namespace: unshare.)"""
    if (
        shutil.which("unshare") is None
        or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0
    ):
        pytest.skip("no user namespaces here to mount a folder")
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)])
    trace = write_jsonl(tmp_path / "t.jsonl", TRACE)
    out = tmp_path / "out"
    out.mkdir()
    args = {
        "analyze": ["analyze", str(trace), "--block-size", "4", "--output", str(out)],
        "anonymize": [
            "anonymize",
            "--input",
            str(src),
            "--output",
            str(out),
            "--tokenizer",
            tiny_tokenizer,
            "--block-size",
            "4",
        ],
    }[command]
    script = f"mount -t tmpfs tmpfs {out} && exec {sys.executable} -m kvtrace.cli " + " ".join(
        f"'{a}'" for a in args
    )
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=TESTS.parent,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])},
    )
    assert done.returncode == 2, done.stderr
    assert "Errno" not in done.stderr, done.stderr
    assert "Rows:" not in done.stdout and "exported" not in done.stdout, "the work was done"


@pytest.mark.beam  # each command runs on Beam in this process too
@pytest.mark.parametrize("command", ["analyze", "synthesize"])
def test_reports_are_byte_identical_on_either_engine(tiny_tokenizer, tmp_path, command):
    """The same trace, spread over three shards, analyzed (analyze --output, analysis.json and
    .txt) or synthesized (--json summary) by the local engine and by Beam: the hit-rate means
    differ in their last digits (0.5666666666666665 vs 0.5666666666666667: sums in another
    order), so the published reports differ by engine. ('the same numbers from traces spread
    over many files'; same input and config, byte-identical output whatever the engine.)"""
    from kvtrace.transforms.write import shards

    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 86_400_000 * i) for i in range(6)])
    out = tmp_path / "night"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shards, "MAX_BLOCKS_PER_SHARD", 20)  # three shards of a small night
        assert anonymize(tiny_tokenizer, [src], out, "--block-size", "4") == 0
    assert len(list(out.glob("trace-*.jsonl"))) == 3
    written = {}
    for engine in ("local", "beam"):
        if command == "analyze":
            target = tmp_path / f"an-{engine}"
            assert main(["analyze", str(out), "--output", str(target), "--engine", engine]) == 0
            written[engine] = _snapshot(target)
        else:
            target = tmp_path / f"s-{engine}.json"
            assert (
                main(
                    [
                        "synthesize",
                        str(out),
                        "--seed",
                        "3",
                        "-o",
                        str(tmp_path / f"s-{engine}"),
                        "--json",
                        str(target),
                        "--engine",
                        engine,
                    ]
                )
                == 0
            )
            written[engine] = target.read_bytes()
    assert written["local"] == written["beam"]


def test_a_named_parquet_trace_is_not_dropped_as_a_twin(tmp_path, capsys):
    """trace_inputs.trace_files drops every Parquet file whose name with .jsonl is also read,
    as a kvtrace shard's twin, wherever it is and however it was named: `analyze x.jsonl
    x.parquet`, two different traces outside any kvtrace folder, reads x.jsonl only (3 rows
    of 9), without a word, exit 0."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_jsonl(tmp_path / "x.jsonl", TRACE[:3])
    pq.write_table(pa.Table.from_pylist(TRACE), tmp_path / "x.parquet")
    report = tmp_path / "r.json"
    assert (
        main(
            [
                "analyze",
                str(tmp_path / "x.jsonl"),
                str(tmp_path / "x.parquet"),
                "--block-size",
                "4",
                "--json",
                str(report),
            ]
        )
        == 0
    )
    assert json.loads(report.read_text())["total_requests"] == 9, "x.parquet was not read"


def test_analyze_output_publishes_for_a_trace_whose_name_is_not_utf8(tmp_path, capsys):
    """A trace file whose name is not UTF-8 (Linux names are bytes: b't\\xff.jsonl') reads,
    validates, exports and analyzes (--json) fine, but analyze --output does all the work,
    prints the report, then fails writing analysis.txt ('utf-8' codec can't encode character
    '\\udcff': the name, surrogate-escaped, in the text), exit 2, nothing published."""
    name = os.fsdecode(b"t\xff.jsonl")
    trace = write_jsonl(tmp_path / name, TRACE)
    out = tmp_path / "an"
    code = main(["analyze", str(trace), "--block-size", "4", "--output", str(out)])
    assert code == 0, capsys.readouterr().err
    assert (out / "analysis.txt").exists()


def test_the_current_folder_as_output_is_published_or_refused_before_the_work(tmp_path):
    """analyze --output . (an empty current folder): staging_folder splits the relative '.'
    into no parent, so the run stages in ./..kvtrace-staging-RUNID, inside its own output; the
    work is done and printed, then the publish re-check refuses the output for holding that
    very folder ('holds files kvtrace did not write (...kvtrace-staging-...)'), exit 2. The
    lock (abspath) places it beside; the staging does not."""
    trace = write_jsonl(tmp_path / "t.jsonl", TRACE)
    work = tmp_path / "work"
    work.mkdir()
    done = _run(["analyze", str(trace), "--block-size", "4", "--output", "."], work)
    if done.returncode == 0:
        assert sorted(p.name for p in work.iterdir()) == ["analysis.json", "analysis.txt"]
        return
    assert done.returncode == 2 and "Rows:" not in done.stdout, "refused after the work"
    assert "kvtrace-staging" not in done.stderr, done.stderr
