"""Red team round 22, the gate's publishing side: reproducers of what anonymize publishes and
`kvtrace audit` refuses, or what the audit passes that kvtrace never writes. Each asserts the
promised behaviour, so each fails until it is fixed."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from helpers import anonymize, chat, write_jsonl
from kvtrace.cli import main

pytestmark = pytest.mark.slow

# The kernel's POSIX ACL attribute (version 2, then (tag, perm, id) entries): user::rwx,
# user:1000:rwx, group::r-x, mask::rwx, other::r-x, as `setfacl -d -m u:1000:rwx` leaves on a
# team's shared folder.
UNDEFINED = 0xFFFFFFFF
DEFAULT_ACL = struct.pack("<I", 2) + b"".join(
    struct.pack("<HHI", *entry)
    for entry in (
        (0x01, 7, UNDEFINED),
        (0x02, 7, 1000),
        (0x04, 5, UNDEFINED),
        (0x10, 7, UNDEFINED),
        (0x20, 5, UNDEFINED),
    )
)


def _audited(folder: Path, tokenizer: str, capsys, *options: str) -> tuple[int, list[str]]:
    """audit's exit code and flags on folder, given the run's own options."""
    report = folder.parent / f"{folder.name}.audit.json"
    code = main(["audit", str(folder), "--tokenizer", tokenizer, "--json", str(report), *options])
    capsys.readouterr()
    return code, json.loads(report.read_text())["flags"]


def _shared_folder(parent: Path, how: str) -> None:
    """parent made as a team's shared folder is: setgid to a group of the team (new entries
    take its group), or with a default ACL (new entries take an access ACL from it)."""
    if how == "setgid":
        others = [g for g in os.getgroups() if g != os.getegid()]
        group = others[0] if others else (1 if os.geteuid() == 0 else None)
        if group is None:
            pytest.skip("no second group to make a shared folder's")
        os.chown(parent, -1, group)
        os.chmod(parent, 0o2775)
    else:
        try:
            os.setxattr(parent, "system.posix_acl_default", DEFAULT_ACL)
        except OSError:
            pytest.skip("no POSIX ACLs on this file system")


@pytest.mark.xfail(strict=True, reason="red team round 22")
@pytest.mark.parametrize("how", ["setgid", "default-acl"])
def test_a_night_written_into_a_teams_shared_folder_is_publishable(
    tiny_tokenizer, tmp_path, capsys, how
):
    """What anonymize publishes, the audit passes (AUDIT.md: "passes only what kvtrace itself
    writes"; the brief: a false refusal of kvtrace's own output). A team's shared folder is
    setgid (chmod g+s: every new entry takes the folder's group) or carries a default ACL
    (setfacl -d): both are made to be inherited, and kvtrace's writer inherits them. Under a
    setgid parent the night's folder is the team's group (publish's chmod 0755 clears the setgid
    bit, so its files are then the user's group); under a default ACL every entry carries a
    system.posix_acl_access attribute. anonymize exits 0, and the audit, given the run's own
    options, refuses every such night ("owners kvtrace does not set", "extended attributes
    kvtrace does not set"): a nightly that gates on the audit never publishes. (An inheritable
    inode flag, chattr +d or +A on the parent, is the same cause.) Promised: anonymize refuses
    such an output before the work, in one line, or writes entries the audit passes."""
    parent = tmp_path / "shared"
    parent.mkdir()
    _shared_folder(parent, how)
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(6)])
    out = parent / "out"
    code = anonymize(tiny_tokenizer, [src], out, "--block-size", "4", "--quiet")
    capsys.readouterr()
    if code != 0:
        assert not out.exists()
        return
    assert _audited(out, tiny_tokenizer, capsys, "--block-size", "4") == (0, [])
