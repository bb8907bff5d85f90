"""Red team, the write protocol (transforms/write/publish.py): reproducers of what breaks its
promises today. Each asserts the promised behaviour, so each fails until it is fixed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import anonymize, chat, write_jsonl
from kvtrace.cli import main

# Red-team reproducers of the write protocol (issue 33), each asserting the promised behaviour;
# OPEN marks the holes not yet closed (not strict: a fix passes, and its mark goes).
pytestmark = pytest.mark.slow
OPEN = pytest.mark.xfail(reason="open write-protocol hole (issue 33)")

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


@pytest.fixture
def trace(tmp_path) -> Path:
    return write_jsonl(tmp_path / "trace.jsonl", TRACE)


def test_reuse_plot_never_overwrites_its_own_input_trace(trace, capsys):
    """reuse --output is written with storage.create in place (no staging, no check, no
    --overwrite): pointed at its input, the trace is replaced by a PNG and the run says 0."""
    before = trace.read_bytes()
    code = main(["reuse", str(trace), "--block-size", "4", "--output", str(trace)])
    assert trace.read_bytes() == before, "the input trace was overwritten by the plot"
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_reuse_plot_does_not_write_through_a_symlink(trace, tmp_path):
    """A symlink in the plot's place is followed: the file it names is overwritten (every
    other file output refuses a link: 'kvtrace replaces only files')."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"someone's")
    (tmp_path / "plot.png").symlink_to(victim)
    code = main(["reuse", str(trace), "--block-size", "4", "--output", str(tmp_path / "plot.png")])
    assert victim.read_bytes() == b"someone's"
    assert code == 2


def test_reuse_plot_location_is_checked_before_the_work(trace, tmp_path, capsys):
    """A plot under a file is found only when the plot is written, after the work, and said
    as a raw errno ('[Errno 17] File exists'), not the protocol's 'is not a folder'."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["reuse", str(trace), "--block-size", "4", "--output", str(blocker / "x.png")]) == 2
    err = capsys.readouterr().err
    assert f"{blocker} is not a folder" in err, err


@pytest.mark.parametrize(
    "command",
    [["analyze"], ["validate"], ["simulate", "--capacity", "8"], ["synthesize", "-o", "{tmp}/s"]],
)
def test_json_report_never_replaces_the_commands_own_input(trace, tmp_path, command):
    """--json is file_output(overwrite=True): given the trace it reads, it silently replaces
    the input with the report (nothing lost: an input is never an output)."""
    before = trace.read_bytes()
    args = [
        command[0],
        str(trace),
        "--block-size",
        "4",
        *[a.format(tmp=tmp_path) for a in command[1:]],
        "--json",
        str(trace),
    ]
    code = main(args)
    assert trace.read_bytes() == before, "the input trace was replaced by the --json report"
    assert code == 2


def test_audit_json_never_replaces_a_file_of_the_audited_output(tiny_tokenizer, tmp_path):
    """audit refuses --json inside the audited folder, but not over a file it reads: the
    input trace of a plain-file audit."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)])
    assert anonymize(tiny_tokenizer, [src], tmp_path / "out", "--block-size", "4") == 0
    shard = next((tmp_path / "out").glob("trace-*.jsonl"))
    lone = tmp_path / "lone.jsonl"
    lone.write_bytes(shard.read_bytes())
    before = lone.read_bytes()
    main(["audit", str(lone), "--json", str(lone)])
    assert lone.read_bytes() == before


def test_synthesize_json_location_checked_before_its_output_is_published(trace, tmp_path, capsys):
    """synthesize publishes -o, then finds --json unwritable: exit 2 with the output published
    (a run publishes whole or not at all; locations are checked before any work)."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = tmp_path / "s"
    code = main(
        [
            "synthesize",
            str(trace),
            "--block-size",
            "4",
            "-o",
            str(out),
            "--json",
            str(blocker / "x.json"),
        ]
    )
    assert code == 2
    assert not out.exists(), "the failed run published its output"


def test_an_output_that_is_a_symlink_is_refused_not_half_published(
    tiny_tokenizer, tmp_path, capsys
):
    """--output a symlink to an earlier output: the run swaps the link itself with its
    staging folder, then fails in rmtree ('Cannot call rmtree on a symbolic link'), exit 2
    after publishing (letters too), leaving the user's link as a hidden staging leftover."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)])
    assert anonymize(tiny_tokenizer, [src], tmp_path / "out", "--block-size", "4") == 0
    link = tmp_path / "link"
    link.symlink_to("out")
    capsys.readouterr()
    code = anonymize(tiny_tokenizer, [src], link, "--block-size", "4")
    err = capsys.readouterr().err
    assert "rmtree" not in err, err
    leftovers = [p.name for p in tmp_path.iterdir() if ".kvtrace-staging-" in p.name]
    assert leftovers == [], leftovers
    if code != 0:  # refused: then nothing published, the link as it was
        assert link.is_symlink()
        assert not (tmp_path / "link-rejected").exists()


