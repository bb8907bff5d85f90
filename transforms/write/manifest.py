"""The export's summary files: stats.json and manifest.json, written last.

manifest.json is written after every trace file, so its presence marks a complete export.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvtrace.transforms import storage
from kvtrace.transforms.dead_letters import NEVER_SERVED
from kvtrace.transforms.encode.captures import BLOCK_SIZE_MISMATCH
from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.trace_format import (
    HIT_RATE_DEFINITIONS,
    HIT_RATES_FIELD,
    IDS_FIELD,
    KNOWN_TEMPLATE_KWARGS,
    KWARG_DIGEST_PREFIX,
    MANIFEST,
    MANIFEST_SCHEMA,
    MODEL_NAME,
    MODEL_NAME_SCHEMA,
    PUBLISHED_TOKENIZERS,
    REPLAY_IDS,
    canonical_json,
    parse_json,
    schema_problems,
)
from kvtrace.transforms.write.coarsen import round_to


def _installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvtrace")
    except PackageNotFoundError:  # running from a checkout that is not installed
        return "0.0.0+unknown"


KVTRACE_VERSION = _installed_version()  # what every manifest records, and --version prints


@dataclass(frozen=True)
class RecordCounts:
    read: int
    rejected: int
    # Input bytes that became no record (dead_letters.DeadLetter.lost_bytes: a damaged file's
    # rest, a file or line refused unread, every record's letter: read/records.line_weight),
    # and all input bytes as stored: one letter may stand for many records' bytes.
    lost_bytes: int = 0
    input_bytes: int = 0
    # (reason, count) of the rejected records, commonest first: the operator's summary says them.
    reasons: tuple[tuple[str, int], ...] = ()
    input_files: int = 0  # the files read (expanded --input): said when none held a record
    unserved_bytes: int = 0  # the part of lost_bytes of records the engine never served

    def rejected_fraction(self) -> float:
        """The larger of the records rejected and the input bytes lost, at most all of them (a
        compressed file's lost lines weigh their share of its decoded bytes, placed in stored
        bytes by the whole file's share, each rounded up: what one line compressed to depends
        on its neighbours and order, its decoded bytes do not; --max-rejected-fraction 1 is
        no bound), among the records the engine served: a gateway's cache hit is none of its
        input lost (dead_letters.NEVER_SERVED), so neither it nor its bytes count on either
        side."""
        unserved = sum(count for reason, count in self.reasons if reason in NEVER_SERVED)
        served, refused = self.read - unserved, self.rejected - unserved
        records = refused / served if served > 0 else 0.0
        weighed = self.input_bytes - self.unserved_bytes
        lost = self.lost_bytes - self.unserved_bytes
        return max(records, min(lost / weighed, 1.0) if weighed > 0 else 0.0)


def check_rejected_fraction(
    counts: RecordCounts, max_fraction: float | None, reasons: dict[str, int] | None = None
) -> RecordCounts:
    """Fail the job, before any trace file is written, when more than max_fraction of the input
    was rejected, or all of it, or none was read (nothing to publish either way: a night exports
    a record or publishes nothing); None turns the gate off (a stream's window must not stop the
    stream). The one-line message names the commonest dead-letter reasons
    (reasons: reason -> count) and the input shape kvtrace reads, said for the commonest one."""
    if max_fraction is None:
        return counts
    mismatched = (reasons or {}).get(BLOCK_SIZE_MISMATCH, 0)
    if mismatched:  # never invent blocks: a capture is published at its own block size or not
        raise JobStopped(
            f"{mismatched} engine capture records were cut at another block size than "
            f"--block-size, and kvtrace never re-cuts an engine's blocks: rerun with "
            f"--block-size set to the capture's (Dynamo: trace_block_size)"
        )
    if counts.read == 0 and counts.rejected == 0:  # a quiet night's empty log: no row to prove
        raise JobStopped(
            f"no records read from --input ({counts.input_files} "
            f"file{'' if counts.input_files == 1 else 's'}, {counts.input_bytes} "
            f"byte{'' if counts.input_bytes == 1 else 's'}): "
            f"nothing to publish"
        )
    every = counts.rejected >= counts.read  # not one record exported
    if counts.rejected_fraction() <= max_fraction and not every:
        return counts
    top = sorted((reasons or {}).items(), key=lambda item: (-item[1], item[0]))[:3]
    shape_hints = {  # what the commonest reason says about the whole file's shape
        "invalid_json": "kvtrace reads one JSON object per line (JSONL), not a JSON array or "
        "pretty-printed JSON: rewrite it with jq -c '.[]' (an array) or jq -c .",
        "no_input": "each line needs messages (or input, prompt, input_ids) at its top level, "
        "or under an OpenAI Batch line's body",
        "unjoined_batch": "an OpenAI Batch input file has no times and its output file no "
        "requests: give both to one run, which joins their lines by custom_id "
        "(docs/ANONYMIZE.md)",
        "missing_timestamp": "each line needs a timestamp (or created) field: epoch s, ms, us, "
        "ns or ISO 8601",
    }
    shape_hints["not_an_object"] = shape_hints["invalid_json"]
    hint = shape_hints.get(
        top[0][0] if top else "",
        "each record (a JSON line or a Parquet row) needs messages (or prompt) and a timestamp; "
        "the dead letters say why each was refused",
    )
    reasons_said = ", ".join(f"{reason} {count}" for reason, count in top) or "none recorded"
    lost = (
        f", {counts.lost_bytes} of {counts.input_bytes} input bytes became no record"
        if counts.lost_bytes
        else ""
    )
    verdict = (
        "every record rejected: nothing to publish"
        if every
        else f"{counts.rejected_fraction():.1%} > --max-rejected-fraction {max_fraction}"
    )
    raise JobStopped(
        f"too much input rejected: {counts.rejected} of {counts.read} records"
        f"{lost} ({verdict}); top reasons: {reasons_said}; {hint}"
    )


def check_not_before_origin(
    counts: RecordCounts, earliest_ms: int | None, origin_ms: int | None
) -> RecordCounts:
    """Fail the job, before any trace file is written, when requests precede the id map's
    timestamp origin: their timestamps would come out negative."""
    if origin_ms is not None and earliest_ms is not None and earliest_ms < origin_ms:
        raise JobStopped(
            f"the earliest request ({earliest_ms} ms) precedes the id "
            f"map's timestamp origin ({origin_ms} ms, the first request the map ever saw). A map "
            f"extends forward in time; anonymize earlier logs with a new map."
        )
    return counts


def id_map_start(
    next_ids: dict[str, int] | None,
    earliest_ms: int | None,
    origin_ms: int,
    timestamp_granularity_ms: int,
) -> dict[str, int] | None:
    """Where a night that extends an id map (or a stream's earlier windows) begins: its first
    new block id and session, and its first row's time (the map's clock, rounded as the rows'
    are); None for a night of its own, which begins at 0, 0, 0. The gate checks the rows
    against it and it against the map (audit --id-map)."""
    if next_ids is None:
        return None
    first = (origin_ms if earliest_ms is None else earliest_ms) - origin_ms
    return {
        "block_ids_from": next_ids["blocks"],
        "sessions_from": next_ids["sessions"],
        "time_from_ms": int(round_to(np.int64(first), timestamp_granularity_ms)),
    }


def trace_origin_ms(configured_ms: int | None, earliest_ms: int | None) -> int:
    """The published timestamps' zero: the id map's origin when it has one, else the earliest
    request's timestamp (0 for an empty trace)."""
    if configured_ms is not None:
        return configured_ms
    return 0 if earliest_ms is None else earliest_ms


