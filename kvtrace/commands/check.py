"""The checking commands of `kvtrace`: validate (a trace's consistency) and audit (what an output
folder exposes)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from kvtrace.commands.common import (
    TRACE_HELP,
    BeamFlags,
    json_flag,
    no_beam_options,
    plan_trace_command,
    write_json_report,
)
from kvtrace.transforms.encode.schemes import SCHEMES
from kvtrace.transforms.errors import ConfigError
from kvtrace.transforms.trace_format import CAPTURE_FORMATS, MANIFEST, OUTPUT_LENGTH_FIELD
from kvtrace.transforms.write.coarsen import SLOWEST_TOKEN_MS


def add_parsers(commands: Any) -> None:
    validate = commands.add_parser(
        "validate",
        help="check a trace before a benchmark: JSON and types, hash_ids lengths, "
        "id chaining, timestamps, the block size it was made with",
        description=(
            "The consistency checks of a Mooncake trace: every line a JSON object of the right "
            "types; len(hash_ids) == ceil(input_length / block_size); every id always at the "
            "same position behind the same parent; timestamps non-negative and in order; and "
            "the block size inferred from the rows compared with the one declared (--block-size "
            "or the manifest.json beside the trace), the trap of ids replayed at another block "
            "size. Exit code 0 when valid, 1 when not."
        ),
    )
    add = validate.add_argument
    add("trace", nargs="+", metavar="TRACE", help=TRACE_HELP)
    add(
        "--block-size",
        type=int,
        metavar="N",
        help="the block size the trace declares (default: its manifest.json; else none, and "
        "the lengths are checked at the best-fitting block size)",
    )
    add("--json", metavar="OUT", help="also write the report as JSON")
    add("--verbose", action="store_true", help=argparse.SUPPRESS)


def validate(args: argparse.Namespace, beam_args: BeamFlags) -> int:
    from kvtrace.transforms.read.trace_inputs import declared_block_size, trace_files
    from kvtrace.transforms.read.trace_io import read_trace
    from kvtrace.transforms.stats.validate import report_text
    from kvtrace.transforms.stats.validate import validate as check

    no_beam_options(beam_args)
    if args.block_size is not None and args.block_size < 1:
        raise ConfigError("--block-size must be >= 1")
    files = trace_files(args.trace)
    plan_trace_command(args, files)
    # --block-size against a manifest that declares another is refused, as every reader does
    declared = declared_block_size(files, args.block_size)
    by = "--block-size" if args.block_size is not None else MANIFEST
    report = check(read_trace(files), declared, by if declared else "")
    print(report_text(report, files))
    write_json_report(args.json, report)
    return 0 if report["valid"] else 1


def add_audit_parser(commands: Any) -> None:
    audit = commands.add_parser(
        "audit",
        help="a privacy report on an output folder before it is published",
        description=(
            "The gate before a folder leaves: it passes only what kvtrace itself publishes "
            "(manifest.json in kvtrace's own words, stats.json, trace shards with exactly the "
            "trace's integer fields, the manifest listing every file with its sha256) and flags "
            "everything else: other, hidden or compressed files, subfolders, strings, extra "
            "fields, hash-sized integers, ids that are not dense. It also reports what the rows "
            "expose: timestamp granularity, rows an outsider could single out, sessions. Exit "
            "code 0: publishable; 1: something flagged; 2: the audit could not run."
        ),
    )
    add = audit.add_argument
    add("output", metavar="DIR", help="a kvtrace output folder (or one trace file)")
    add("--json", metavar="OUT", help="also write the report as JSON")
    add(
        "--tokenizer",
        metavar="TOK",
        help="the tokenizer the run used (folder, hub name or pkg:PACKAGE): the manifest's "
        "tokenizer must be what anonymize publishes for its files (a name only with the files "
        "kvtrace pins for it; without it, only a manifest that names none passes)",
    )
    add(
        "--model-name",
        metavar="NAME",
        help="as the run was given (anonymize --model-name): the manifest's model_name must be "
        "it (without it, only a manifest that names none passes)",
    )
    add(
        "--capture",
        choices=CAPTURE_FORMATS,
        help="as the run was given (anonymize --capture): a night read from engine hash "
        "captures names its format, checked against it (without it, only a night read from "
        "text passes)",
    )
    add(
        "--id-map",
        metavar="MAP",
        help="the id map a night extended (anonymize --id-map): where the manifest says its "
        "numbering began is checked against the map's versions (needs the run's salt); "
        "such a night audited without it is flagged",
    )
    add(
        "--chat-template-kwargs",
        metavar="JSON",
        help="as the run was given: the manifest's kwargs digests are checked against them "
        "(needs the run's salt); a manifest with any digest audited without it is flagged",
    )
    for option, what, note in (
        ("--block-size", "N", ""),
        (
            "--timestamp-granularity-ms",
            "MS",
            f"; a run given only --length-granularity N used its floor, N x {SLOWEST_TOKEN_MS} ms",
        ),
        ("--length-granularity", "N", ""),
    ):
        add(
            option,
            type=int,
            metavar=what,
            help=f"as the run was given{note}: the manifest's must equal it (without it, only "
            "round values pass: powers of two, 10^k ms, minutes, hours, days)",
        )
    add(
        "--window-ms",
        type=int,
        metavar="MS",
        help="a stream's output folder: its --window as the run was given, in ms (without it, "
        "only round values pass)",
    )
    add(
        "--salt-file",
        metavar="PATH",
        help="with --id-map or --chat-template-kwargs: the salt the runs used",
    )
    add(
        "--salt-secret",
        metavar="VERSION",
        help="with --id-map or --chat-template-kwargs: the salt the runs used",
    )
    add(
        "--hash-scheme",
        choices=SCHEMES,
        help="as the run was given: the manifest's must be it (default: only the keyed kvtrace "
        "scheme passes)",
    )
    add("--vllm-hash-seed", metavar="S", help="vllm-sha256-cbor outputs: as the run was given")
    add("--vllm-none-hash", metavar="HEX", help="vllm-sha256-cbor outputs: as the run was given")
    add("--verbose", action="store_true", help=argparse.SUPPRESS)


def _run_salt(args: argparse.Namespace, kwargs: dict | None) -> bytes | None:
    """The salt the runs used, for --id-map and for --chat-template-kwargs the manifest keys by
    it (write/manifest.template_kwargs_keyed, as anonymize requires it); None when neither
    needs it."""
    from kvtrace.transforms.encode.salt import SALT_ENV, salt_source
    from kvtrace.transforms.write.manifest import template_kwargs_keyed

    if not args.id_map and kwargs is None:
        if args.salt_file or args.salt_secret:
            raise ConfigError(
                "--salt-file and --salt-secret go with --id-map or --chat-template-kwargs"
            )
        return None
    salt = salt_source(args.salt_file, args.salt_secret)
    if salt.persistent:
        return salt.load()
    if args.id_map or template_kwargs_keyed(kwargs or {}):
        raise ConfigError(
            f"--id-map and keyed --chat-template-kwargs need the salt the runs used: "
            f"--salt-file, --salt-secret or ${SALT_ENV}"
        )
    return None


def _template_kwargs(args: argparse.Namespace) -> dict | None:
    """--chat-template-kwargs as the run was given them."""
    if args.chat_template_kwargs is None:
        return None
    kwargs = json_flag("--chat-template-kwargs", args.chat_template_kwargs)
    if not isinstance(kwargs, dict):
        raise ConfigError("--chat-template-kwargs: a JSON object, as the run was given")
    return kwargs


def _audited_scheme(args: argparse.Namespace) -> str | None:
    """The identity of the hash scheme the run was given (--hash-scheme, the vllm flags alone
    naming vllm-sha256-cbor), or None when none was given."""
    from kvtrace.commands.anonymize import _hash_scheme

    vllm = args.vllm_hash_seed is not None or args.vllm_none_hash is not None
    if args.hash_scheme is None and not vllm:
        return None
    return _hash_scheme(
        {
            "hash_scheme": args.hash_scheme or "vllm-sha256-cbor",
            "vllm_hash_seed": args.vllm_hash_seed,
            "vllm_none_hash": args.vllm_none_hash,
        }
    ).identity


def audit(args: argparse.Namespace, beam_args: BeamFlags) -> int:
    from kvtrace.transforms.stats.audit import audit as measure
    from kvtrace.transforms.stats.audit import map_numbering, report_text
    from kvtrace.transforms.storage import is_url
    from kvtrace.transforms.write.manifest import public_template_kwargs
    from kvtrace.transforms.write.publish import Location, plan_locations

    no_beam_options(beam_args)
    target = args.output
    if not is_url(target) and not os.path.exists(target):
        raise ConfigError(f"{target}: no such folder or file")
    if not is_url(target) and os.path.isdir(target) and not os.access(target, os.R_OK | os.X_OK):
        raise ConfigError(f"{target}: not readable")
    # A local tokenizer (its folder: nothing is written inside it) is read as well.
    tokenizer = [args.tokenizer] if args.tokenizer and os.path.lexists(args.tokenizer) else []
    reads = [target, *(path for path in (args.id_map, args.salt_file) if path), *tokenizer]
    plan_locations(reads, [Location("--json", args.json or "")])
    scheme = _audited_scheme(args)
    kwargs = _template_kwargs(args)
    salt = _run_salt(args, kwargs)
    numbering = map_numbering(args.id_map.rstrip("/"), salt) if args.id_map else None
    settings = {
        key: value
        for key, value in (
            ("block_size", args.block_size),
            ("timestamp_ms", args.timestamp_granularity_ms),
            (OUTPUT_LENGTH_FIELD, args.length_granularity),
            ("window_ms", args.window_ms),
        )
        if value is not None
    }
    published_kwargs = None if kwargs is None else public_template_kwargs(kwargs, salt)
    report = measure(
        target,
        args.tokenizer,
        scheme,
        numbering,
        published_kwargs,
        settings,
        args.model_name,
        args.capture,
    )
    print(report_text(report, target))
    write_json_report(args.json, report)
    return 0 if report["publishable"] else 1
