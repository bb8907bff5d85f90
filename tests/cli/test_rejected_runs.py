"""A run that rejects most of its input is refused loudly: exit 1, one line with the commonest
reasons and the input shape kvtrace reads, nothing published. Input in a shape kvtrace does
not read (an OpenAI Batch file, `ts` for `timestamp`, a JSON array, pretty-printed JSON) is
rejected whole, so it is always refused, whatever --max-rejected-fraction says."""

from __future__ import annotations

import json

import pytest

from helpers import chat, write_jsonl
from kvtrace.cli import main
from kvtrace.commands.anonymize import DEFAULT_MAX_REJECTED_FRACTION

MESSAGES = [{"role": "user", "content": "the quick brown fox"}]
ONE_OBJECT_PER_LINE = "one JSON object per line (JSONL), not a JSON array or pretty-printed JSON"
SHAPES = {
    "openai-batch": (
        "\n".join(
            json.dumps(
                {
                    "custom_id": f"r{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {"model": "m", "messages": MESSAGES},
                }
            )
            for i in range(3)
        ),
        "unjoined_batch 3",  # each line's letter says to give its output file too
        "give both to one run, which joins their lines by custom_id",
    ),
    "ts-not-timestamp": (
        "\n".join(json.dumps({"ts": 1763700000000 + i, "messages": MESSAGES}) for i in range(3)),
        "missing_timestamp 3",
        "each line needs a timestamp (or created) field",
    ),
    "json-array": (
        json.dumps([{"timestamp": i, "messages": MESSAGES} for i in range(3)]),
        "not_an_object 1",
        ONE_OBJECT_PER_LINE,
    ),
    "pretty-array": (
        json.dumps([{"timestamp": i, "messages": MESSAGES} for i in range(2)], indent=2),
        "invalid_json ",
        ONE_OBJECT_PER_LINE,
    ),
    "pretty-object": (
        json.dumps({"timestamp": 1, "messages": MESSAGES}, indent=2),
        "invalid_json ",
        ONE_OBJECT_PER_LINE,
    ),
}


def _anonymize(tokenizer: str, src, out, *extra: str) -> int:
    return main(
        ["anonymize", "--input", str(src), "--output", str(out), "--tokenizer", tokenizer, *extra]
    )


# Each shape under the default bound; one under a bound that allows any share, which an
# input rejected whole still fails.
@pytest.mark.parametrize(
    "shape, bound",
    [pytest.param(shape, [], id=shape) for shape in SHAPES]
    + [
        pytest.param(
            "pretty-object", ["--max-rejected-fraction", "1"], id="pretty-object-any-share"
        )
    ],
)
def test_input_of_a_shape_kvtrace_does_not_read_is_refused_with_a_hint(
    tiny_tokenizer, tmp_path, capsys, shape, bound
):
    text, reason, hint = SHAPES[shape]
    src = tmp_path / "in.jsonl"
    src.write_text(text + "\n")
    out = tmp_path / "out"
    assert _anonymize(tiny_tokenizer, src, out, *bound) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # no summary, no replay commands
    assert captured.err.count("\n") == 1
    assert "every record rejected: nothing to publish" in captured.err
    assert f"top reasons: {reason}" in captured.err and hint in captured.err
    assert not out.exists()


def test_more_than_the_default_share_rejected_is_refused(tiny_tokenizer, tmp_path, capsys):
    assert DEFAULT_MAX_REJECTED_FRACTION == 0.5
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0), b"bad", b"{", chat(1, 1), b"bad"])
    assert _anonymize(tiny_tokenizer, src, tmp_path / "out") == 1
    err = capsys.readouterr().err
    assert (
        "3 of 5 records, 7 of 358 input bytes became no record (60.0% > --max-rejected-fraction "
        "0.5); top reasons: invalid_json 3" in err
    )
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_the_default_share_rejected_is_published(tiny_tokenizer, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0), b"bad", chat(1, 1), b"bad"])
    assert _anonymize(tiny_tokenizer, src, tmp_path / "out") == 0
    records = json.loads((tmp_path / "out" / "manifest.json").read_text())["records"]
    letters = (tmp_path / "out-rejected").glob("*.jsonl")  # the run's counts stay private
    assert (records["exported"], sum(len(p.read_text().splitlines()) for p in letters)) == (2, 2)


def test_help_names_the_default_bound(capsys):
    with pytest.raises(SystemExit):
        main(["anonymize", "--help"])
    assert f"(default {DEFAULT_MAX_REJECTED_FRACTION}; 1 allows any share)" in " ".join(
        capsys.readouterr().out.split()
    )
