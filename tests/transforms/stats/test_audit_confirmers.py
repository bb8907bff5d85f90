"""Every field a manifest may hold has one confirmer (audit.MANIFEST_CONFIRMERS), whatever its
provenance: walked from the declared schemas (trace_format.MANIFEST_SCHEMAS), so a field the
schema gains without a confirmer fails here, and one the audit meets without a confirmer is
refused (red team round 8: four fields passed confirmed by nothing)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms.stats.audit import (
    MANIFEST_CONFIRMERS,
    RELEASE,
    ROWS,
    START,
    unconfirmed_fields,
)
from kvtrace.transforms.trace_format import (
    CAPTURE_FIELD,
    CAPTURE_MAP_NIGHT,
    CAPTURE_NIGHT,
    CAPTURE_SCHEME,
    KEYED_SCHEME,
    MANIFEST_SCHEMA,
    MANIFEST_SCHEMAS,
    MAP_NIGHT,
    MODEL_NAME,
    NIGHT,
    NIGHT_ORIGIN,
    STREAM_WINDOW,
    TIME_ORIGIN_FIELD,
    capture_manifest,
    manifest_provenance,
    schema_problems,
)

START_AT_ZERO = {"block_ids_from": 0, "sessions_from": 0, "time_from_ms": 0}


def leaf_fields(schema: dict[str, Any], at: str = "") -> set[str]:
    """The paths of a schema's fields: a closed object's keys, walked into; the branches of an
    anyOf, each walked; anything else (a value, an open map such as sha256) one field."""
    if schema.get("additionalProperties") is False:
        return {
            path
            for key, value in schema["properties"].items()
            for path in leaf_fields(value, f"{at}{key}/")
        }
    if "anyOf" in schema:
        return {path for branch in schema["anyOf"] for path in leaf_fields(branch, at)}
    return {at.rstrip("/")}


@pytest.mark.parametrize("provenance", sorted(MANIFEST_SCHEMAS))
def test_every_field_a_provenance_declares_has_exactly_one_confirmer(provenance):
    """The table and the schema name the same fields: none without a confirmer (it would pass
    held against nothing), none confirmed that the schema does not allow (a dead entry)."""
    declared = leaf_fields(MANIFEST_SCHEMAS[provenance])
    assert set(MANIFEST_CONFIRMERS[provenance]) == declared
    for path, confirmer in MANIFEST_CONFIRMERS[provenance].items():
        assert confirmer.by in (RELEASE, ROWS, START) or confirmer.by.startswith("--"), path


def test_the_provenances_are_the_declared_ones_and_each_is_the_union_narrowed():
    assert (
        set(MANIFEST_CONFIRMERS)
        == set(MANIFEST_SCHEMAS)
        == {NIGHT, MAP_NIGHT, STREAM_WINDOW, CAPTURE_NIGHT, CAPTURE_MAP_NIGHT}
    )
    for schema in MANIFEST_SCHEMAS.values():
        assert schema["required"] == MANIFEST_SCHEMA["required"]
        assert set(schema["properties"]) <= set(MANIFEST_SCHEMA["properties"])


def test_settings_no_row_shows_are_confirmed_only_by_the_audits_options():
    """The operator's claims (names, scheme, kwargs, steps) are held against what audit is
    given; the numbering's start against the map's record or the window before."""
    for provenance in MANIFEST_CONFIRMERS:
        by = {path: c.by for path, c in MANIFEST_CONFIRMERS[provenance].items()}
        assert by[MODEL_NAME] == "--model-name"
        assert by["tokenizer/name"] == by["tokenizer/sha256"] == "--tokenizer"
        assert by["chat_template_kwargs"] == "--chat-template-kwargs"
    assert MANIFEST_CONFIRMERS[MAP_NIGHT]["id_map/time_from_ms"].by == "--id-map"
    assert MANIFEST_CONFIRMERS[CAPTURE_MAP_NIGHT]["id_map/block_ids_from"].by == "--id-map"
    assert MANIFEST_CONFIRMERS[CAPTURE_MAP_NIGHT][f"{CAPTURE_FIELD}/format"].by == "--capture"
    assert MANIFEST_CONFIRMERS[STREAM_WINDOW]["id_map/block_ids_from"].by == START
    assert MANIFEST_CONFIRMERS[STREAM_WINDOW]["id_map/time_from_ms"].by == ROWS


def _shape(provenance: str, **fields: Any) -> list[str]:
    """Schema problems of the fields given, read as a manifest of this provenance would be."""
    schema = MANIFEST_SCHEMAS[provenance]
    partial = {"type": "object", "properties": schema["properties"], "additionalProperties": False}
    return schema_problems(fields, partial)


@pytest.mark.parametrize(
    "provenance, fields, allowed",
    [
        (NIGHT, {"id_map": None}, True),
        (NIGHT, {"id_map": None, TIME_ORIGIN_FIELD: NIGHT_ORIGIN}, False),  # no map to count on
        (NIGHT, {"id_map": START_AT_ZERO}, False),
        (MAP_NIGHT, {"id_map": START_AT_ZERO, TIME_ORIGIN_FIELD: NIGHT_ORIGIN}, True),
        (MAP_NIGHT, {"id_map": START_AT_ZERO}, True),  # --time-origin map: the key absent
        (MAP_NIGHT, {"id_map": None}, False),
        (STREAM_WINDOW, {"id_map": START_AT_ZERO}, True),
        (STREAM_WINDOW, {"id_map": START_AT_ZERO, TIME_ORIGIN_FIELD: NIGHT_ORIGIN}, False),
        (STREAM_WINDOW, {"id_map": None}, False),  # a window always says where it begins
        (NIGHT, {CAPTURE_FIELD: capture_manifest("dynamo-request-trace")}, False),  # its own
        (NIGHT, {"hash_scheme": CAPTURE_SCHEME}, False),
        (CAPTURE_NIGHT, {CAPTURE_FIELD: capture_manifest("lmcache-lookup-hashes")}, True),
        (CAPTURE_NIGHT, {CAPTURE_FIELD: "dynamo-request-trace"}, False),  # what the format is
        (
            CAPTURE_NIGHT,  # a format's partial last block is its own, never another's
            {CAPTURE_FIELD: {"format": "lmcache-lookup-hashes", "partial_last_block": "engine"}},
            False,
        ),
        (CAPTURE_NIGHT, {"hash_scheme": CAPTURE_SCHEME, "hash_scheme_keyed": True}, True),
        (CAPTURE_NIGHT, {"hash_scheme": KEYED_SCHEME}, False),  # its keys are no text's
        (CAPTURE_NIGHT, {"hash_scheme_keyed": False}, False),
        (CAPTURE_NIGHT, {CAPTURE_FIELD: {"format": "x", "partial_last_block": "engine"}}, False),
        (CAPTURE_NIGHT, {"chat_template_kwargs": {"enable_thinking": False}}, False),  # no text
        (CAPTURE_NIGHT, {"tokenizer": {"name": "Qwen/Qwen3-8B", "sha256": {}}}, False),
        (CAPTURE_NIGHT, {"id_map": START_AT_ZERO}, False),
        (CAPTURE_NIGHT, {TIME_ORIGIN_FIELD: NIGHT_ORIGIN}, False),  # no map to count on
        (CAPTURE_MAP_NIGHT, {"id_map": START_AT_ZERO, TIME_ORIGIN_FIELD: NIGHT_ORIGIN}, True),
        (CAPTURE_MAP_NIGHT, {"id_map": None}, False),
        (CAPTURE_MAP_NIGHT, {"hash_scheme": KEYED_SCHEME}, False),
        (CAPTURE_MAP_NIGHT, {"tokenizer": {"name": "Qwen/Qwen3-8B", "sha256": {}}}, False),
    ],
)
def test_each_provenance_holds_exactly_what_its_writer_writes(provenance, fields, allowed):
    assert (_shape(provenance, **fields) == []) == allowed


def test_a_night_is_audited_by_its_id_map_and_a_window_by_where_it_was_found():
    assert manifest_provenance({"id_map": None}, stream_window=False) == NIGHT
    assert manifest_provenance({"id_map": START_AT_ZERO}, stream_window=False) == MAP_NIGHT
    assert manifest_provenance({"id_map": None}, stream_window=True) == STREAM_WINDOW
    assert manifest_provenance("not an object", stream_window=False) == MAP_NIGHT
    capture = {"id_map": None, CAPTURE_FIELD: "dynamo-request-trace"}
    assert manifest_provenance(capture, stream_window=False) == CAPTURE_NIGHT
    mapped = capture | {"id_map": START_AT_ZERO}
    assert manifest_provenance(mapped, stream_window=False) == CAPTURE_MAP_NIGHT
    assert manifest_provenance(capture, stream_window=True) == STREAM_WINDOW  # which refuses it


def test_a_manifest_of_declared_fields_only_is_all_confirmed():
    manifest = {
        "kvtrace_version": "1.0",
        "granularity": {"timestamp_ms": 1, "output_length": 1},
        "records": {"exported": 3},
        "tokenizer": {"name": None, "sha256": {}},
        "chat_template_kwargs": {},
        "id_map": START_AT_ZERO,
        TIME_ORIGIN_FIELD: NIGHT_ORIGIN,
    }
    assert unconfirmed_fields(manifest, MANIFEST_CONFIRMERS[MAP_NIGHT]) == []
    assert unconfirmed_fields(manifest, MANIFEST_CONFIRMERS[STREAM_WINDOW]) == [TIME_ORIGIN_FIELD]
    assert unconfirmed_fields({"id_map": None}, MANIFEST_CONFIRMERS[NIGHT]) == []


@given(
    key=st.text(min_size=1, max_size=12).filter(lambda k: "/" not in k),
    under=st.sampled_from(["", "granularity", "records", "tokenizer", "id_map"]),
    value=st.one_of(st.none(), st.integers(), st.text(max_size=8), st.just({})),
)
def test_any_field_outside_the_table_is_reported_where_it_is(key, under, value):
    """Wherever a field the table does not name sits (beside kvtrace's, or inside one of its
    objects), the walk reports its path, and nothing else."""
    confirmers = MANIFEST_CONFIRMERS[MAP_NIGHT]
    inside = {"timestamp_ms": 1} if under == "granularity" else {}
    manifest = {"block_size": 4, **({under: {**inside, key: value}} if under else {key: value})}
    path = f"{under}/{key}" if under else key
    expected = [] if path in confirmers else [path]
    assert unconfirmed_fields(manifest, confirmers) == expected
