"""Red team round 5, the write protocol and the readers: reproducers of holes left after the
fourth round's fixes. Each asserts the promised behaviour, so each fails until it is fixed."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, chat, kvtrace_child, write_jsonl

pytestmark = pytest.mark.slow
ROUND5 = "red team round 5"


# A kill in the two-rename swap's gap (filesystems without RENAME_EXCHANGE: NFS, many FUSE
# mounts), after the output went to .previous and before the staged folder took its place.
_KILL_IN_THE_RENAME_GAP = """
import os
from kvtrace.transforms.write import publish
publish._exchange = lambda first, second: False
_rename = os.rename
def _rename_then_die(src, dst, *args, **kwargs):
    _rename(src, dst, *args, **kwargs)
    if str(dst).endswith(".previous"):
        os._exit(137)
os.rename = _rename_then_die
"""


def test_a_long_output_name_and_its_digest_stem_are_two_outputs(tiny_tokenizer, tmp_path):
    """publish._stem names a long output's lock and staging names by "~" + 32 hex digits of
    its name's sha256, and any short name that is exactly that string stems to itself: two
    outputs of one folder share one lock and one staging prefix. restore_interrupted(B) then
    takes A's `.previous` (the output a killed two-rename swap of A set aside) for B's own,
    renames it to B, and B's run swaps it out and deletes it: a run of another output
    destroys A's published output, which A's next run would have restored."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)])
    long_name = "a" * 230  # over NAME_MAX with the staging room: stemmed by its digest
    digest_name = "~" + hashlib.sha256(long_name.encode()).hexdigest()[:32]
    common = ["--input", str(src), "--tokenizer", tiny_tokenizer, "--block-size", "4"]
    first = tmp_path / long_name
    assert kvtrace_child("anonymize", *common, "--output", str(first)).returncode == 0
    published = (first / "manifest.json").read_bytes()
    killed = kvtrace_child(
        "anonymize", *common, "--output", str(first), prelude=_KILL_IN_THE_RENAME_GAP
    )
    assert killed.returncode == 137 and not first.exists()  # set aside; A's next run restores it
    other = kvtrace_child("anonymize", *common, "--output", str(tmp_path / digest_name))
    assert other.returncode == 0
    # A's earlier output is still A's to restore: its next run puts it back first.
    restored = kvtrace_child(
        "anonymize",
        *common,
        "--output",
        str(first),
        prelude="""
from kvtrace.transforms.write import publish
_restore = publish.restore_interrupted
def _stop_after_restore(output):
    gone = _restore(output)
    raise SystemExit(3)
publish.restore_interrupted = _stop_after_restore
""",
    )
    assert restored.returncode == 3
    assert (first / "manifest.json").read_bytes() == published, (
        "another output's run took A's set-aside output for its own and deleted it"
    )


def _bytes_run(*args: bytes | str) -> subprocess.CompletedProcess:
    """kvtrace in a process of its own, its arguments as bytes (names that are not UTF-8)."""
    return subprocess.run(
        [sys.executable, "-m", "kvtrace.cli", *args],
        cwd=ROOT,
        capture_output=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
    )


