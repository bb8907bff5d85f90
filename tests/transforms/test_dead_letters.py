"""Dead letters written as they come (LetterFile), joined in order (join_letters), counted
(Tally): what a run holds of them is bounded whatever their count."""

from __future__ import annotations

import json
import tracemalloc

from transforms.dead_letters import (
    DAMAGED_FILE,
    DeadLetter,
    LetterFile,
    SortedRuns,
    StagedLetters,
    Tally,
    join_letters,
    merge_runs,
)


def letter(i: int, reason: str = "invalid_json", size: int = 10) -> DeadLetter:
    return DeadLetter("in.jsonl", b"x" * size + str(i).encode(), reason, f"line {i}",
                      lost_bytes=i if reason == DAMAGED_FILE else 0)


def test_letters_are_on_disk_as_they_come_and_counted(tmp_path):
    path = str(tmp_path / "part.jsonl")
    with LetterFile(path) as letters:
        for i in range(3):
            letters.add(letter(i))
        letters.add(letter(7, DAMAGED_FILE))
    lines = [json.loads(line) for line in open(path)]
    assert [line["message"] for line in lines] == ["line 0", "line 1", "line 2", "line 7"]
    assert letters.tally == Tally(4, 7, (("damaged_file", 1), ("invalid_json", 3)))
    assert letters.tally == Tally.of(letter(i) for i in range(3)) + Tally.of([letter(7, DAMAGED_FILE)])


def test_no_letters_no_file(tmp_path):
    path = tmp_path / "part.jsonl"
    with LetterFile(str(path)) as letters:
        pass
    assert not path.exists() and StagedLetters.of(letters) == StagedLetters()


def test_parts_are_joined_in_their_order_then_the_held_ones_and_removed(tmp_path):
    staged = StagedLetters()
    for part in (2, 0, 1):  # the order given, not the names'
        with LetterFile(str(tmp_path / f"part-{part}.jsonl")) as letters:
            letters.add(letter(part))
        staged += StagedLetters.of(letters)
    join_letters(str(tmp_path / "all.jsonl"), staged, [letter(9)])
    lines = [json.loads(line)["message"] for line in open(tmp_path / "all.jsonl")]
    assert lines == ["line 2", "line 0", "line 1", "line 9"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all.jsonl"]
    assert oct((tmp_path / "all.jsonl").stat().st_mode & 0o777) == "0o600"  # raw prompts


def test_writing_many_letters_holds_about_one(tmp_path):
    """2,000 letters of 4 KB (each ~24 KB as JSON, control characters escaped): held in a
    list, they would take ~50 MB; written as they come, memory stays at one letter's."""
    path = str(tmp_path / "part.jsonl")
    tracemalloc.start()
    with LetterFile(path) as letters:
        for i in range(2_000):
            letters.add(DeadLetter("in.jsonl", b"\x01" * 4000, "invalid_json", str(i)))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert letters.tally.count == 2_000
    assert peak < 2 << 20, peak
    join_letters(str(tmp_path / "all.jsonl"), StagedLetters.of(letters))
    assert sum(1 for _ in open(tmp_path / "all.jsonl")) == 2_000


def test_sorted_runs_merge_to_the_same_bytes_whatever_the_order_and_split(tmp_path):
    """Beam hands letters over in bundles of no set order: written as sorted runs (small here,
    so there are many) and merged (a few at a time), the file is the same."""
    letters = [letter(i, size=i % 7) for i in range(300)]
    files = []
    for name, order, run_bytes in (("a", letters, 200), ("b", letters[::-1], 1000),
                                   ("c", letters[1::2] + letters[::2], 1 << 20)):
        folder = tmp_path / name
        folder.mkdir()
        staged = StagedLetters()
        for bundle in (order[:100], order[100:]):
            runs = SortedRuns(str(folder), run_bytes)
            for each in bundle:
                runs.add(each)
            staged += runs.close()
        merge_runs(str(folder / "all.jsonl"), staged, fan_in=3)
        assert staged.tally == Tally.of(letters)
        assert [p.name for p in folder.iterdir()] == ["all.jsonl"]  # the runs are gone
        files.append((folder / "all.jsonl").read_bytes())
    assert files[0] == files[1] == files[2]
    assert sorted(files[0].splitlines()) == files[0].splitlines()
    assert len(files[0].splitlines()) == 300


def test_no_runs_merge_to_an_empty_file(tmp_path):
    merge_runs(str(tmp_path / "all.jsonl"), SortedRuns(str(tmp_path)).close())
    assert (tmp_path / "all.jsonl").read_bytes() == b""
