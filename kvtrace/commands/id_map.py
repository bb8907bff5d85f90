"""The `kvtrace id-map` command group: maintenance of a persisted id map (anonymize --id-map)."""

from __future__ import annotations

import argparse
from typing import Any

from kvtrace.commands.common import BeamFlags, local_reads, no_beam_options
from kvtrace.transforms.encode.salt import SALT_ENV, SaltError

UPGRADE_HELP = "key a map written before keying (format 3) and anchor its newest version"
REBIND_HELP = "bind the map's place to the map found there, on purpose"


def add_parsers(commands: Any) -> None:
    group = commands.add_parser(
        "id-map",
        help="maintain a persisted id map (anonymize --id-map)",
        description="Maintenance of a persisted id map. Nights extend a map themselves; these "
        "actions are run on purpose, by whoever holds the map's salt.",
    )
    actions = group.add_subparsers(dest="id_map_action", required=True, metavar="ACTION")
    upgrade = actions.add_parser(
        "upgrade",
        help=UPGRADE_HELP,
        description=(
            "Key a map written before keying (format 3: each record carries only a sha256 anyone "
            "can recompute, so nights refuse it) with its salt, once: every record is verified "
            "(its sha256, its fields, the salt's fingerprint) before any is replaced by its keyed "
            "form, the same content; rerun after an interruption, it finishes. Then the map's "
            "newest version is marked in the folder of marks, as a night's commit marks it. "
            "Whoever runs it vouches that the map is unaltered. A keyed map is verified and "
            "anchored, nothing else. docs/ID_MAP.md, 'Format 3 maps'."
        ),
    )
    _salted(upgrade.add_argument)
    rebind = actions.add_parser(
        "rebind",
        help=REBIND_HELP,
        description=(
            "Bind the map's place (its directory, as the folder of marks knows it) to the map "
            "found there now: nights refuse a map found where another was published (a map "
            "replaced, or its versions removed), until this is run on purpose. The map found "
            "is checked against its own mark first, then its version marked (a map whose "
            "folder of marks was lost starts its marks here); with no map there, the place is "
            "freed. "
            "docs/ID_MAP.md, 'Rollback'."
        ),
    )
    _salted(rebind.add_argument)


def _salted(add: Any) -> None:
    """The map and where its salt and marks are: what every action needs."""
    add("map", metavar="MAP", help="the id map's directory (local, gs:// or s3://)")
    add(
        "--salt-file", metavar="PATH", help=f"the map's salt (else --salt-secret, else ${SALT_ENV})"
    )
    add(
        "--salt-secret",
        metavar="VERSION",
        help="the map's salt in Google Secret Manager: projects/P/secrets/S/versions/V",
    )
    add(
        "--id-map-marks",
        metavar="DIR",
        help="the map's folder of marks, as its nights give it (default: SALT_FILE.id-map-marks "
        f"beside --salt-file; required with --salt-secret or ${SALT_ENV})",
    )
    add("--verbose", action="store_true", help=argparse.SUPPRESS)


def run(args: argparse.Namespace, beam_args: BeamFlags) -> int:
    return {"upgrade": upgrade, "rebind": rebind}[args.id_map_action](args, beam_args)


def upgrade(args: argparse.Namespace, beam_args: BeamFlags) -> int:
    from kvtrace.transforms.ids.id_map import upgrade_map

    directory, key, marks = _opened("upgrade", args, beam_args)
    version, keyed = upgrade_map(directory, key, marks)
    done = (
        f"keyed version(s) {', '.join(map(str, keyed))}"
        if keyed
        else "already keyed, nothing rewritten"
    )
    print(f"id map {directory}: {done}; version {version} anchored in {marks}")
    return 0


def rebind(args: argparse.Namespace, beam_args: BeamFlags) -> int:
    from kvtrace.transforms.ids.id_map import rebind_map

    directory, key, marks = _opened("rebind", args, beam_args)
    map_id = rebind_map(directory, key, marks)
    print(
        f"id map {directory}: its place bound to map {map_id}, its version marked, in {marks}"
        if map_id
        else f"id map {directory}: no map with an id there; its place freed in {marks}"
    )
    return 0


def _opened(action: str, args: argparse.Namespace, beam_args: BeamFlags) -> tuple[str, Any, str]:
    """The map's directory, its key and its folder of marks, the locations planned."""
    from kvtrace.transforms.encode.salt import salt_source
    from kvtrace.transforms.ids.anchor import marks_folder
    from kvtrace.transforms.ids.id_map import map_key
    from kvtrace.transforms.storage import folded
    from kvtrace.transforms.write.publish import FOLDER, Location, plan_locations

    no_beam_options(beam_args)
    directory = folded(args.map)
    salt = salt_source(args.salt_file, args.salt_secret)
    if not salt.persistent:
        raise SaltError(
            f"kvtrace id-map {action} needs the map's salt: give --salt-file, "
            f"--salt-secret or ${SALT_ENV}"
        )
    marks = marks_folder(salt, folded(args.id_map_marks) if args.id_map_marks else None)
    plan_locations(
        local_reads(args.salt_file),
        [
            Location("MAP", directory, FOLDER, private=True),
            Location("--id-map-marks", marks, FOLDER, private=True),
        ],
    )
    return directory, map_key(salt.load()), marks