def public_tokenizer(name: str, files_sha256: Mapping[str, str]) -> dict[str, Any]:
    """The manifest's tokenizer, for anonymize and the gate alike: a name kvtrace publishes
    (PUBLISHED_TOKENIZERS) with its files' digests when the files kvtrace loaded are exactly
    ones pinned for it, else no name and no digests. The name alone is not the tokenizer: a hub
    cache's snapshot or a folder of that name may hold an edited template (a default system
    prompt naming a ward or a patient), whose plain digest would confirm a guess of it and
    serves no outsider, who cannot fetch the files."""
    files = dict(sorted(files_sha256.items()))
    if files not in PUBLISHED_TOKENIZERS.get(name, ()):
        return {"name": None, "sha256": {}}
    return {"name": name, "sha256": files}


def model_name_problems(name: str) -> list[str]:
    """Why the manifest could not publish this model name as the gate reads it, checked before
    the work with the gate's own schema: a run never ends with a manifest its gate refuses."""
    schema = {"type": "object", "properties": {MODEL_NAME: MODEL_NAME_SCHEMA}}
    return schema_problems({MODEL_NAME: name}, schema)


def replay_contract() -> dict[str, dict[str, Any]]:
    """What a consumer must know to replay a night right beside its block size and hash scheme:
    the ids' scope and width, and the definition each published hit rate follows
    (trace_format's closed vocabulary; the same for every night of this release)."""
    return {IDS_FIELD: dict(REPLAY_IDS), HIT_RATES_FIELD: dict(HIT_RATE_DEFINITIONS)}


