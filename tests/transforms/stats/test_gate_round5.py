"""The gate's mechanisms behind the fixes of red team round 5 (test_gate_redteam_round5.py,
tests/e2e/test_redteam_privacy_round5.py), each tested where it decides."""

from __future__ import annotations

import numpy as np
import pytest

from kvtrace.transforms.stats.audit import _Rows
from kvtrace.transforms.trace_format import OUTPUT_IDS_FIELD, OUTPUT_LENGTH_FIELD, TraceColumns


def _one_row(input_length: int, output_length: int, block_size: int) -> TraceColumns:
    blocks = -(-input_length // block_size)
    return TraceColumns(*(np.array([v], np.int64) for v in (0, input_length, output_length,
                                                              blocks)),
                        np.arange(blocks, dtype=np.int64), np.array([-1]), np.array([-1]))


@pytest.mark.parametrize("input_length, length_step, passes", [
    (5, 1, True),  # no granularity: exact, as hash_ids need
    (5, 16, False),  # exact beside coarse output lengths: the next turn gives the reply back
    (8, 16, True),  # the last block's fill rounded up to 16, capped at the block size
    (6, 2, True), (5, 2, False)])
def test_input_lengths_pass_only_as_coarse_as_the_declared_length_granularity(
        input_length, length_step, passes):
    manifest = {"block_size": 4, OUTPUT_IDS_FIELD: False, "id_map": None,
                "granularity": {"timestamp_ms": 1, OUTPUT_LENGTH_FIELD: length_step}}
    rows = _Rows()
    rows.add(_one_row(input_length, length_step * 2, 4), manifest)
    finer = [p for p in rows.problems if p.startswith("input lengths finer")]
    assert bool(finer) != passes, rows.problems
