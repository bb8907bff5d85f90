"""Dead letters written as they come into sorted runs (SortedRuns), merged into the one declared
order (merge_runs), counted (Tally): what a run holds of them is bounded whatever their count,
and the file's bytes depend on the letters alone."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.dead_letters import (
    DAMAGED_FILE,
    LETTER_LINE_BYTES,
    LETTER_MESSAGE_CHARS,
    WHOLE_ROW,
    WITHHELD_LINE,
    DeadLetter,
    SortedRuns,
    StagedLetters,
    Tally,
    merge_runs,
    shown_name,
)


def letter(i: int, reason: str = "invalid_json", size: int = 10) -> DeadLetter:
    return DeadLetter(
        "in.jsonl",
        b"x" * size + str(i).encode(),
        reason,
        f"line {i}",
        lost_bytes=i if reason == DAMAGED_FILE else 0,
    )


def test_letters_are_counted_as_they_come(tmp_path):
    runs = SortedRuns(str(tmp_path))
    for i in range(3):
        runs.add(letter(i))
    runs.add(letter(7, DAMAGED_FILE))
    staged = runs.close()
    assert staged.tally == Tally(4, 7, (("damaged_file", 1), ("invalid_json", 3)))
    assert staged.tally == (
        Tally.of(letter(i) for i in range(3)) + Tally.of([letter(7, DAMAGED_FILE)])
    )


def test_row_letters_weigh_their_files_share_whatever_the_split_and_are_no_letters_themselves(
    tmp_path,
):
    """A Parquet row's letter carries its bytes as JSON (row_bytes) and their part in each
    column (row_columns); its file's share record (per column and WHOLE_ROW: stored, as JSON)
    turns them into bytes as stored once every part is added, each column's chunks shared by
    that column's sizes, so a tally of parts, split anywhere and added in any order, weighs
    what the whole does; the share is neither counted nor written, and a file's rows weigh its
    rows' bytes at most."""
    rows = [
        DeadLetter("f.parquet", b"{}", "no_input", "x", row_bytes=sum(c), row_columns=c)
        for c in ((8, 2), (2, 988))
    ]
    # column 0: 60 bytes for 10 of JSON, column 1: 30 for 990, 10 more owned by whole rows
    share = DeadLetter(
        "f.parquet",
        b"",
        "row_share",
        "s",
        share=((WHOLE_ROW, 10, 1_000), (0, 60, 10), (1, 30, 990)),
    )
    other = DeadLetter("g.jsonl", b"{", "invalid_json", "x", lost_bytes=7)
    letters = [*rows, share, other]
    whole = Tally.of(letters)
    # row 0: 48 of column 0, 1 of 1 (0.06 up), 1 of the rest; row 1: 12, 30 (29.94 up), 10 (9.9 up)
    assert (whole.count, whole.lost_bytes) == (3, 100 + 7)
    assert Tally.of([rows[0], share]).lost_bytes == 48 + 1 + 1
    for cut in range(len(letters) + 1):
        for order in (letters[cut:] + letters[:cut], letters[:cut][::-1] + letters[cut:]):
            assert Tally.of(order[:cut]) + Tally.of(order[cut:]) == whole
    assert Tally.of([rows[1], share, share]).lost_bytes == 12 + 30 + 10  # read twice: same share
    assert Tally.of([*rows, *rows, share]).lost_bytes == 100  # never more than its rows' bytes
    assert Tally.of(rows).lost_bytes == 1_000  # no share (never expected): its rows' JSON bytes
    runs = SortedRuns(str(tmp_path))
    for item in letters:
        runs.add(item)
    staged = runs.close()
    assert staged.tally == whole
    merged = merge_runs(str(tmp_path / "letters.jsonl"), staged, [share])
    written = [json.loads(line) for line in open(merged, encoding="utf-8")]
    assert [line["error"] for line in written] == ["no_input", "no_input", "invalid_json"]
    assert [line.get("row_bytes") for line in written] == [10, 990, None]