def test_a_rejected_record_of_an_input_whose_name_is_not_utf8_is_a_dead_letter(
    tiny_tokenizer, tmp_path
):
    """Inputs whose names are not UTF-8 are read (round 2), and a run without rejects
    publishes; but a letter's `source` is the input's name, and DeadLetter.to_line encodes
    json.dumps(..., ensure_ascii=False) as UTF-8, which raises on the surrogate the byte
    decodes to: one malformed line in b'night\\xff.jsonl' stops the whole run ("error:
    'utf-8' codec can't encode character '\\udcff' ...", exit 2), nothing exported and no
    letter: bad input is a dead letter, not a failed night."""
    good = write_jsonl(tmp_path / "src.jsonl", [chat(i, 1000 * i) for i in range(4)])
    odd = os.fsencode(str(tmp_path)) + b"/night\xff.jsonl"
    with open(odd, "wb") as f:
        f.write(good.read_bytes() + b"not json\n")
    out = tmp_path / "out"
    done = _bytes_run(
        "anonymize",
        "--input",
        odd,
        "--output",
        str(out),
        "--tokenizer",
        tiny_tokenizer,
        "--block-size",
        "4",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (letters,) = (tmp_path / "out-rejected").glob("rejected-*.jsonl")
    assert letters.read_bytes().count(b"\n") == 1


def test_block_hashes_of_an_output_whose_name_is_not_utf8_are_written(tiny_tokenizer, tmp_path):
    """Round 4 keyed the output's letters and the map's mark by os.fsencode of their names,
    but shards.block_hashes_staging still names the block hashes' staging folder by
    sha256(output_staging.encode()): `anonymize --output b'night\\xff' --emit-block-hashes H`
    does the whole night's work, then stops with "error: 'utf-8' codec can't encode character
    '\\udcff' ...: surrogates not allowed" (exit 2) and publishes nothing. A valid name is
    written, or refused before the work in words that say why."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)])
    odd = os.fsencode(str(tmp_path)) + b"/night\xff"
    done = _bytes_run(
        "anonymize",
        "--input",
        str(src),
        "--output",
        odd,
        "--tokenizer",
        tiny_tokenizer,
        "--block-size",
        "4",
        "--hash-scheme",
        "dynamo",
        "--emit-block-hashes",
        str(tmp_path / "hashes"),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (Path(os.fsdecode(odd)) / "manifest.json").is_file()
    assert (tmp_path / "hashes").is_dir()


# A kill once the output is swapped in, before its letters are settled (the window the run's
# mark on the output exists for).
_KILL_AFTER_THE_SWAP = """
import os
from kvtrace.transforms.write import publish
_publish = publish.publish_folder
def _publish_then_die(*args, **kwargs):
    _publish(*args, **kwargs)
    os._exit(137)
publish.publish_folder = _publish_then_die
"""


@pytest.mark.parametrize("rerun", ["old name", "new name"])
def test_a_published_runs_letters_survive_a_rename_of_its_output(tiny_tokenizer, tmp_path, rerun):
    """The run's mark on its output (user.kvtrace.run: run id, letters folder) is an extended
    attribute, which a rename keeps, but the letters it points at are staged under
    `.KEY.kvtrace-staging-RUN`, KEY = output_key(output): the output's parent's identity and
    its *name*. A night killed after its swap (published, letters staged) and then moved
    (`mv X archive`, an ordinary step) has its letters found by no run: the next run of X
    sees no mark on X and removes its key's staged letters as a failed run's
    (recover_letters, publish=False); a run of the moved folder reads its mark, looks under
    its own key, finds nothing and takes the mark off. Either way a published output's
    rejected record has no letter: nothing lost, broken. Fixed: the mark carries the key, and
    letters whose run marked its output are settled by that mark only (a run of the old name
    keeps them; the moved folder's run publishes them)."""
    good = [chat(i, 1000 * i) for i in range(4)]
    night = write_jsonl(tmp_path / "night.jsonl", [*good[:3], "not json"])
    clean = write_jsonl(tmp_path / "clean.jsonl", good)
    common = [
        "--tokenizer",
        tiny_tokenizer,
        "--block-size",
        "4",
        "--dead-letter",
        str(tmp_path / "letters"),
    ]
    out, moved = tmp_path / "X", tmp_path / "archive"
    killed = kvtrace_child(
        "anonymize",
        "--input",
        str(night),
        "--output",
        str(out),
        *common,
        prelude=_KILL_AFTER_THE_SWAP,
    )
    assert killed.returncode == 137 and (out / "manifest.json").is_file()  # published
    out.rename(moved)
    again = out if rerun == "old name" else moved
    assert (
        kvtrace_child(
            "anonymize", "--input", str(clean), "--output", str(again), *common
        ).returncode
        == 0
    )
    if rerun == "old name":  # it cannot find the moved output: the letters stay staged, kept
        assert list((tmp_path / "letters").glob(".*/rejected-*.jsonl")), "the letters went"
        assert (
            kvtrace_child(
                "anonymize", "--input", str(clean), "--output", str(moved), *common
            ).returncode
            == 0
        )
    letters = b"".join(p.read_bytes() for p in (tmp_path / "letters").glob("rejected-*.jsonl"))
    assert letters.count(b"\n") == 1, "the published night's rejected record has no letter"


TRACE = [
    {"timestamp": 1000 * i, "input_length": 40 + i, "output_length": 5, "hash_ids": [1, 2, 10 + i]}
    for i in range(6)
]


def test_a_double_star_glob_through_a_link_keeps_outputs_out_of_what_it_reads(tmp_path):
    """Round 4 placed a glob's folders as glob(3) walks them (Reach.every), but not for a
    glob with `**`: Reach takes it for a recursive glob ('everything beneath its folder',
    by identity) and skips that walk. expand_inputs calls glob.glob without recursive=True,
    so `**` is one name's `*`, and it follows links: 'D/**/t*.jsonl' reads E/t*.jsonl through
    D/l -> ../E, yet E lies beneath no D. `analyze 'D/**/t*.jsonl' --json E/t2.jsonl` is
    published (exit 0) where the same command's next run reads it as a trace (130 malformed
    lines), while 'D/*/t*.jsonl' is refused."""
    from kvtrace.cli import main

    (tmp_path / "D" / "sub").mkdir(parents=True)
    (tmp_path / "E").mkdir()
    write_jsonl(tmp_path / "E" / "t.jsonl", TRACE)
    (tmp_path / "D" / "l").symlink_to("../E")
    report = tmp_path / "E" / "t2.jsonl"
    assert (
        main(
            [
                "analyze",
                str(tmp_path / "D" / "*" / "t*.jsonl"),
                "--block-size",
                "4",
                "--json",
                str(report),
            ]
        )
        == 2
    )  # refused: round 4
    code = main(
        [
            "analyze",
            str(tmp_path / "D" / "**" / "t*.jsonl"),
            "--block-size",
            "4",
            "--json",
            str(report),
        ]
    )
    assert code == 2 and not report.exists(), "published where the next run reads it"


def test_a_users_folder_given_for_letters_is_not_made_kvtraces_forever(tiny_tokenizer, tmp_path):
    """storage.make_folder(private=True) marks whatever folder it is given with
    user.kvtrace.private (and chmods it 0700), one the user made included: `anonymize ...
    --dead-letter .` from a working folder holding the user's own files makes that folder
    'a private folder of kvtrace's' for good. The mark is never taken off, not even once no
    kvtrace file is left there, and _check_not_in_an_output refuses every later location at
    any depth beneath it: `analyze N --json report.json` in that folder is refused ("lies
    inside ..., a private folder of kvtrace's ... which only its own runs write"). A mark
    that says 'kvtrace made this' on a folder kvtrace did not make, which blocks writes it
    never promised to block (with --dead-letter ~, the whole home)."""
    from kvtrace.cli import main

    src = write_jsonl(tmp_path / "in.jsonl", [*[chat(i, 1000 * i) for i in range(3)], "not json"])
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("the user's own\n")
    night = tmp_path / "nights" / "n1"
    assert (
        main(
            [
                "anonymize",
                "--input",
                str(src),
                "--output",
                str(night),
                "--tokenizer",
                tiny_tokenizer,
                "--block-size",
                "4",
                "--dead-letter",
                str(work),
            ]
        )
        == 0
    )
    for letters in work.glob("rejected-*.jsonl"):
        letters.rename(tmp_path / letters.name)  # filed elsewhere: no kvtrace file is left
    assert main(["analyze", str(night), "--json", str(work / "report.json")]) == 0


def test_a_converted_output_is_read_whole_by_kvtraces_own_readers(tmp_path):
    """Round 4 held anonymize's rows to what a reader's line holds (trace_format.MAX_ROW_IDS),
    but convert writes rows too, unchecked: it reads a Bailian line up to
    MAX_TRACE_LINE_BYTES and writes its row with json.dumps, whose ', ' makes each id one byte
    longer. A 14 MB Bailian line of 7M one-digit ids (within the bound it reads) becomes a
    21 MB row, and `convert -o DIR` publishes a kvtrace folder (manifest, sha256) whose own
    readers refuse it: `analyze DIR` says "is not a whole kvtrace output: trace-00000-of-00001
    .jsonl differs from its manifest (copied partly?)", a whole output blamed on a partial
    copy; `validate` of the file skips the line. (~15 s, ~200 MB.)"""
    from kvtrace.cli import main

    ids = 7_000_000
    src = tmp_path / "bailian.jsonl"
    with open(src, "w") as f:
        f.write(
            f'{{"chat_id": 1, "parent_chat_id": -1, "timestamp": 1.0, "input_length": '
            f'{ids * 16}, "output_length": 5, "hash_ids": [' + ",".join(["1"] * ids) + "]}\n"
        )
        f.write(
            '{"chat_id": 2, "parent_chat_id": -1, "timestamp": 2.0, "input_length": 32, '
            '"output_length": 5, "hash_ids": [3, 4]}\n'
        )
    assert src.stat().st_size < 16 << 20  # a line convert reads
    out = tmp_path / "converted"
    assert main(["convert", "-o", str(out), str(src)]) == 0
    assert main(["analyze", str(out)]) == 0


@pytest.mark.parametrize("command", ["analyze", "anonymize"])
def test_a_folder_output_by_a_lock_name_never_blocks_that_outputs_runs(
    tiny_tokenizer, tmp_path, command
):
    """Round 4 kept a --json report by the name .X.kvtrace-lock from being unlinked (_own_lock)
    and refused the name among one command's own locations; check_written still takes it for
    any folder output. `analyze T --output .X.kvtrace-lock` (or anonymize) publishes a folder
    there, and every later run of X then opens its lock with O_CREAT on a folder: "error:
    [Errno 21] Is a directory: '.../.X.kvtrace-lock'" (exit 2), X never written again while
    that output stands, in words that do not say why. kvtrace's bookkeeping names are never
    taken for outputs."""
    from kvtrace.cli import main

    trace = write_jsonl(tmp_path / "t.jsonl", TRACE)
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(4)])
    locked = tmp_path / ".X.kvtrace-lock"
    if command == "analyze":
        code = main(["analyze", str(trace), "--block-size", "4", "--output", str(locked)])
    else:
        code = main(
            [
                "anonymize",
                "--input",
                str(src),
                "--output",
                str(locked),
                "--tokenizer",
                tiny_tokenizer,
                "--block-size",
                "4",
                "--dead-letter",
                str(tmp_path / "d"),
            ]
        )
    if code == 2:
        return  # refused before the work: the name is kvtrace's own
    assert code == 0
    assert main(["analyze", str(trace), "--block-size", "4", "--output", str(tmp_path / "X")]) == 0


