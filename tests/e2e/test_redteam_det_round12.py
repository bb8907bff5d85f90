"""Red team round 12, determinism: reproducers of output that depends on the file split, the
record order or the engine for the same input and configuration. Each test asserts the promised
behaviour and fails today (issue 33)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import SALT, anonymize, chat, write_jsonl
from kvtrace.cli import main

pytestmark = pytest.mark.slow

DAY0_MS = 1_700_000_000_000


def _salt(tmp_path: Path) -> Path:
    salt = tmp_path / "salt"
    salt.write_text(SALT)
    return salt


def test_calibrate_joins_the_measured_file_by_shard_not_by_argument_order(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: same input and config give byte-identical output whatever the file split or
    order (read/measured.py: the measured file keys each row by 'the trace shard
    numbered S'). `calibrate` reads the night's shards in the order they are named and joins the
    measured file by that position (pipelines/calibrate.trace_measured: `trace.file_index`), not
    by the shard number each file's name carries: the same night and measured file, its shards
    named last-first, give each request another request's cached tokens and another fit. The
    trace is the same (calibrate replays it in time order); only the private join moved.
    Fixed by construction: the measured file names its output (its manifest's sha256) and is
    read only with that whole output, its shards in their order, so no order of the files named
    can move the join."""
    from kvtrace.transforms.write import shards

    # Two published minutes, one shard each (MAX_BLOCKS_PER_SHARD is 8 M blocks in production).
    monkeypatch.setattr(shards, "MAX_BLOCKS_PER_SHARD", 8)
    records = []
    for i in range(4):
        record = chat(i, DAY0_MS + 60_000 * i)
        cached = {"prompt_tokens_details": {"cached_tokens": 4 * i}, "completion_tokens": 2}
        record["response"] = {"usage": cached}
        del record["output_length"]
        records.append(record)
    log = write_jsonl(tmp_path / "log.jsonl", records)
    night = tmp_path / "night"
    salt = str(_salt(tmp_path))
    assert anonymize(tiny_tokenizer, [log], night, "--block-size", "4", "--salt-file", salt) == 0
    named = sorted(night.glob("trace-*.jsonl"))
    assert len(named) > 1
    (measured,) = (tmp_path / "night-rejected").glob("measured-*.jsonl")
    reports = []
    for name, given in (("folder", [night]), ("shards", named)):
        report = tmp_path / f"{name}.json"
        args = ["calibrate", *map(str, given), "--measured", str(measured), "--json", str(report)]
        assert main(args) == 0
        reports.append(json.loads(report.read_text())["policies"])
    assert reports[0] == reports[1]
    # Named in another order, the shards are refused in one line: never joined by position.
    assert main(["calibrate", *map(str, named[::-1]), "--measured", str(measured)]) == 2


def _dynamo_end(hashes: list[int], key_id: str | None) -> dict:
    """A Dynamo request_end of two blocks at DAY0_MS, its hashes keyed under key_id (None: the
    router's unkeyed chain)."""
    replay: dict = {"trace_block_size": 4, "input_length": 8, "input_sequence_hashes": hashes}
    if key_id is not None:
        replay.update(hash_algorithm="blake3-keyed-chain64-v1", hash_key_id=key_id)
    return {
        "schema": "dynamo.request.trace.v1",
        "event_type": "request_end",
        "event_time_unix_ms": DAY0_MS + 25,
        "request": {"output_tokens": 3, "request_received_ms": DAY0_MS, "replay": replay},
    }


def test_captures_alike_but_for_their_hash_scheme_publish_what_the_gate_passes(tmp_path):
    """Promise (docs/ORDERING.md): the tie-break fingerprint covers everything a row's ids are
    made of, so ids are numbered first-seen in the one row order and the night kvtrace writes
    passes `kvtrace audit`. A capture's fingerprint (encode/captures.hash_capture) covers its
    raw hashes but not their scheme, while its block keys are re-keyed over the scheme: two
    requests of one published time and lengths whose engine logged the same hashes under two
    schemes (a fleet keying its trace and one not, or a key rotated inside a granule) tie on
    the fingerprint yet hold different ids, numbered in the keys' order, not the rows'. The
    night publishes (exit 0) and its own audit flags it not publishable."""
    log = write_jsonl(
        tmp_path / "trace.jsonl",
        [_dynamo_end([7, 8], None), _dynamo_end([7, 8], "k0"), _dynamo_end([7, 9], "j0")],
    )
    night = str(tmp_path / "night")
    args = ["anonymize", "--capture", "dynamo-request-trace", "--block-size", "4"]
    args += ["--input", str(log), "--output", night, "--salt-file", str(_salt(tmp_path))]
    assert main([*args, "--quiet"]) == 0
    assert main(["audit", night, "--capture", "dynamo-request-trace"]) == 0


def test_lookups_whose_hashes_and_request_ids_run_together_publish_what_the_gate_passes(tmp_path):
    """The same promise, a second variant of the fingerprint's gap: an LMCache lookup's
    fingerprint hashes its hex hashes joined by NUL and then its tail (request id, time,
    length) with no separator between them, so a lookup of hash 0x1 for request "ax" and one
    of hash 0x1a for request "x" feed it the same bytes. They tie on it, hold different ids,
    and the night kvtrace publishes is flagged by its own audit (a fix adding the scheme alone
    leaves this one: the fingerprint wants an unambiguous encoding of the whole capture)."""
    lookups = [
        {"timestamp": DAY0_MS / 1000, "request_id": request, "chunk_size": 4, "seq_len": 5}
        | {"chunk_hashes": [digest]}
        for request, digest in (("ax", "0x1"), ("x", "0x1a"))
    ]
    log = write_jsonl(tmp_path / "lookups.jsonl", lookups)
    night = str(tmp_path / "night")
    args = ["anonymize", "--capture", "lmcache-lookup-hashes", "--block-size", "4"]
    args += ["--input", str(log), "--output", night, "--salt-file", str(_salt(tmp_path))]
    assert main([*args, "--quiet"]) == 0
    assert main(["audit", night, "--capture", "lmcache-lookup-hashes"]) == 0