def test_the_letters_of_records_never_served_are_counted_and_their_bytes_told_apart():
    """A gateway's cache hit (NEVER_SERVED) is a letter like any, its bytes lost like any, and
    the tally says which part of them it lost, by the same rule, however it is split."""
    hit = DeadLetter("f.parquet", b"{}", "gateway_cache_hit", "x", row_bytes=10, row_columns=(8, 2))
    line_hit = DeadLetter("g.jsonl", b"{}", "gateway_cache_hit", "x", lost_bytes=5)
    damaged = DeadLetter("g.jsonl", b"{", "invalid_json", "x", lost_bytes=7)
    share = DeadLetter(
        "f.parquet", b"", "row_share", "s", share=((WHOLE_ROW, 10, 10), (0, 60, 8), (1, 30, 2))
    )
    letters = [hit, line_hit, damaged, share]
    whole = Tally.of(letters)
    assert (whole.count, whole.lost_bytes, whole.unserved_bytes) == (3, 100 + 5 + 7, 100 + 5)
    for cut in range(len(letters) + 1):
        assert Tally.of(letters[:cut]) + Tally.of(letters[cut:]) == whole


def test_no_letters_no_run(tmp_path):
    assert SortedRuns(str(tmp_path)).close() == StagedLetters()
    assert not any(tmp_path.iterdir())