def test_beam_synthesize_writes_an_output_whose_name_is_not_utf8(tmp_path):
    """The local engine writes `synthesize T -o b'syn\\xff.jsonl'`; Beam's (--engine beam)
    stages its parts in OUTPUT's staging folder + '.parts' and its WritePart step returns each
    part's path into a PCollection, which Beam encodes as UTF-8 (StrUtf8Coder): after the
    whole pipeline's work, "error: 'utf-8 [while running 'Synthesize/WritePart']' codec can't
    encode character '\\udcff' ...: surrogates not allowed" (exit 2), nothing published. The
    same command and name give the same output on either engine."""
    trace = write_jsonl(tmp_path / "t.jsonl", TRACE)
    odd = os.fsencode(str(tmp_path)) + b"/syn\xff"  # at block size 4, a derived trace's folder
    done = _bytes_run("synthesize", str(trace), "--block-size", "4", "--engine", "beam", "-o", odd)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (Path(os.fsdecode(odd)) / "trace-00000-of-00001.jsonl").is_file()


@pytest.mark.parametrize("odd", ["--input", "--output"])
def test_beam_anonymize_reads_and_writes_names_that_are_not_utf8(tiny_tokenizer, tmp_path, odd):
    """Round 4 made `anonymize` write (and round 2 read) locations whose names are not UTF-8,
    on the local engine; --engine beam still fails on both: an input b'in\\xff.jsonl' stops
    in "Read/ReadRanges/ParDo(ReadFileRange)" (Beam encodes the path as UTF-8 between steps),
    an output b'night\\xff' after the pipeline with "'utf-8' codec can't encode character
    '\\udcff'" (exit 2), nothing published, where the local engine publishes both."""
    src = write_jsonl(tmp_path / "src.jsonl", [chat(i, 1000 * i) for i in range(4)])
    base = os.fsencode(str(tmp_path))
    source = base + b"/in\xff.jsonl" if odd == "--input" else os.fsencode(str(src))
    if odd == "--input":
        Path(os.fsdecode(source)).write_bytes(src.read_bytes())
    out = base + b"/night\xff" if odd == "--output" else os.fsencode(str(tmp_path / "out"))
    done = _bytes_run(
        "anonymize",
        "--input",
        source,
        "--output",
        out,
        "--tokenizer",
        tiny_tokenizer,
        "--block-size",
        "4",
        "--engine",
        "beam",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (Path(os.fsdecode(out)) / "manifest.json").is_file()


@pytest.mark.parametrize("command", ["synthesize", "convert"])
def test_a_trace_file_kvtrace_writes_is_read_by_its_own_readers(tmp_path, command):
    """Round 4's lone-shard rule (trace_inputs._check_lone) refuses any file by a shard's name
    with no manifest beside it, but the single-file writers take that name: `synthesize T -o
    trace-00000-of-00001.jsonl` says "output: trace-00000-of-00001.jsonl (valid)" (exit 0),
    then `analyze` and `validate` of that file refuse it: "is not a whole kvtrace output: its
    manifest.json is missing, and only it proves trace-00000-of-00001.jsonl whole (copied
    partly?)". A whole file kvtrace published, blamed on a partial copy; a writer refuses the
    name before the work, or the readers read what it wrote."""
    from kvtrace.cli import main

    out = tmp_path / "trace-00000-of-00001.jsonl"
    if command == "synthesize":
        trace = write_jsonl(tmp_path / "t.jsonl", TRACE)
        code = main(["synthesize", str(trace), "--block-size", "4", "-o", str(out)])
    else:
        bailian = write_jsonl(
            tmp_path / "b.jsonl",
            [
                {
                    "chat_id": i,
                    "parent_chat_id": -1,
                    "timestamp": float(i),
                    "input_length": 32,
                    "output_length": 5,
                    "hash_ids": [1, 2 + i],
                }
                for i in range(3)
            ],
        )
        code = main(["convert", "-o", str(out), str(bailian)])
    if code == 2:
        return  # the name refused before the work
    assert code == 0
    size = "4" if command == "synthesize" else "16"  # convert's: Bailian's 16-token blocks
    shutil.copy(out, tmp_path / "renamed.jsonl")  # the same bytes by another name: valid
    assert main(["validate", str(tmp_path / "renamed.jsonl"), "--block-size", size]) == 0
    assert main(["validate", str(out), "--block-size", size]) == 0
