"""audit.report_text shows every line through one escaping: whatever a folder names (files,
subfolders, a row's fields) reaches the terminal as one line of printable text, and names that
differ are shown differently."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms.stats import audit as gate

FORGED = "x\n\x1b[1A\x1b[2Kverdict: publishable\x1b[8m"


def _refused(flags: list[str], where: str = "out") -> dict:
    """A folder's report (as audit makes one) that flags these."""
    return {
        "rows": 0,
        "files": [],
        "fields": {},
        "largest_integers": {},
        "hash_ids": gate.id_report(np.empty(0, np.int64)),
        "timestamps": {"granularity_ms": None},
        "singled_out": {},
        "sessions": {"sessions": 0, "rows_with_session": 0, "max_rows_per_session": 0},
        "manifest": None,
        "flags": flags,
        "publishable": not flags,
    }


def test_a_flag_quoting_a_forged_name_is_one_printable_line():
    report = _refused([f"a file kvtrace does not publish: {FORGED}"])
    text = gate.report_text(report, "out")
    assert all(line.isprintable() for line in text.splitlines())
    assert text.splitlines()[-1].startswith("verdict: NOT publishable")
    assert "a file kvtrace does not publish: x\\u000a\\u001b[1A" in text


def test_a_stream_report_escapes_its_windows_lines_once():
    window = _refused([f"a subfolder: {FORGED}"])
    stream = {"windows": {"window-000000": window}, "flags": [FORGED], "publishable": False}
    lines = gate.report_text(stream, "s").splitlines()
    assert all(line.isprintable() for line in lines)
    assert sum(line.startswith("verdict:") for line in lines) == 1  # the window's own
    assert lines[-1].startswith("stream verdict: NOT publishable")


@given(st.text())
def test_any_text_is_shown_as_one_line_of_printable_text(text):
    assert gate._shown(text).isprintable()


def test_characters_a_terminal_acts_on_are_shown_apart_from_a_names_bytes():
    # A line feed, a carriage return, NEL (U+0085), the byte 0x85 of a name that is not UTF-8
    # (os.fsdecode's surrogate), a right-to-left override: five different texts.
    names = ["a\nb", "a\rb", "a\x85b", "a\udc85b", "a\u202eb"]
    shown = [gate._shown(name) for name in names]
    assert len(set(shown)) == len(names), shown


def test_the_manifests_rounding_reads_as_words_not_a_dict():
    report = {
        **_refused([]),
        "manifest": {
            "hash_scheme": "xxh3-128-chained-salted-v1",
            "granularity": {"output_length": 16, "timestamp_ms": 1000},
        },
    }
    (line,) = [line for line in gate.report_text(report, "out").splitlines() if "manifest:" in line]
    assert line.endswith("granularity timestamps 1,000 ms, output lengths 16"), line
    assert "{" not in line
