"""The secret salt that keys every block hash, and where workers fetch it from.

The dense ids in a trace do not depend on the salt; it matters where hashes are kept (the id map
of nightly exports), which is why a map needs the same salt every night. A SaltSource names where
the salt lives, not the salt itself: workers fetch it in their own setup, so a salt kept in a
file, an environment variable or a secret manager never enters the pipeline graph that Dataflow
or Flink stage. Only a random per-run salt travels inline: it protects nothing after the run.

Every worker fetches the salt again, so the source may hand it another (a file rotated under a
running stream, a Kubernetes Secret updated, $KVTRACE_SALT another on a worker pool): the
launcher pins the source to its salt's public fingerprint (pinned), and every later load refuses
a salt whose fingerprint differs, as checked_tokenizer refuses files not the run's.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field, replace

from kvtrace.transforms.encode.blocks import salt_fingerprint
from kvtrace.transforms.errors import JobStopped

# A salt is a short secret; a file far larger is a mistake (a log, a device) read for nothing.
MAX_SALT_BYTES = 1 << 16

SALT_ENV = "KVTRACE_SALT"
MIN_SALT_BYTES = 16  # below 128 bits a salt could be guessed


class SaltError(ValueError):
    pass


@dataclass(frozen=True)
class SaltSource:
    """kind "file": a path Beam's filesystems open (local, gs://, s3://); "env": an environment
    variable on every worker; "gcp-secret": a Secret Manager version; "random": inline, per run.
    fingerprint: the run's salt's (blocks.salt_fingerprint, public), once pinned; "" before."""

    kind: str
    where: str = ""
    inline: bytes = field(default=b"", repr=False)
    fingerprint: str = ""

    def describe(self) -> str:
        return {
            "file": f"--salt-file {self.where}",
            "env": f"${self.where}",
            "gcp-secret": f"--salt-secret {self.where}",
            "random": "random (this run only)",
        }[self.kind]

    @property
    def persistent(self) -> bool:
        """Whether another run can use the same salt (an id map needs that)."""
        return self.kind != "random"

    def load(self) -> bytes:
        """The salt; once pinned, only the run's: another is a refusal (JobStopped: a night's
        step makes it its verdict, a stream stops in one line) before it keys any hash."""
        salt = self._fetch()
        if len(salt) < MIN_SALT_BYTES:
            raise SaltError(
                f"the salt from {self.describe()} is {len(salt)} bytes; use at least {MIN_SALT_BYTES}"
            )
        if self.fingerprint and salt_fingerprint(salt) != self.fingerprint:
            raise JobStopped(
                f"the salt from {self.describe()} is not the one this run began with "
                f"(fingerprint {salt_fingerprint(salt)}, the run's {self.fingerprint}): changed "
                f"since, or another on this worker; its hashes would renumber every prefix"
            )
        return salt

    def pinned(self) -> SaltSource:
        """This source bound to the salt it holds now (the launcher's load): where the run's
        workers load it again, only that salt is taken."""
        return replace(self, fingerprint=salt_fingerprint(self.load()))

    def _fetch(self) -> bytes:
        """The salt as this source holds it, normalised alike whatever holds it (normalised)."""
        return self.inline if self.kind == "random" else normalised(self._raw())

    def _raw(self) -> bytes:
        """The source's bytes as they are: a variable's too (os.environb), as a file's, so a
        salt of random bytes is not taken for text."""
        if self.kind == "env":
            value = os.environb.get(os.fsencode(self.where))
            if not value:
                raise SaltError(f"${self.where} is not set on this machine (or is empty)")
            return value
        if self.kind == "file":
            from kvtrace.transforms import storage
            from kvtrace.transforms.storage import is_url

            if (
                not is_url(self.where)
                and os.path.exists(self.where)
                and not os.path.isfile(self.where)
            ):
                raise SaltError(f"--salt-file {self.where}: not a regular file")
            try:
                with storage.open_read(self.where) as handle:
                    salt = handle.read(MAX_SALT_BYTES + 1)
            except Exception as err:  # Beam raises its own IO errors for remote paths
                raise SaltError(f"--salt-file {self.where}: cannot read it ({err})") from None
            if len(salt) > MAX_SALT_BYTES:
                raise SaltError(
                    f"--salt-file {self.where}: over {MAX_SALT_BYTES} bytes; a salt "
                    f"is a short secret (32 random bytes are plenty)"
                )
            return salt
        if self.kind == "gcp-secret":
            from apache_beam.transforms.util import GcpSecret

            try:
                return GcpSecret(self.where).get_secret_bytes()
            except Exception as err:
                raise SaltError(f"--salt-secret {self.where}: cannot read it ({err})") from None
        raise SaltError(f"unknown salt source {self.kind!r}")


def normalised(raw: bytes) -> bytes:
    """A salt as every source gives it: its bytes without surrounding ASCII whitespace, the
    newline a file (`... | base64 > salt`), a Secret made from it or a variable set from it
    ends in, so one secret is one salt however it is given."""
    return raw.strip()


def salt_source(salt_file: str | None = None, salt_secret: str | None = None) -> SaltSource:
    """--salt-file, else --salt-secret, else $KVTRACE_SALT when set, else a random salt."""
    if salt_file and salt_secret:
        raise SaltError("give one of --salt-file and --salt-secret, not both")
    if salt_file:
        return SaltSource("file", salt_file)
    if salt_secret:
        return SaltSource("gcp-secret", salt_secret)
    if os.environb.get(os.fsencode(SALT_ENV)):
        return SaltSource("env", SALT_ENV)
    return SaltSource("random", inline=secrets.token_bytes(32))