@pytest.mark.parametrize(
    "command", [["validate"], ["analyze"], ["export", "--to", "aiperf", "-o", "{tmp}/e.jsonl"]]
)
def test_readers_refuse_a_published_folder_with_a_truncated_shard(
    tiny_tokenizer, tmp_path, command
):
    """The manifest lists each file's sha256 and the row count; audit flags a shard cut at a
    line boundary, but validate says 'valid' and analyze reports the half trace, exit 0."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(6)])
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, [src], out, "--block-size", "4") == 0
    shard = next(out.glob("trace-*.jsonl"))
    lines = shard.read_bytes().splitlines(keepends=True)
    assert json.loads((out / "manifest.json").read_text())["records"]["exported"] == len(lines)
    shard.write_bytes(b"".join(lines[: len(lines) // 2]))  # a partial copy, whole lines
    assert main([command[0], str(out), *[a.format(tmp=tmp_path) for a in command[1:]]]) != 0


def test_analyze_json_inside_its_output_folder_does_not_poison_it(trace, tmp_path):
    """analyze --output an --json an/x.json: the report is written into the published folder
    before the folder is re-checked, so the run fails (exit 2) having written x.json there,
    and every later run into an is refused ('holds files kvtrace did not write (x.json)')."""
    out = tmp_path / "an"
    assert main(["analyze", str(trace), "--block-size", "4", "--output", str(out)]) == 0
    main(
        [
            "analyze",
            str(trace),
            "--block-size",
            "4",
            "--output",
            str(out),
            "--json",
            str(out / "x.json"),
        ]
    )
    assert not (out / "x.json").exists(), "a refused run left its report in the output folder"
    assert main(["analyze", str(trace), "--block-size", "4", "--output", str(out)]) == 0


def test_synthesize_json_equal_to_its_output_is_refused(trace, tmp_path, capsys):
    """synthesize -o s --json s: the trace is published, then replaced by the summary JSON;
    the run says 'output: s (valid)' and exits 0."""
    out = tmp_path / "s"
    code = main(["synthesize", str(trace), "--block-size", "4", "-o", str(out), "--json", str(out)])
    if code == 0:
        capsys.readouterr()
        assert main(["validate", str(out), "--block-size", "4"]) == 0, "published is not a trace"
    else:
        assert code == 2 and not out.exists()


@pytest.mark.parametrize("command", ["render", "convert", "synthesize"])
def test_a_file_output_never_replaces_the_commands_own_input(
    trace, tmp_path, tiny_tokenizer, command
):
    """render, convert and synthesize -o INPUT replace the input they read, silently and
    without --overwrite (export and report refuse: 'exists; --overwrite replaces it')."""
    if command == "convert":
        trace = write_jsonl(
            tmp_path / "bailian.jsonl",
            [
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
            ],
        )
    extra = {
        "render": ["--block-size", "4", "--tokenizer", tiny_tokenizer, "--no-verify"],
        "convert": [],
        "synthesize": ["--block-size", "4", "--seed", "1", "--min-isl", "43"],
    }
    before = trace.read_bytes()
    code = main([command, str(trace), *extra[command], "-o", str(trace)])
    assert trace.read_bytes() == before, f"{command} replaced its own input"
    assert code == 2


@pytest.mark.parametrize(
    "command",
    [["synthesize", "--block-size", "4"], ["export", "--to", "aiperf", "--block-size", "4"]],
)
def test_a_file_output_named_as_a_folder_is_refused_before_the_work(
    trace, tmp_path, capsys, command
):
    """-o out.jsonl/ (a trailing slash): all the work is done, then the rename fails with a
    raw errno ('[Errno 20] Not a directory: .../.out.jsonl.kvtrace-staging-... -> ...')."""
    code = main([command[0], str(trace), *command[1:], "-o", str(tmp_path / "out.jsonl") + "/"])
    err = capsys.readouterr().err
    assert code in (0, 2)
    assert "Errno" not in err and "kvtrace-staging" not in err, err


KILLED_BEFORE_PUBLISHING = """
import os, sys
from kvtrace.transforms.write import publish
def killed(*args, **kwargs):
    os._exit(137)  # as SIGKILL at the publish step: the staging folders stay
