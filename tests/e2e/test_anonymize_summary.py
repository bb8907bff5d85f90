"""The summary's line on requests without an output length: said only when some had none."""

from __future__ import annotations

from helpers import anonymize, chat, trace, write_jsonl

DAY0 = 1_700_000_000_000


def _said_of_output_lengths(capsys) -> list[str]:
    said = capsys.readouterr()
    return [line for line in (said.out + said.err).splitlines() if "output length" in line]


def test_a_run_whose_requests_all_have_output_lengths_says_nothing_of_them(
    tiny_tokenizer, tmp_path, capsys
):
    log = write_jsonl(tmp_path / "log.jsonl", [chat(i + 1, DAY0 + 1000 * i) for i in range(4)])
    capsys.readouterr()
    assert anonymize(tiny_tokenizer, [log], tmp_path / "out", "--block-size", "4") == 0
    assert _said_of_output_lengths(capsys) == []


def test_one_request_without_an_output_length_is_told_in_one_line(tiny_tokenizer, tmp_path, capsys):
    records = [chat(i + 1, DAY0 + 1000 * i) for i in range(4)]
    records[2].pop("output_length")
    log = write_jsonl(tmp_path / "log.jsonl", records)
    capsys.readouterr()
    assert anonymize(tiny_tokenizer, [log], tmp_path / "out", "--block-size", "4") == 0
    assert [row["output_length"] for row in trace(tmp_path / "out")] == [1, 2, 0, 4]
    assert _said_of_output_lengths(capsys) == [
        "warning: 1 request had no output length: published with 0"
    ]
