"""The id map a run extends, opened before anything heavy starts: checked against the run's
settings (id_map.open_map), and repaired of what killed runs left (a commit half done, segments
no version will list, temp files of dead writers). One run per map at a time. No Beam here:
a local run with --id-map never imports it."""

from __future__ import annotations

import logging
import os

from kvtrace.transforms import storage
from kvtrace.transforms.encode.salt import SALT_ENV, SaltError, SaltSource
from kvtrace.transforms.ids import anchor
from kvtrace.transforms.ids.exclusive import remove_stale_temp_files
from kvtrace.transforms.ids.id_map import (
    CURRENT_FILE,
    VERSION_FILES,
    MapIdentity,
    MapVersion,
    check_listed_files,
    discard_abandoned,
    finish_interrupted_commit,
    open_map,
    record_reader,
)
from kvtrace.transforms.ids.map_record import map_key

_LOG = logging.getLogger("kvtrace")


def open_repaired_map(
    directory: str, identity: MapIdentity, salt: SaltSource, marks: str
) -> MapVersion:
    """The map's current version (version 0 for a new map, made by its first write), once
    it is found to be this run's (identity, and the key the salt derives), the one its place
    and mark in the folder of marks name (anchor.check_anchor, checked again at the commit),
    and what killed runs left is rolled forward or cleared. Raises SaltError for a salt that
    changes between runs."""
    if not salt.persistent:
        raise SaltError(
            f"--id-map needs the same salt every run: give --salt-file, --salt-secret or "
            f"${SALT_ENV} (keep it in a secret manager: docs/NIGHTLY.md)"
        )
    key = map_key(salt.load())
    base = open_map(directory, identity, key)
    # Before any write: a map deleted from a place bound to it is refused with nothing made.
    anchor.check_anchor(marks, directory, base.version, base.map_id, record_reader(directory), key)
    # Nor is a map missing what its version lists, whichever shards the night reads.
    check_listed_files(directory, base)
    # A new map is made by the run's first write into it (id_map.map_folder): a run refused
    # before it leaves nothing. An existing one is repaired.
    if storage.is_url(directory) or os.path.lexists(directory):
        storage.make_folder(directory, private=True)
        finish_interrupted_commit(directory, base)
        discarded = discard_abandoned(directory, base, key) + [
            name
            for folder, replaced in (
                (directory, CURRENT_FILE),
                (storage.join(directory, "versions"), VERSION_FILES),
            )
            for name in remove_stale_temp_files(folder, replaced)
        ]
        if discarded:
            _LOG.info("id map: removed %d file(s) left by an interrupted run", len(discarded))
    _LOG.info(
        "id map %s: version %d, %d block ids, %d session ids",
        directory,
        base.version,
        base.next_id["blocks"],
        base.next_id["sessions"],
    )
    return base