def public_model_name(name: str | None) -> dict[str, str]:
    """The manifest's model name: the publisher's claim (anonymize --model-name), kept only
    when given; the tokenizer's name is kvtrace's, from pinned files (public_tokenizer)."""
    return {} if name is None else {MODEL_NAME: name}


def public_template_kwargs(value: dict[str, Any], salt: bytes | None) -> dict[str, Any]:
    """Chat template kwargs as the manifest may hold them, a closed shape: booleans and nulls as
    they are (enable_thinking: false), names kvtrace knows as they are, every other name and
    value (a string, a number, an array or object whole) one HMAC of its canonical JSON keyed by
    the run's salt, so no structure carries bits of its own (round 5: text spelled as nested
    booleans). Equal settings stay comparable under one salt (an id map's nights), and no one
    without the salt can confirm a guessed value (a plain sha256 of "alice" would be a
    dictionary lookup away). Kwargs that key nothing (template_kwargs_keyed) need no salt."""
    if salt is None and template_kwargs_keyed(value):
        raise ValueError("these chat template kwargs are published keyed by the run's salt")
    key = hashlib.sha256(b"kvtrace-template-kwargs\0" + (salt or b"")).digest()

    def keyed(item: Any) -> str:
        text = json.dumps(item, sort_keys=True, separators=(",", ":"))  # ASCII: escapes all
        return KWARG_DIGEST_PREFIX + hmac.new(key, text.encode(), hashlib.sha256).hexdigest()

    return {
        name if _name_as_is(name) else keyed(name): item if _value_as_is(item) else keyed(item)
        for name, item in value.items()
    }


def _name_as_is(name: str) -> bool:
    return name in KNOWN_TEMPLATE_KWARGS


def _value_as_is(item: Any) -> bool:
    return item is None or isinstance(item, bool)


def template_kwargs_keyed(value: dict[str, Any]) -> bool:
    """Whether the manifest publishes any of these kwargs keyed by the run's salt (a name kvtrace
    does not know, a value no boolean or null): then only the run's salt confirms them, so a run
    that publishes them needs a persistent salt, and so does the gate that checks them."""
    return not all(_name_as_is(name) and _value_as_is(item) for name, item in value.items())


