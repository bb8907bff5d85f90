"""--input words: which files they name (paths.expand_inputs)."""

from __future__ import annotations

import logging
import os

import pytest

from transforms.read.paths import expand_inputs


def test_an_existing_path_is_the_file_whatever_its_characters(tmp_path):
    named = tmp_path / "x[1].jsonl"  # as a glob: x1.jsonl
    for path in (named, tmp_path / "x1.jsonl"):
        path.write_text("{}\n")
    assert expand_inputs([str(named)]) == [str(named)]
    assert expand_inputs([str(tmp_path / "x[0-9].jsonl")]) == [str(tmp_path / "x1.jsonl")]


def test_one_file_by_many_names_is_read_once_under_its_first_name(tmp_path, monkeypatch, caplog):
    path = tmp_path / "in.jsonl"
    path.write_text("{}\n")
    (tmp_path / "link.jsonl").symlink_to(path)
    os.link(path, tmp_path / "hard.jsonl")
    monkeypatch.chdir(tmp_path)
    names = ["in.jsonl", f"{tmp_path}/./in.jsonl", str(tmp_path / "*.jsonl"), "link.jsonl",
             "./in.jsonl"]
    with caplog.at_level(logging.WARNING, "kvtrace"):
        once = expand_inputs(names)
    assert once == ["./in.jsonl"]  # the least of its names, in sorted order
    assert expand_inputs(list(reversed(names))) == once
    assert "one file named 7 ways" in caplog.text


def test_distinct_files_are_all_kept(tmp_path):
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_text("{}\n")
    assert expand_inputs([str(tmp_path / "*.jsonl"), str(tmp_path / "a.jsonl")]) == [
        str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]


@pytest.mark.parametrize("path", ["/proc/self/status", "/dev/null"])
def test_a_file_that_is_not_regular_or_whose_size_is_untrue_is_refused(path):
    with pytest.raises(ValueError, match="not a regular file|size cannot be trusted"):
        expand_inputs([path])


def test_a_dangling_link_is_kept_for_its_read_to_dead_letter(tmp_path):
    (tmp_path / "gone.jsonl").symlink_to(tmp_path / "missing")
    assert expand_inputs([str(tmp_path / "gone.jsonl")]) == [str(tmp_path / "gone.jsonl")]
