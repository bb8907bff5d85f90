"""An output folder's mark (publish.OUTPUT_MARK) kvtrace did not write, however deep its JSON
nests, is no mark: a run on the folder refuses it as any folder of files kvtrace did not write,
in one line (exit 2), never a traceback or a failed job (red team round 24: 4,000 `[`)."""

from __future__ import annotations

import os

from helpers import write_jsonl
from kvtrace.cli import main
from kvtrace.transforms.write.publish import OUTPUT_MARK


def test_a_mark_nested_past_the_parsers_depth_is_refused_in_one_line(tmp_path, capsys):
    trace = write_jsonl(
        tmp_path / "trace.jsonl", [{"timestamp": 0, "input_length": 4, "hash_ids": [0]}]
    )
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    os.setxattr(out, OUTPUT_MARK, b"[" * 4000)
    assert main(["analyze", str(trace), "--block-size", "4", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "holds files kvtrace did not write (notes.txt)" in err, err
    assert (out / "notes.txt").read_text() == "mine"
