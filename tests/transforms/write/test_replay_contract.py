"""What a manifest tells a consumer to replay a trace right (issue 37.4): the ids' scope and
width and the definition of each published hit rate, a closed vocabulary
(trace_format.REPLAY_IDS, HIT_RATE_DEFINITIONS) that the gate accepts exactly."""

from __future__ import annotations

import pytest

from kvtrace.transforms.stats.audit import (
    Given,
    _confirm_replay_contract,
    _Confirming,
    _Gate,
    _Rows,
)
from kvtrace.transforms.synth.derived import Derivation, derived_manifest
from kvtrace.transforms.trace_format import (
    DERIVED_MANIFEST_SCHEMA,
    HIT_RATES_FIELD,
    IDS_FIELD,
    MANIFEST_SCHEMA,
    MANIFEST_SCHEMAS,
    MAX_PUBLISHED_INT,
    schema_problems,
)
from kvtrace.transforms.write.manifest import replay_contract
from kvtrace.transforms.write.totals import ExportTotals, export_stats

KEYS = (IDS_FIELD, HIT_RATES_FIELD)


def problems(contract: dict) -> list[str]:
    schema = {
        "type": "object",
        "properties": {key: MANIFEST_SCHEMA["properties"][key] for key in KEYS},
    }
    return schema_problems(contract, schema)


def test_the_contract_is_required_of_every_night_and_passes_its_schema():
    contract = replay_contract()
    assert contract[IDS_FIELD] == {"scope": "global", "width_bits": 40}
    assert MAX_PUBLISHED_INT == 1 << contract[IDS_FIELD]["width_bits"]
    assert problems(contract) == []
    for schema in MANIFEST_SCHEMAS.values():
        assert set(KEYS) <= set(schema["required"])


@pytest.mark.parametrize(
    "key, value",
    [
        (IDS_FIELD, {"scope": "session", "width_bits": 40}),  # ids numbered once: global
        (IDS_FIELD, {"scope": "global", "width_bits": 32}),
        (IDS_FIELD, {"scope": "global"}),
        (IDS_FIELD, {"scope": "global", "width_bits": 40, "note": "x"}),
        (HIT_RATES_FIELD, {"token_weighted": "infinite-causal-prefix-blocks"}),
        (HIT_RATES_FIELD, {**replay_contract()[HIT_RATES_FIELD], "cache_hit_rate": "mean"}),
    ],
)
def test_any_other_value_is_refused_by_the_schema_and_flagged_by_its_confirmer(key, value):
    contract = {**replay_contract(), key: value}
    assert problems(contract)
    gate = _Gate()
    _confirm_replay_contract(_Confirming(".", [], contract, _Rows(), Given(), None, gate))
    assert gate.flags == ["manifest.json: ids or hit_rates are not what this release writes"]


def test_each_definition_names_a_hit_rate_stats_json_publishes():
    stats = export_stats(ExportTotals(requests=1, input_tokens=4, blocks=1), 1, 4)
    assert set(replay_contract()[HIT_RATES_FIELD]) == set(stats["hit_rates"])


def test_a_derived_manifest_says_its_ids_scope_and_one_of_an_earlier_release_still_reads():
    manifest = derived_manifest(
        5, "b" * 64, 16, Derivation("synthesize", "mooncake-trace", "a" * 64)
    )
    assert manifest[IDS_FIELD] == {"scope": "global"}
    earlier = {k: v for k, v in manifest.items() if k != IDS_FIELD}
    assert schema_problems(earlier, DERIVED_MANIFEST_SCHEMA) == []
    assert schema_problems({**manifest, IDS_FIELD: {"scope": "session"}}, DERIVED_MANIFEST_SCHEMA)
