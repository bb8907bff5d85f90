"""The audit options the manifest's confirmers name (audit.MANIFEST_CONFIRMERS) are options of
`kvtrace audit`: a setting no row shows is confirmed by a flag the operator can give."""

from __future__ import annotations

import argparse

from kvtrace.cli import _parser
from kvtrace.transforms.stats.audit import MANIFEST_CONFIRMERS


def test_every_option_a_confirmer_names_is_an_audit_option():
    commands = next(
        a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices
    options = set(commands["audit"]._option_string_actions)
    named = {
        confirmer.by
        for confirmers in MANIFEST_CONFIRMERS.values()
        for confirmer in confirmers.values()
        if confirmer.by.startswith("--")
    }
    assert named >= {"--model-name", "--tokenizer", "--id-map"}
    assert named <= options, named - options