publish.publish_folder = killed
from kvtrace.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_killed_runs_letters_are_not_published_for_an_output_it_never_published(
    tiny_tokenizer, tmp_path
):
    """DeadLetterRun marks 'published' by the inode of the output's staging folder. A run
    killed before publishing leaves letters whose mark is that inode; the next run's
    restore_interrupted removes the staging folder and (ext4) the next staging folder, which
    becomes the output, gets the same inode; the next run with the first dead-letter folder then
    publishes the killed run's letters for an output it never produced (counts no longer add
    up: two rejected files, one published night that rejected one record)."""
    tests = Path(__file__).resolve().parents[1]
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)] + [b"{x"])
    for attempt in range(6):  # the inode comes back to the next folder made, mostly (ext4)
        base = tmp_path / f"attempt{attempt}"
        base.mkdir()
        out, dead = base / "out", base / "dead"
        args = [
            "anonymize",
            "--input",
            str(src),
            "--output",
            str(out),
            "--tokenizer",
            tiny_tokenizer,
            "--block-size",
            "4",
        ]
        killed = subprocess.run(
            [sys.executable, "-c", KILLED_BEFORE_PUBLISHING, *args, "--dead-letter", str(dead)],
            capture_output=True,
            timeout=300,
            cwd=tests.parent,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)])},
        )
        assert killed.returncode == 137, killed.stderr
        assert not out.exists()
        (staged,) = [
            p for p in base.glob(".out.kvtrace-staging-*") if p.is_dir()
        ]  # its pointer aside
        inode = staged.stat().st_ino
        assert main([*args, "--dead-letter", str(base / "elsewhere")]) == 0
        if out.stat().st_ino != inode:
            continue
        assert main([*args, "--dead-letter", str(dead)]) == 0
        letters = sorted(p.name for p in dead.iterdir())
        assert len(letters) == 1, f"the killed run's letters were published too: {letters}"
        return
    pytest.skip("this filesystem gave the killed staging folder's inode to no new folder")


def test_block_hashes_are_published_with_their_output_not_before(tiny_tokenizer, tmp_path):
    """--emit-block-hashes writes straight into its folder as each shard is written (no
    staging, no publish): a run killed before publishing its output has already replaced the
    published night's block hashes, which then join the engine's events to the wrong trace."""
    tests = Path(__file__).resolve().parents[1]
    salt = tmp_path / "salt"
    salt.write_text("0123456789abcdef0123456789abcdef")
    salt.chmod(0o600)
    night1 = write_jsonl(tmp_path / "night1.jsonl", [chat(i, 1000 * i) for i in range(3)])
    night2 = write_jsonl(tmp_path / "night2.jsonl", [chat(i, 1000 * i, rotate=2) for i in range(6)])
    hashes, out = tmp_path / "hashes", tmp_path / "out"
    args = [
        "anonymize",
        "--output",
        str(out),
        "--tokenizer",
        tiny_tokenizer,
        "--block-size",
        "4",
        "--salt-file",
        str(salt),
        "--hash-scheme",
        "dynamo",
        "--emit-block-hashes",
        str(hashes),
    ]
    assert main([*args, "--input", str(night1)]) == 0
    published = {p.name: p.read_bytes() for p in hashes.iterdir()}
    trace_before = {p.name: p.read_bytes() for p in out.iterdir()}
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_BEFORE_PUBLISHING, *args, "--input", str(night2)],
        capture_output=True,
        timeout=300,
        cwd=tests.parent,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)])},
    )
    assert killed.returncode == 137, killed.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == trace_before  # output held
    assert {p.name: p.read_bytes() for p in hashes.iterdir()} == published, (
        "the killed run's block hashes replaced those of the published output"
    )


