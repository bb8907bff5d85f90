"""A run that rejects nothing leaves no dead-letter file, and no dead-letter folder it made,
and says so; one that rejects a record publishes its letters as before."""

from __future__ import annotations

import pytest

from helpers import SALT, anonymize, chat, published_letters, write_jsonl


@pytest.fixture
def salted(tmp_path):
    (tmp_path / "salt").write_text(SALT)
    return ["--salt-file", str(tmp_path / "salt")]


def test_nothing_rejected_leaves_no_rejected_folder(tiny_tokenizer, tmp_path, capsys, salted):
    logs = write_jsonl(tmp_path / "in.jsonl", [chat(0, 1_000), chat(1, 2_000)])
    assert anonymize(tiny_tokenizer, [logs], tmp_path / "out", *salted) == 0
    assert "  rejected  none: no dead-letter file\n" in capsys.readouterr().out
    assert not (tmp_path / "out-rejected").exists()
    assert (tmp_path / "out" / "manifest.json").exists()


def test_a_folder_of_the_users_stays_and_letters_still_publish(
    tiny_tokenizer, tmp_path, capsys, salted
):
    letters = tmp_path / "letters"
    letters.mkdir(mode=0o700)
    logs = write_jsonl(tmp_path / "in.jsonl", [chat(0, 1_000)])
    dead = ["--dead-letter", str(letters), *salted]
    assert anonymize(tiny_tokenizer, [logs], tmp_path / "out", *dead) == 0
    assert letters.is_dir() and not list(letters.iterdir())  # the user's: left as it was
    broken = write_jsonl(tmp_path / "broken.jsonl", [chat(0, 1_000), b"{broken"])
    assert anonymize(tiny_tokenizer, [broken], tmp_path / "out2", *salted) == 0
    assert "  rejected  invalid_json 1: " in capsys.readouterr().out
    assert published_letters(tmp_path / "out2-rejected").stat().st_size > 0
