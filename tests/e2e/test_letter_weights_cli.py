"""Every letter weighs its record's bytes as read, alike on every engine: the summary's
"N of M input bytes became no record" and "read = exported + rejected" are the same from the
local engine and from Beam, over a compressed log, a Parquet file and Batch lines."""

from __future__ import annotations

import gzip
import io
import json
import re
import sys

import pytest

from helpers import anonymize, chat, published_letters

DAY_MS = 1_763_703_600_000


def _inputs(folder) -> list:
    """A gzip log with a junk line and a list response of 50 chats, a Parquet file with a row
    that is no request, and a Batch output line answering no request (compressed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    wrapped = {"object": "list", "data": [chat(i, DAY_MS + i) for i in range(50)]}
    lines = [json.dumps(chat(i, DAY_MS + 1000 * i)) for i in range(20)]
    lines[5:5] = ["not json " * 50, json.dumps(wrapped)]
    log = folder / "log.jsonl.gz"
    log.write_bytes(gzip.compress("\n".join(lines).encode() + b"\n", mtime=0))
    rows = [{"timestamp": DAY_MS + 500 + i, "prompt": f"p {i}"} for i in range(9)]
    rows.append({"timestamp": DAY_MS, "prompt": None})
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    table = folder / "rows.parquet"
    table.write_bytes(buffer.getvalue())
    stray = {"id": "b", "custom_id": "stray", "response": {"status_code": 200, "body": {}}}
    batch = folder / "output.jsonl.gz"
    batch.write_bytes(gzip.compress(json.dumps(stray).encode() + b"\n", mtime=0))
    return [log, table, batch]


@pytest.mark.slow  # two whole runs, one on Beam
@pytest.mark.beam
def test_every_letter_weighs_its_bytes_alike_on_every_engine(tiny_tokenizer, tmp_path, capsys):
    inputs = _inputs(tmp_path)
    said, letters = {}, {}
    for engine in ("local", "beam"):
        out = tmp_path / engine
        flags = ("--block-size", "4", "--max-rejected-fraction", "0.9", "--engine", engine)
        assert anonymize(tiny_tokenizer, inputs, out, *flags) == 0
        summary = capsys.readouterr().out
        said[engine] = re.findall(r"(\d+ read = .*|[\d,]+ input bytes became no record.*)", summary)
        letters[engine] = published_letters(tmp_path / f"{engine}-rejected").read_bytes()
    assert said["local"] == said["beam"] and len(said["local"]) == 2
    assert letters["local"] == letters["beam"]
    # a Parquet row's letter carries its own bytes (row_bytes), weighed at its file's share
    # only at the tally (docs/ANONYMIZE.md)
    weights = {
        letter["error"]: letter.get("lost_bytes", letter.get("row_bytes"))
        for letter in map(json.loads, letters["local"].splitlines())
    }
    assert set(weights) == {"invalid_json", "no_input", "unjoined_batch"}
    assert all(weight > 0 for weight in weights.values())


def test_standard_input_weighs_its_letters_as_its_file_does(
    tiny_tokenizer, tmp_path, monkeypatch, capsys
):
    """Standard input is spooled and read as its file is: a compressed log's letters weigh
    its lines at the same whole share, and the summary says the same bytes lost."""
    [log, *_] = _inputs(tmp_path)
    flags = ("--block-size", "4", "--max-rejected-fraction", "0.9")
    said, weights = [], []
    for name, given in (("file", str(log)), ("stdin", "-")):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(log.read_bytes())))
        assert anonymize(tiny_tokenizer, [given], tmp_path / name, *flags) == 0
        said.append(re.findall(r"[\d,]+ input bytes became no record", capsys.readouterr().out))
        letters = published_letters(tmp_path / f"{name}-rejected").read_bytes().splitlines()
        weights.append(sorted(json.loads(letter)["lost_bytes"] for letter in letters))
    assert said[0] == said[1] and len(said[0]) == 1
    assert weights[0] == weights[1] and len(weights[0]) == 2