def test_a_long_but_valid_output_name_is_written_or_refused_before_the_work(
    trace, tmp_path, capsys
):
    """A 234-byte file name is valid (NAME_MAX 255), but its staging name
    (.NAME.kvtrace-staging-RUNID, 29 bytes more) is not: the work is done, then the run fails
    with '[Errno 36] File name too long: .../.NAME.kvtrace-staging-...'."""
    out = tmp_path / ("a" * 234)  # a derived trace's folder, staged under a longer name
    code = main(["synthesize", str(trace), "--block-size", "4", "-o", str(out)])
    err = capsys.readouterr().err
    assert "Errno" not in err and "kvtrace-staging" not in err, err
    assert code == 0 and out.exists()


@pytest.mark.parametrize(
    "command",
    [
        ["synthesize", "--block-size", "4"],
        ["export", "--to", "aiperf", "--block-size", "4", "--overwrite"],
    ],
)
def test_an_output_in_the_folder_its_input_glob_reads_is_refused(trace, tmp_path, command):
    """anonymize refuses an output in the folder an input pattern reads ('the next run would
    read its own output'); synthesize and export do not: the same command run twice reads its
    first output as input, so its output doubles (6 rows, then 12; export 18 then 36)."""
    pattern, out = str(tmp_path / "*.jsonl"), tmp_path / "out.jsonl"
    args = [command[0], pattern, *command[1:], "-o", str(out)]
    first = main(args)
    if first == 2:  # refused: as anonymize is
        assert not out.exists()
        return
    assert first == 0
    once = out.read_bytes()
    assert main(args) == 0
    assert out.read_bytes() == once, "the rerun read its own earlier output"


@pytest.mark.parametrize("command", ["analyze", "validate"])
def test_json_inside_the_kvtrace_folder_read_is_refused_as_audits_is(
    tiny_tokenizer, tmp_path, command
):
    """audit refuses --json inside the audited folder; analyze and validate write it there,
    and the folder is then 'NOT publishable' to audit and refused by the next night's run
    ('holds files kvtrace did not write (report.json)')."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)])
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, [src], out, "--block-size", "4") == 0
    code = main([command, str(out), "--json", str(out / "report.json")])
    assert not (out / "report.json").exists()
    assert code == 2
    assert anonymize(tiny_tokenizer, [src], out, "--block-size", "4") == 0


def test_analyze_output_never_replaces_the_trace_folder_it_reads(tiny_tokenizer, tmp_path):
    """analyze out --output out: the anonymized trace folder (a kvtrace output, so not
    'foreign') is swapped for analysis.json and analysis.txt, exit 0: the trace is gone."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)])
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, [src], out, "--block-size", "4") == 0
    before = sorted(p.name for p in out.iterdir())
    code = main(["analyze", str(out), "--output", str(out)])
    assert sorted(p.name for p in out.iterdir()) == before, "the input trace folder was replaced"
    assert code == 2


