"""storage.foreign_metadata, the one rule the gate holds every published entry to and a run
its staging folder (inode flags but the file system's own, extended attributes but the SELinux
label, owners), and storage.inherit_nothing, which gives a folder kvtrace makes just that
whatever a team's shared parent passes on (round 22)."""

from __future__ import annotations

import fcntl
import os
import struct

import pytest

from helpers import DEFAULT_ACL
from kvtrace.transforms import storage
from kvtrace.transforms.write.publish import OutputRefused, make_staging

FS_NODUMP_FL = 0x40


def _add_flag(path, flag: int) -> None:
    """Set an inode flag as chattr does, or skip where the file system keeps none."""
    fd = os.open(path, os.O_RDONLY)
    try:
        (flags,) = struct.unpack("l", fcntl.ioctl(fd, storage.FS_IOC_GETFLAGS, b"\0" * 8))
        fcntl.ioctl(fd, storage.FS_IOC_SETFLAGS, struct.pack("l", flags | flag))
    except OSError:
        pytest.skip("this file system keeps no inode flags")
    finally:
        os.close(fd)


def _other_group() -> int:
    others = [g for g in os.getgroups() if g != os.getegid()]
    if others:
        return others[0]
    if os.geteuid() == 0:
        return 1
    pytest.skip("no second group to own a folder by")


def test_a_new_file_and_folder_carry_nothing_foreign(tmp_path):
    (tmp_path / "f").write_bytes(b"1")
    assert storage.foreign_metadata(str(tmp_path / "f"), "x") == []
    assert storage.foreign_metadata(str(tmp_path), "x") == []


def test_a_file_system_without_inode_flags_or_attributes_holds_none():
    if os.stat("/proc/self/status").st_uid != os.geteuid():
        pytest.skip("procfs here is not this user's")
    assert storage.foreign_metadata("/proc/self/status", "x") == []  # ENOTTY: no inode flags


def test_a_flag_the_owner_chose_is_named(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"1")
    _add_flag(path, FS_NODUMP_FL)
    assert storage.foreign_metadata(str(path), "x") == [
        "x: inode flags kvtrace does not set (0x40, as lsattr lists them): clear them "
        "(chattr) or copy into a folder that has none"
    ]


def test_an_attribute_is_named_unless_kept(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"1")
    try:
        os.setxattr(path, "user.note", b"1")
    except OSError:
        pytest.skip("no user extended attributes on this file system")
    assert storage.foreign_metadata(str(path), "x") == [
        "x: extended attributes kvtrace does not set (user.note)"
    ]
    assert storage.foreign_metadata(str(path), "x", kept=frozenset({"user.note"})) == []


def test_another_group_is_named(tmp_path):
    os.chown(tmp_path, -1, _other_group())
    (problem,) = storage.foreign_metadata(str(tmp_path), "x")
    assert problem.startswith("x: owners kvtrace does not set")


@pytest.mark.parametrize("how", ["setgid", "default-acl", "nodump"])
def test_a_private_folder_made_in_a_shared_parent_inherits_nothing(tmp_path, how):
    """A team's shared folder passes its group (setgid), ACL entries (a default ACL) or inode
    flags (chattr +d) on to what is made in it: kvtrace's own folders take none of them, nor
    does what is made inside them."""
    parent = tmp_path / "shared"
    parent.mkdir()
    if how == "setgid":
        os.chown(parent, -1, _other_group())
        os.chmod(parent, 0o2775)
    elif how == "default-acl":
        try:
            os.setxattr(parent, "system.posix_acl_default", DEFAULT_ACL)
        except OSError:
            pytest.skip("no POSIX ACLs on this file system")
    else:
        _add_flag(parent, FS_NODUMP_FL)
    staging = parent / ".out.kvtrace-staging-0123456789ab"
    make_staging(str(staging))
    (staging / "f").write_bytes(b"1")
    kept = frozenset({storage.PRIVATE_MARK})
    assert storage.foreign_metadata(str(staging), "s", kept) == []
    assert storage.foreign_metadata(str(staging / "f"), "f") == []
    assert os.stat(staging).st_mode & 0o7777 == storage.PRIVATE_FOLDER


def test_what_cannot_be_cleared_refuses_the_staging_before_any_work(tmp_path, monkeypatch):
    """An inode flag kvtrace cannot clear (one only privilege clears, here any: the clearing
    refused) is named in one line, and no staging folder is left."""
    parent = tmp_path / "shared"
    parent.mkdir()
    _add_flag(parent, FS_NODUMP_FL)

    def refused(path: str, flags: int) -> None:
        raise PermissionError("operation not permitted")

    monkeypatch.setattr(storage, "_set_inode_flags", refused)
    with pytest.raises(OutputRefused, match=r"inode flags kvtrace does not set \(0x40") as err:
        make_staging(str(parent / ".out.kvtrace-staging-0123456789ab"))
    assert "\n" not in str(err.value)
    assert os.listdir(parent) == []
