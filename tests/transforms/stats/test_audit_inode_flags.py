"""audit._check_inode_flags: an entry's inode flags (lsattr) pass only as the file system sets
them itself; a file system that keeps none is read as holding none, never an error."""

from __future__ import annotations

import fcntl
import os
import struct

import pytest

from kvtrace.transforms.stats import audit as gate

FS_IOC_SETFLAGS, FS_NODUMP_FL = 0x40086602, 0x40


def _flags_of(path: str) -> list[str]:
    found = gate._Gate()
    gate._check_inode_flags(path, "x", found)
    return found.flags


def test_a_new_file_and_folder_carry_only_the_file_systems_own_flags(tmp_path):
    (tmp_path / "f").write_bytes(b"1")
    assert _flags_of(str(tmp_path / "f")) == [] and _flags_of(str(tmp_path)) == []


def test_a_file_system_without_inode_flags_holds_none():
    assert _flags_of("/proc/self/status") == []  # procfs: the ioctl is not there (ENOTTY)


def test_a_flag_the_owner_chose_is_named(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"1")
    fd = os.open(path, os.O_RDONLY)
    try:
        (flags,) = struct.unpack("l", fcntl.ioctl(fd, gate.FS_IOC_GETFLAGS, struct.pack("l", 0)))
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("l", flags | FS_NODUMP_FL))
    except OSError:
        pytest.skip("this file system keeps no inode flags")
    finally:
        os.close(fd)
    assert _flags_of(str(path)) == [
        "x: inode flags kvtrace does not set (0x40, as lsattr lists them): clear them "
        "(chattr) or copy into a folder that has none"
    ]
