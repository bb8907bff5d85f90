"""The private measured file: written and read in one form; anything else is one line naming
where."""

from __future__ import annotations

import pytest

from kvtrace.transforms.errors import ConfigError
from kvtrace.transforms.read.measured import NOT_MEASURED, measured_line, read_measured


def test_rows_read_back_by_index_and_absent_rows_are_not_measured(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(measured_line(2, 48) + measured_line(0, 0))
    assert read_measured(str(path), 4).tolist() == [0, NOT_MEASURED, 48, NOT_MEASURED]


@pytest.mark.parametrize(
    "text, said",
    [
        (b'{"row": 9, "cached_tokens": 1}\n', "the trace has 3 rows"),
        (b'{"row": 1, "cached_tokens": 1}\n{"row": 1, "cached_tokens": 2}\n', "given twice"),
        (b'{"row": 1, "cached_tokens": "1"}\n', "cached_tokens is not a count"),
        (b'{"row": 1.0, "cached_tokens": 1}\n', "row is not a row index"),
        (b'{"row": 1, "cached_tokens": 1, "text": "x"}\n', "exactly row, cached_tokens"),
        (b"[1, 2]\n", "exactly row, cached_tokens"),
        (b"{nope\n", "not JSON"),
        (b'{"row": 1, "cached_tokens": 1' + b" " * 100 + b"}\n", "longer than"),
    ],
)
def test_anything_else_is_refused_naming_its_line(tmp_path, text, said):
    path = tmp_path / "m.jsonl"
    path.write_bytes(text)
    with pytest.raises(ConfigError, match=said) as refused:
        read_measured(str(path), 3)
    assert "line" in str(refused.value) and "\n" not in str(refused.value)
