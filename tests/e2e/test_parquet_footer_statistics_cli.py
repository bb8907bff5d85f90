"""A Parquet input whose footer holds malformed size statistics (red team round 9, input side):
Arrow threw while building a column chunk's metadata, outside any handler, and the process
aborted (SIGABRT, exit 134: anonymize reads the first record in its own process to warm the
renderer up). A row group short of a column chunk raised IndexError. The footer is now checked
by kvtrace's own Thrift reader before Arrow builds it (read/paths._check_footer): the file is
one damaged_file dead letter, its bytes lost, and the run goes on with the other inputs."""

from __future__ import annotations

import io
import json

import pytest

from helpers import (
    chat,
    kvtrace_child,
    parquet_footer,
    published_letters,
    read_jsonl,
    thrift_field,
    with_parquet_footer,
    write_jsonl,
)

pytestmark = pytest.mark.slow


def _chunks(footer: list) -> list:
    """The first row group's column chunks (timestamp, messages' role and content, ...)."""
    return thrift_field(thrift_field(footer, 4)[2][1][0], 1)[2][1]


def _more_levels(field: int, column: int):
    """An edit: the column's histogram (size statistics field 2: repetition, 3: definition)
    counts three more levels than the column has."""

    def edit(footer: list) -> None:
        sizes = thrift_field(thrift_field(_chunks(footer)[column], 3)[2], 16)[2]
        histogram = thrift_field(sizes, field)
        histogram[2] = (histogram[2][0], [*histogram[2][1], 0, 0, 0])

    return edit


def _a_chunk_missing(footer: list) -> None:
    chunks = thrift_field(thrift_field(footer, 4)[2][1][0], 1)
    chunks[2] = (chunks[2][0], chunks[2][1][:2])


def _log_edited(edit) -> bytes:
    """A four-request Parquet log (pyarrow writes size statistics) whose footer is edited."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist([chat(i, 1000 * i) for i in range(4)]), sink)
    footer, body = parquet_footer(sink.getvalue())
    edit(footer)
    return with_parquet_footer(body, footer)


@pytest.mark.parametrize(
    "edit",
    [_more_levels(3, 1), _more_levels(3, 2), _more_levels(2, 2), _a_chunk_missing],
    ids=["definition levels (role)", "definition levels (content)", "repetition levels",
         "a chunk missing"],
)  # fmt: skip
def test_a_footer_arrow_cannot_build_is_a_dead_letter(tiny_tokenizer, tmp_path, edit):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(_log_edited(edit))
    good = write_jsonl(tmp_path / "good.jsonl", [chat(i, 1000 * i) for i in range(4)])
    done = kvtrace_child(
        "anonymize", "--input", str(bad), "--input", str(good), "--output", str(tmp_path / "out"),
        "--tokenizer", tiny_tokenizer, "--block-size", "4", "--max-rejected-fraction", "1",
    )  # fmt: skip
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-300:]}"
    letters = read_jsonl(published_letters(tmp_path / "out-rejected"))
    (letter,) = [x for x in letters if x["source"].endswith("bad.parquet")]
    assert letter["error"] == "damaged_file"
    assert letter["lost_bytes"] == bad.stat().st_size
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["records"]["exported"] == 4  # the JSONL's requests, all of them
