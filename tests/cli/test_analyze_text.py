"""analyze's text names each input by its file name, shown as every name is: one printable text
per name (two files never read as one), never the operator's folders."""

from __future__ import annotations

import os

from kvtrace.commands.analyze_text import input_name


def test_each_input_is_named_by_its_own_printable_text():
    undecodable = os.fsdecode(b"/logs/in\xff.jsonl")
    spelled = "/logs/in\\xff.jsonl"  # a name whose own text is an escape
    names = {input_name(undecodable), input_name(spelled), input_name("/logs/in\n.jsonl")}
    assert len(names) == 3
    assert all(name.isprintable() and "logs" not in name for name in names)
