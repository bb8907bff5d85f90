"""Red team round 2 against the publication gate (`kvtrace audit`): variants that slip past the
round-1 fixes. Each test builds a folder carrying something kvtrace would not write, recomputing
every digest and statistic with kvtrace's own serializers, and asserts the gate refuses it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import anonymize, write_jsonl
from test_gate_redteam import SECRET, _columns, _copy, _manifest, _night, _republish, _with

from transforms.stats.audit import audit

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def outputs(tiny_tokenizer, tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("redgate2")
    night = write_jsonl(tmp / "night.jsonl", _night(12))
    made = {}
    for name, extra in {"plain": ()}.items():
        assert anonymize(tiny_tokenizer, [night], tmp / name, "--block-size", "4", *extra) == 0
        assert audit(str(tmp / name))["publishable"]
        made[name] = tmp / name
    return made


def _refused(folder: Path) -> list[str]:
    report = audit(str(folder))
    assert not report["publishable"], "the gate accepted it: " + json.dumps(report["flags"])
    return report["flags"]


@pytest.mark.xfail(strict=True, reason="red team round 2")
def test_ids_extend_map_flag_reopens_absolute_time_sessions_and_ids(outputs, tmp_path):
    """A night of its own (no --id-map) republished with ids_extend_map: true. That one bit,
    which nothing in the folder can contradict, switches off the round-1 fixes: the first row
    at time 0, sessions and block ids numbered 0, 1, 2 in first-seen order, dense ids. So the
    log's epoch seconds (as ms), a session holding 5 bytes of text and block ids relabelled to
    carry text all pass."""
    folder = _copy(outputs["plain"], tmp_path)
    columns = _columns(folder)
    word = int.from_bytes(SECRET, "big")
    session = np.where(columns.session >= 0, columns.session + word, columns.session)
    _republish(folder, _with(columns, timestamp=columns.timestamp + 1_700_000_000,
                             session=session, ids=columns.ids + word),
               ids_extend_map=True)
    _refused(folder)
