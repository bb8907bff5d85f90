"""kvtrace audit, round 3's mechanisms from the operator's side: a stream's folder audited whole
(each window's start checked against the window the audit passed before it), the run's
settings and template kwargs given as the run was, SELinux labels by their shape.

The unit tests; the whole CLI runs are in tests/e2e/test_audit_round3_cli.py."""

from __future__ import annotations

import pytest

from kvtrace.transforms.stats import audit as gate


@pytest.mark.parametrize(
    "label, valid",
    [
        (b"system_u:object_r:user_tmp_t:s0\x00", True),
        (b"unconfined_u:object_r:user_home_t:s0:c0.c1023", True),
        (b"patient jane doe, dob 1980-01-01", False),
        (b"a:b:c:" + b"x" * 40, False),
    ],
)
def test_selinux_labels_are_contexts_by_shape(label, valid):
    assert bool(gate.SELINUX_CONTEXT.fullmatch(label)) is valid