def test_another_commands_output_folder_is_not_replaced_silently(tiny_tokenizer, tmp_path, trace):
    """analyze --output OUT where OUT is last night's anonymized trace: its manifest lists its
    files, so nothing is 'foreign', and the published trace is replaced by an analysis
    (export and report need --overwrite to replace even a file)."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)])
    out = tmp_path / "night"
    assert anonymize(tiny_tokenizer, [src], out, "--block-size", "4") == 0
    code = main(["analyze", str(trace), "--block-size", "4", "--output", str(out)])
    assert (out / "manifest.json").exists(), "the anonymized trace was replaced by an analysis"
    assert code == 2


@pytest.mark.parametrize("flag", ["--dead-letter", "--id-map", "--emit-block-hashes"])
def test_an_existing_private_folder_is_never_world_writable(tiny_tokenizer, tmp_path, flag):
    """make_folder(private=True) made owner-only only the folders it creates: a dead-letter,
    id-map or block-hashes folder that exists (mkdir'd by hand, 0777) stayed world-writable,
    so any local user could rename, delete or plant files among the private ones. Since red
    team round 5 kvtrace changes no folder it did not make: such a folder is refused before
    the work (exit 2) and left as it was."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)] + [b"{x"])
    salt = tmp_path / "salt"
    salt.write_text("0123456789abcdef0123456789abcdef")
    salt.chmod(0o600)
    folder = tmp_path / "private"
    folder.mkdir()
    folder.chmod(0o777)
    extra = ["--salt-file", str(salt), "--hash-scheme", "dynamo"] if flag != "--dead-letter" else []
    assert (
        anonymize(
            tiny_tokenizer, [src], tmp_path / "out", "--block-size", "4", flag, str(folder), *extra
        )
        == 2
    )
    assert not any(folder.iterdir()) and folder.stat().st_mode & 0o777 == 0o777


@pytest.mark.parametrize("spelling", ["{out}/.", "{out}/sub/.."])
def test_an_output_spelled_with_dots_is_the_same_output(trace, tmp_path, spelling):
    """--output out/. stages inside out (.out/..kvtrace-staging-...) and is refused after the
    work; --output out/sub/.. makes out/sub and leaves it there, so every later run into out is
    refused ('holds files kvtrace did not write (sub)'). The lock already normalizes the path
    (abspath); staging and checks do not."""
    out = tmp_path / "an"
    assert main(["analyze", str(trace), "--block-size", "4", "--output", str(out)]) == 0
    code = main(["analyze", str(trace), "--block-size", "4", "--output", spelling.format(out=out)])
    assert sorted(p.name for p in out.iterdir()) == ["analysis.json", "analysis.txt"]
    assert code == 0
    assert main(["analyze", str(trace), "--block-size", "4", "--output", str(out)]) == 0


def test_a_killed_reuse_leaves_the_earlier_plot_whole(trace, tmp_path):
    """The crash-point harness (tests/crashpoints.py) killing reuse at its first step: the plot
    is written in place (storage.create, O_TRUNC), so the earlier plot is left half written
    (a 101 955-byte PNG becomes 50 977 bytes), neither the old one nor the new."""
    tests = Path(__file__).resolve().parents[1]
    plot = tmp_path / "plot.png"
    args = ["reuse", str(trace), "--block-size", "4", "--output", str(plot)]
    assert main(args) == 0
    earlier = plot.read_bytes()
    killed = subprocess.run(
        [sys.executable, str(tests / "crashpoints.py"), "1", "kill", *args],
        capture_output=True,
        timeout=300,
        cwd=tests.parent,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)])},
    )
    assert killed.returncode == 137, killed.stderr
    assert plot.read_bytes() == earlier, "the killed run left the plot half written"


def test_block_hashes_are_not_written_through_a_symlink(tiny_tokenizer, tmp_path):
    """The block-hashes folder is written in place with storage.create (open O_TRUNC, then
    chmod 0600): a link there by a shard's name is followed, so the file it names, anywhere,
    is overwritten with the private hashes (and made 0600); no check refuses the folder."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)])
    salt = tmp_path / "salt"
    salt.write_text("0123456789abcdef0123456789abcdef")
    salt.chmod(0o600)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"someone's")
    hashes = tmp_path / "hashes"
    hashes.mkdir()
    (hashes / "block-hashes-00000-of-00001.parquet").symlink_to(victim)
    anonymize(
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
        str(hashes),
    )
    assert victim.read_bytes() == b"someone's", "the block hashes went through the link"


def test_json_equal_to_the_output_folder_is_refused_not_blamed_on_another_run(
    trace, tmp_path, capsys
):
    """analyze --output X --json X: after the work the run meets its own lock and says 'the
    job failed: JobStopped: kvtrace stopped the job: another kvtrace run is writing X' (exit
    1): no other run exists; the two locations overlap, which is known before any work."""
    out = tmp_path / "X"
    code = main(
        ["analyze", str(trace), "--block-size", "4", "--output", str(out), "--json", str(out)]
    )
    err = capsys.readouterr().err
    assert "another kvtrace run" not in err, err
    assert code == 2 and err.count("\n") == 1


@pytest.mark.parametrize("command", ["validate", "analyze"])
def test_readers_refuse_a_kvtrace_folder_without_its_manifest(tiny_tokenizer, tmp_path, command):
    """On object stores the manifest, copied last, is what marks a folder complete
    (publish.py); a folder whose copy stopped before it is an unfinished publish. validate
    says 'valid' (exit 0) and analyze reports it (exit 0); only audit flags it."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)])
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, [src], out, "--block-size", "4") == 0
    (out / "manifest.json").unlink()  # the copy stopped before its last file
    assert main([command, str(out)]) != 0
