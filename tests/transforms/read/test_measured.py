"""The private measured file: written and read in one form; anything else is one line naming
where."""

from __future__ import annotations

import numpy as np
import pytest

from kvtrace.transforms.errors import ConfigError
from kvtrace.transforms.read.measured import NOT_MEASURED, measured_bytes, read_measured


def test_rows_read_back_by_shard_and_row_and_absent_rows_are_not_measured(tmp_path):
    path = tmp_path / "m.jsonl"
    first = measured_bytes(0, np.array([NOT_MEASURED, 48]))
    second = measured_bytes(1, np.array([0, NOT_MEASURED, 16]))
    assert measured_bytes(2, np.array([NOT_MEASURED])) is None
    path.write_bytes(first + second)
    assert read_measured(str(path), [2, 3]).tolist() == [NOT_MEASURED, 48, 0, NOT_MEASURED, 16]


@pytest.mark.parametrize(
    "text, said",
    [
        (b'{"shard": 0, "row": 9, "cached_tokens": 1}\n', "not a row of these 1 trace file"),
        (b'{"shard": 1, "row": 0, "cached_tokens": 1}\n', "not a row of these 1 trace file"),
        (b'{"shard": 0, "row": 1, "cached_tokens": 1}\n' * 2, "given twice"),
        (b'{"shard": 0, "row": 1, "cached_tokens": "1"}\n', "cached_tokens is not a count"),
        (b'{"shard": 0, "row": 1.0, "cached_tokens": 1}\n', "row is not an index"),
        (b'{"shard": 0, "row": 1, "cached_tokens": 1, "t": "x"}\n', "exactly shard, row, cached"),
        (b"[1, 2]\n", "exactly shard, row, cached_tokens"),
        (b"{nope\n", "not JSON"),
        (b'{"shard": 0, "row": 1, "cached_tokens": 1' + b" " * 100 + b"}\n", "longer than"),
    ],
)
def test_anything_else_is_refused_naming_its_line(tmp_path, text, said):
    path = tmp_path / "m.jsonl"
    path.write_bytes(text)
    with pytest.raises(ConfigError, match=said) as refused:
        read_measured(str(path), [3])
    assert "line" in str(refused.value) and "\n" not in str(refused.value)


def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="No such file"):
        read_measured(str(tmp_path / "none.jsonl"), [1])