def template_kwargs_problems(value: dict[str, Any]) -> list[str]:
    """Why the manifest could not publish these kwargs as the gate reads them (a value that is
    not JSON, as a YAML preset's date; too many names; a switch that is no boolean), checked
    before the work: a run never ends with a manifest its own gate refuses. Any salt gives the
    published shape."""
    try:  # JSON, and the same value read back (a YAML key 1 would come back as "1")
        if json.loads(json.dumps(value, allow_nan=False)) != value:
            raise ValueError("a name that is not a string")
    except (TypeError, ValueError, RecursionError) as err:
        return [f"chat_template_kwargs: not JSON ({str(err)[:80]})"]
    public = {"chat_template_kwargs": public_template_kwargs(value, bytes(32))}
    schema = {
        "type": "object",
        "properties": {
            "chat_template_kwargs": MANIFEST_SCHEMA["properties"]["chat_template_kwargs"]
        },
    }
    return schema_problems(public, schema)


# A run's counts no published row proves (records read and rejected, damaged files, bytes lost,
# requests without an output length or with a message the template left out): the operator's,
# kept beside the run's dead letters while it runs, for the CLI's summary; never published.
RUN_COUNTS = "run-counts.json"


def run_counts(counts: RecordCounts, totals: Any, damaged_files: int) -> dict[str, Any]:
    """The run's own counts (totals: write/totals.ExportTotals)."""
    return {
        "read": counts.read,
        "exported": totals.requests,
        "rejected": counts.rejected,
        "damaged_files": damaged_files,
        "lost_bytes": counts.lost_bytes,
        "without_output_length": totals.requests_without_output_length,
        "with_unrendered_messages": totals.requests_with_unrendered_messages,
        # [reason, count] pairs, commonest first: a JSON object's keys would be sorted by name.
        "rejected_by_reason": [list(pair) for pair in counts.reasons],
    }


def write_run_counts(letters_staging: str, counts: dict[str, Any]) -> None:
    with storage.create(storage.join(letters_staging, RUN_COUNTS), private=True) as handle:
        handle.write(canonical_json(counts))


def read_run_counts(letters_staging: str) -> dict[str, Any]:
    with storage.open_read(storage.join(letters_staging, RUN_COUNTS)) as handle:
        return parse_json(handle.read())


def manifest_path(directory: str) -> str:
    return storage.join(directory, MANIFEST)


def write_json(path: str, payload: dict) -> None:
    with storage.create(path) as handle:
        handle.write(canonical_json(payload))


# Every published file's mtime is derived from its content (the folder's from its files'), so
# the time a copy keeps (rsync -t, cp -p, tar) carries nothing but the content: whole seconds
# from a fixed base plus three bytes of the sha256, different for different content (rsync's
# size-and-time quick check then never skips a changed file) and the same on every run.
CONTENT_TIME_BASE = 946_684_800  # 2000-01-01T00:00:00Z
CONTENT_TIME_BYTES = 3  # up to ~194 days past the base


def content_time(sha256_hex: str) -> int:
    """The mtime (whole seconds) of a published file whose sha256 is sha256_hex."""
    return CONTENT_TIME_BASE + int(sha256_hex[: 2 * CONTENT_TIME_BYTES], 16)


def folder_content_time(file_sha256: dict[str, str]) -> int:
    """The mtime of a published folder: its files' names and digests, in name order. Names
    are taken as the bytes they are (os.fsencode: a name not UTF-8 is a name like any other,
    never an error); a UTF-8 name's bytes are its text's."""
    listing = b"".join(
        os.fsencode(name) + b"\0" + digest.encode() + b"\n"
        for name, digest in sorted(file_sha256.items(), key=lambda item: os.fsencode(item[0]))
    )
    return content_time(hashlib.sha256(listing).hexdigest())


def set_content_time(path: str) -> str:
    """Stamp a local published file with its content time; its sha256, which gives it."""
    with open(path, "rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    stamp = content_time(digest)
    os.utime(path, (stamp, stamp), follow_symlinks=False)
    return digest


def set_content_times(folder: str) -> None:
    """Stamp a local folder's files and the folder with their content times (object stores keep
    no settable mtime)."""
    if storage.is_url(folder):
        return
    digests = {
        entry.name: set_content_time(entry.path)
        for entry in os.scandir(folder)
        if entry.is_file(follow_symlinks=False)
    }
    stamp = folder_content_time(digests)
    os.utime(folder, (stamp, stamp))