def test_runs_and_held_letters_merge_sorted_and_the_runs_go(tmp_path):
    staged = StagedLetters()
    for part in (2, 0, 1):  # ranges finished in any order
        runs = SortedRuns(str(tmp_path))
        runs.add(letter(part))
        staged += runs.close()
    merge_runs(str(tmp_path / "all.jsonl"), staged, [letter(9), letter(3)])
    lines = [json.loads(line)["message"] for line in open(tmp_path / "all.jsonl")]
    assert lines == ["line 0", "line 1", "line 2", "line 3", "line 9"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all.jsonl"]
    assert oct((tmp_path / "all.jsonl").stat().st_mode & 0o777) == "0o600"  # raw prompts


def test_many_letters_hold_one_run_at_most(tmp_path):
    """2,000 letters of 4 KB (each ~24 KB as JSON, control characters escaped): held in a
    list, they would take ~50 MB; written as runs of 1 MB, memory stays near one run's."""
    tracemalloc.start()
    runs = SortedRuns(str(tmp_path), run_bytes=1 << 20)
    for i in range(2_000):
        runs.add(DeadLetter("in.jsonl", b"\x01" * 4000, "invalid_json", str(i)))
    staged = runs.close()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert staged.tally.count == 2_000 and len(staged.files) > 40
    assert peak < 3 << 20, peak
    merge_runs(str(tmp_path / "all.jsonl"), staged)
    assert sum(1 for _ in open(tmp_path / "all.jsonl")) == 2_000


def test_no_runs_merge_to_an_empty_file(tmp_path):
    merge_runs(str(tmp_path / "all.jsonl"), SortedRuns(str(tmp_path)).close())
    assert (tmp_path / "all.jsonl").read_bytes() == b""


LETTERS = st.builds(
    DeadLetter,
    st.sampled_from(["a.jsonl", "a.jsonl.gz", "b/c.parquet", ""]),
    st.binary(max_size=12),
    st.sampled_from(["invalid_json", DAMAGED_FILE, "late"]),
    st.text(max_size=12),
    st.integers(0, 3),
)


@settings(max_examples=30, deadline=None)
@given(
    letters=st.lists(LETTERS, max_size=30),
    held=st.integers(0, 30),
    seed=st.randoms(),
    run_bytes=st.integers(1, 400),
    bundles=st.integers(1, 4),
    fan_in=st.integers(2, 5),
)
def test_the_file_is_the_letters_sorted_whatever_the_order_split_and_engine(
    tmp_path_factory, letters, held, seed, run_bytes, bundles, fan_in
):
    """The declared order (dead_letters.py) is the lines' bytes sorted: however the letters are
    shuffled, dealt into bundles (Beam) or ranges (the local engine's workers), spilled into runs,
    held in memory (a stream window's) or merged a few runs at a time, the file is the same,
    undecodable bytes, empty sources and non-ASCII messages included."""
    folder = tmp_path_factory.mktemp("letters")
    order = letters[:]
    seed.shuffle(order)
    held, written = order[:held], order[held:]
    staged = StagedLetters()
    for bundle in range(bundles):
        runs = SortedRuns(str(folder), run_bytes)
        for each in written[bundle::bundles]:
            runs.add(each)
        staged += runs.close()
    path = merge_runs(str(folder / "all.jsonl"), staged, held, fan_in=fan_in)
    with open(path, "rb") as merged:
        assert merged.read() == b"".join(sorted(each.to_line() for each in letters))
    assert staged.tally + Tally.of(held) == Tally.of(letters)
    assert [p.name for p in folder.iterdir()] == ["all.jsonl"]


def test_a_letter_is_bounded_whatever_its_record_and_names_the_whole_by_size_and_digest():
    """A record past LETTER_LINE_BYTES keeps that much of its start, and its size and SHA-256
    (to find it in the input); at most ~6 x LETTER_LINE_BYTES as JSON, control bytes and all."""
    line = b"\x01" * (3 << 20) + b"\xff"
    written = json.loads(DeadLetter("in.jsonl", line, "invalid_json", "m" * 10**6).to_line())
    assert written["line"] == "\x01" * LETTER_LINE_BYTES
    assert written["line_bytes"] == len(line)
    assert written["line_sha256"] == hashlib.sha256(line).hexdigest()
    assert len(written["message"]) == LETTER_MESSAGE_CHARS
    assert len(DeadLetter("in.jsonl", line, "invalid_json", "m").to_line()) < 7 * LETTER_LINE_BYTES
    short = json.loads(letter(1, size=LETTER_LINE_BYTES - 1).to_line())
    assert short["line"] == "x" * (LETTER_LINE_BYTES - 1) + "1" and "line_bytes" not in short


def test_merging_letters_of_large_records_holds_one_bounded_letter_per_run(tmp_path):
    """24 letters of 3 MiB records of control bytes, each its own run: the merge holds one
    bounded letter of each (it held 18 MB of each, the whole line escaped)."""
    staged = StagedLetters()
    for i in range(24):
        runs = SortedRuns(str(tmp_path), run_bytes=1)
        runs.add(
            DeadLetter("in.jsonl", b"\x01" * (3 << 20) + bytes([65 + i]), "invalid_json", str(i))
        )
        staged += runs.close()
    tracemalloc.start()
    merge_runs(str(tmp_path / "all.jsonl"), staged)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 24 * 7 * LETTER_LINE_BYTES, peak
    assert sum(1 for _ in open(tmp_path / "all.jsonl", "rb")) == 24


def test_a_letter_of_a_file_whose_name_is_not_utf8_is_a_utf8_line_naming_its_bytes():
    """A Linux name is bytes: b'night\\xff.jsonl' reaches Python as a surrogate, which a strict
    UTF-8 encoding refuses; its letter names it escaped, as `analyze` prints names."""
    name = os.fsdecode(b"/in/night\xff.jsonl")
    line = DeadLetter(shown_name(name), b"not json", "malformed_json", f"in {name}: bad").to_line()
    letter = json.loads(line.decode("utf-8"))
    assert letter["source"] == "/in/night\\xff.jsonl"
    assert letter["message"] == "in /in/night\\xff.jsonl: bad"


def test_a_lone_surrogate_no_byte_stands_for_is_escaped_as_itself():
    line = DeadLetter("s", b"", "r", 'record quoted "\ud800"').to_line()
    assert json.loads(line)["message"] == 'record quoted "\\ud800"'


# Names as Linux gives them to Python: any bytes but NUL and "/", decoded by os.fsdecode.
FILE_NAMES = st.binary(min_size=1, max_size=12).filter(lambda b: b"\0" not in b).map(os.fsdecode)


@given(st.one_of(FILE_NAMES, st.text(max_size=12)), st.one_of(FILE_NAMES, st.text(max_size=12)))
def test_two_names_are_shown_as_two_printable_one_line_texts(left, right):
    """shown_name is injective (the backslash escaped too: b"in\\xff" and "in\\\\xff" differ) and
    shows printable text only, which any UTF-8 writer takes."""
    shown = shown_name(left)
    assert shown.isprintable()
    shown.encode("utf-8")  # raises on a surrogate left in
    assert (shown == shown_name(right)) == (left == right)


def test_a_withheld_letter_holds_no_line_nor_long_number_and_keeps_its_reason():
    """A letter made withheld (a capture run's, docs/CAPTURES.md) keeps no byte of its line and
    no run of 8 digits or more in its message, whatever they hold; its reason and source stay.
    Decided by the flag, not the bytes: the same line in a letter not withheld stays whole."""
    line = b'{"input_sequence_hashe\\u0073": [18373232785129012599, "0xfeedfacecafebeef"]}'
    message = "bad near 18373232785129012599 0xfeedfacecafebeef"
    letter = DeadLetter("cap.jsonl", line, "invalid_json", message, withhold=True)
    written = letter.to_line()
    assert letter.line == WITHHELD_LINE
    assert b"18373232785" not in written and b"feedfacecafe" not in written
    assert b"invalid_json" in written and b"cap.jsonl" in written
    assert dataclasses.replace(letter, source="other").line == WITHHELD_LINE
    kept = DeadLetter("in.jsonl", line, "invalid_json", message)
    assert kept.line == line and kept.message == message
