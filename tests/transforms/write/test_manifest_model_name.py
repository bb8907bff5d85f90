"""The manifest's model_name: the publisher's claim, checked by the gate's own schema."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms.trace_format import MANIFEST_SCHEMA, MODEL_NAME, schema_problems
from kvtrace.transforms.write.manifest import model_name_problems, public_model_name


@pytest.mark.parametrize(
    "name", ["Qwen/Qwen3-8B", "deepseek-ai/DeepSeek-R1", "llama-3.1-8b", "a" * 96 + "/" + "b" * 96]
)
def test_hub_names_are_published(name):
    assert model_name_problems(name) == [] and public_model_name(name) == {MODEL_NAME: name}


@pytest.mark.parametrize(
    "name",
    ["", "a/b/c", "/abs", "../x", "x y", "Qwen3\n", "modèle", "-x", "a" * 97, "ward 7: J. Smith"],
)
def test_anything_else_is_refused(name):
    assert model_name_problems(name)


def test_the_field_is_absent_unless_given_and_the_gate_reads_it_so():
    assert public_model_name(None) == {}
    schema = MANIFEST_SCHEMA["properties"][MODEL_NAME]
    assert MODEL_NAME not in MANIFEST_SCHEMA["required"] and schema["type"] == "string"


@given(st.text(max_size=40))
def test_the_writers_check_is_the_gates(name):
    gate = {"type": "object", "properties": {MODEL_NAME: MANIFEST_SCHEMA["properties"][MODEL_NAME]}}
    assert bool(model_name_problems(name)) == bool(schema_problems({MODEL_NAME: name}, gate))
