"""Red team round 8 against the publication gate (`kvtrace audit`): what the fields new since
round 6 (model_name, time_origin, a stream's windows) let through. Each test asserts the promised
behaviour (the gate accepts only what kvtrace writes for the run, no byte of private text).
All four passed fields confirmed by nothing; each now has one confirmer in a manifest schema
closed per provenance (audit.MANIFEST_CONFIRMERS, tests/transforms/stats/test_audit_confirmers.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from kvtrace.transforms.stats import audit as gate
from kvtrace.transforms.trace_format import (
    MANIFEST,
    STATS,
    TraceColumns,
    canonical_json,
    jsonl_bytes,
    parquet_bytes,
    shard_name,
    window_name,
)
from kvtrace.transforms.write.manifest import KVTRACE_VERSION, replay_contract, set_content_times
from kvtrace.transforms.write.publish import sha256_of
from kvtrace.transforms.write.replayers import replay_commands
from kvtrace.transforms.write.totals import ExportTotals, export_stats

pytestmark = [pytest.mark.slow, pytest.mark.beam]
BLOCK = 4


def write_night(folder: Path) -> Path:
    """A night as anonymize publishes it, written with kvtrace's own writers (no CLI in this
    folder, tests/test_layout.py): three rows at block size 4, two sessions."""

    def ints(*values: int) -> np.ndarray:
        return np.array(values, dtype=np.int64)

    columns = TraceColumns(
        timestamp=ints(0, 1000, 2000),
        input_length=ints(8, 12, 5),
        output_length=ints(3, 2, 4),
        num_ids=ints(2, 3, 2),
        ids=ints(0, 1, 0, 1, 2, 3, 4),
        session=ints(0, 0, 1),
        response_ms=ints(-1, -1, -1),
    )
    folder.mkdir()
    files = {
        shard_name(0, 1, ".jsonl"): jsonl_bytes(columns),
        shard_name(0, 1, ".parquet"): parquet_bytes(columns),
        STATS: canonical_json(export_stats(ExportTotals(3, 25, 9, 7), 5, 17)),
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    names = sorted(files)
    manifest = {
        "block_size": BLOCK,
        "chat_template_kwargs": {},
        "files": names,
        "format": "mooncake-trace",
        "granularity": {"output_length": 1, "timestamp_ms": 1},
        "hash_scheme": gate.KEYED_SCHEME,
        "hash_scheme_keyed": True,
        "id_map": None,
        "kvtrace_version": KVTRACE_VERSION,
        "output_hash_ids": False,
        "records": {"exported": 3},
        "replay": replay_commands(BLOCK, 3, names),
        "sha256": {name: sha256_of(data) for name, data in files.items()},
        "tokenizer": {"name": None, "sha256": {}},
        **replay_contract(),
    }
    (folder / MANIFEST).write_bytes(canonical_json(manifest))
    set_content_times(str(folder))
    return folder


@pytest.fixture
def night(tmp_path) -> Path:
    folder = write_night(tmp_path / "night")
    report = gate.audit(str(folder))
    assert report["publishable"], report["flags"]
    return folder


def edit_manifest(folder: Path, change) -> None:
    manifest = json.loads((folder / MANIFEST).read_text())
    change(manifest)
    (folder / MANIFEST).write_bytes(canonical_json(manifest))
    set_content_times(str(folder))


def test_model_name_carries_free_text_the_gate_never_confirms(night, tmp_path):
    """The manifest's model_name (anonymize --model-name) is held only to a hub-name *shape*
    (trace_format.MODEL_NAME_SCHEMA: [A-Za-z0-9._-]{1,96}, twice): up to 193 characters, ~1,150
    bits, of any words spelled without spaces. Every other setting the rows do not prove
    (tokenizer, hash_scheme, chat_template_kwargs, block size, granularity) is refused unless
    the audit is given it as the run was, or is one of a closed set of values; model_name is
    checked against nothing (audit has no --model-name; _check_settings ignores it), so a
    manifest edited after the run to hold a patient's name and diagnosis passes as kvtrace's.
    (tests/e2e/test_model_name_cli.py only tries a name with spaces.)"""
    folder = tmp_path / "out"
    shutil.copytree(night, folder)
    secret = "Patient-John.Smith-born-1961-04-02-HIV-positive/ward-7.bed-3.SSN-078-05-1120"
    edit_manifest(folder, lambda m: m.update(model_name=secret))
    report = gate.audit(str(folder))
    assert not report["publishable"], "free text in model_name passed the gate unconfirmed"


def one_window_stream(night: Path, tmp_path: Path) -> Path:
    """The night as a stream's one window, with the cumulative.json the driver writes (as
    tests/e2e/test_audit_stream_totals_cli.stream_of builds it)."""
    from kvtrace.pipelines.anonymize_config import AnonymizeConfig
    from kvtrace.pipelines.anonymize_streaming import Progress, StreamingConfig, write_cumulative
    from kvtrace.transforms.encode.salt import SaltSource

    job = AnonymizeConfig(
        inputs=(),
        output=str(tmp_path / "stream"),
        staging=str(tmp_path / "staging"),
        tokenizer="x",
        salt=SaltSource("env", "KVTRACE_SALT"),
        dead_letter=str(tmp_path / "stream-rejected"),
        block_size=4,
    )
    window = shutil.copytree(night, tmp_path / "stream" / window_name(0))
    edit_manifest(
        window,
        lambda m: m.update(id_map={"block_ids_from": 0, "sessions_from": 0, "time_from_ms": 0}),
    )
    stats = json.loads((night / STATS).read_text())
    write_cumulative(
        StreamingConfig(job, "pubsub:projects/p/subscriptions/s", 60_000),
        Progress(
            next_id={"blocks": stats["unique_blocks"], "sessions": 2},
            origin_ms=0,
            published_ms=0,
            windows=1,
            rows=3,
            rejected=0,
        ),
    )
    return tmp_path / "stream"


def test_a_stream_windows_time_from_ms_is_free_under_the_night_origin(night, tmp_path):
    """A stream's window begins where the window before it ended: _check_numbering_start
    compares only begins[:2] (block ids, sessions) with the audited window before, never
    id_map.time_from_ms; _audit binds time_from_ms to the first row only when the rows count
    from the map (from_map), and a manifest that says time_origin "night" (which the stream
    never writes: it has no id map) lifts that too. So a stream's window carries any number
    below 2^40 in time_from_ms (here "Alice" as 40 bits; an absolute epoch in ms up to 2004
    fits too), and the gate calls the stream publishable."""
    stream = one_window_stream(night, tmp_path)
    assert gate.audit(str(stream))["publishable"]
    window = stream / window_name(0)

    def hide(manifest: dict) -> None:
        manifest["id_map"]["time_from_ms"] = int.from_bytes(b"Alice", "big")
        manifest["time_origin"] = "night"

    edit_manifest(window, hide)
    set_content_times(str(stream))
    report = gate.audit(str(stream))
    assert not report["publishable"], "40 free bits in a window's time_from_ms passed"


def test_time_origin_night_beside_no_id_map_passes(night, tmp_path):
    """anonymize writes time_origin only for a night of an id map (anonymize_night.
    counts_from_night: --time-origin night without --id-map is refused), but the schema holds
    it optional everywhere and the gate reads it only to pick the first row's time
    (_audit's from_map): beside id_map null it is checked against nothing, a key kvtrace never
    writes there, and a manifest that tells its readers the rows count from a night's own start
    on a map that does not exist."""
    folder = tmp_path / "out"
    shutil.copytree(night, folder)
    edit_manifest(folder, lambda m: m.update(time_origin="night"))
    report = gate.audit(str(folder))
    assert not report["publishable"], "time_origin without an id_map passed"


def test_a_tokenizer_name_the_run_did_not_use_passes_unconfirmed(night, tmp_path):
    """Settings no row shows are refused unless confirmed: a hash scheme other than the keyed
    default without --hash-scheme, any chat_template_kwargs without --chat-template-kwargs
    (even one boolean switch: _check_template_kwargs), block sizes and steps outside the round
    ones. The tokenizer is the exception: without --tokenizer, _check_tokenizer returns at once,
    so a manifest edited to name any pinned tokenizer (null or one of three: 2 bits, and a false
    claim of the model the night was tokenized for) passes."""
    from kvtrace.transforms.trace_format import PUBLISHED_TOKENIZERS

    folder = tmp_path / "out"
    shutil.copytree(night, folder)
    named = {"name": "Qwen/Qwen3-8B", "sha256": PUBLISHED_TOKENIZERS["Qwen/Qwen3-8B"][0]}
    edit_manifest(folder, lambda m: m.update(tokenizer=named))
    report = gate.audit(str(folder))
    assert not report["publishable"], "a tokenizer name no option confirms passed"
