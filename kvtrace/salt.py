"""The secret salt that keys every block hash.

The dense ids in a trace do not depend on it; it matters where hashes are kept (the id map of
nightly exports) and must then be the same every night and kept out of the published output.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

SALT_ENV = "KVTRACE_SALT"
MIN_SALT_BYTES = 16  # below 128 bits a salt could be guessed


class SaltError(ValueError):
    pass


def load_salt(salt_file: str | None) -> tuple[bytes, str]:
    """(salt, where it came from): --salt-file, else $KVTRACE_SALT, else random for this run."""
    if salt_file:
        try:
            salt = Path(salt_file).read_bytes().strip()
        except OSError as err:
            raise SaltError(f"--salt-file {salt_file}: {err.strerror}") from None
        origin = f"--salt-file {salt_file}"
    elif os.environ.get(SALT_ENV):
        salt, origin = os.environ[SALT_ENV].encode(), f"${SALT_ENV}"
    else:
        return secrets.token_bytes(32), "random (this run only)"
    if len(salt) < MIN_SALT_BYTES:
        raise SaltError(f"the salt from {origin} is {len(salt)} bytes; use at least {MIN_SALT_BYTES}")
    return salt, origin
