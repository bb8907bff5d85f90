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
        (flags,) = struct.unpack("I", fcntl.ioctl(fd, storage.FS_IOC_GETFLAGS, b"\0" * 4))
        fcntl.ioctl(fd, storage.FS_IOC_SETFLAGS, struct.pack("I", flags | flag))
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

    def refused(descriptor: int, flags: int) -> None:
        raise PermissionError("operation not permitted")

    monkeypatch.setattr(storage, "_set_inode_flags", refused)
    with pytest.raises(OutputRefused, match=r"inode flags kvtrace does not set \(0x40") as err:
        make_staging(str(parent / ".out.kvtrace-staging-0123456789ab"))
    assert "\n" not in str(err.value)
    assert os.listdir(parent) == []


def test_inherit_nothing_refuses_a_link_in_the_folders_place(tmp_path):
    """A name swapped for a link between mkdir and inherit_nothing (a group member of a shared
    parent can) is refused in one line, and what it points to is left as it was."""
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    os.chmod(target, 0o700)
    (tmp_path / "out").symlink_to(target)
    with pytest.raises(PermissionError, match="a link or file in its place") as err:
        storage.inherit_nothing(str(tmp_path / "out"), storage.PUBLIC_FOLDER)
    assert "\n" not in str(err.value)
    assert os.stat(target).st_mode & 0o7777 == 0o700


def test_inherit_nothing_refuses_another_users_folder(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only root makes a folder another user's here")
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, -1)
    with pytest.raises(PermissionError, match="another user's"):
        storage.inherit_nothing(str(folder), storage.PUBLIC_FOLDER)
    assert os.stat(folder).st_mode & 0o7777 == 0o700


@pytest.mark.parametrize("attribute", ["user.note", "user.kvtrace.private", "user.x.y"])
def test_inherit_nothing_takes_off_every_attribute_the_gate_would_name(tmp_path, attribute):
    folder = tmp_path / "made"
    folder.mkdir()
    try:
        os.setxattr(folder, attribute, b"1")
    except OSError:
        pytest.skip("no user extended attributes on this file system")
    storage.inherit_nothing(str(folder), storage.PRIVATE_FOLDER)
    assert storage.foreign_metadata(str(folder), "x") == []


@pytest.mark.parametrize(
    "policy",
    [
        storage.FS_ENCRYPT_FL,
        storage.FS_VERITY_FL,
        storage.FS_CASEFOLD_FL,
        storage.FS_PROJINHERIT_FL,
    ],
)
def test_a_file_systems_policy_flag_is_neither_cleared_nor_named(tmp_path, monkeypatch, policy):
    """An encrypted, verity, case-folding or project-inheriting entry is the file system's or an
    admin's policy: inherit_nothing keeps it while it clears the owner's chattr +d, and the gate
    names only the latter."""
    flags = {"now": policy | FS_NODUMP_FL}
    monkeypatch.setattr(storage, "_inode_flags", lambda descriptor: flags["now"])
    monkeypatch.setattr(storage, "_set_inode_flags", lambda d, new: flags.update(now=new))
    folder = tmp_path / "made"
    folder.mkdir()
    assert storage.foreign_metadata(str(folder), "x")[0].startswith(
        "x: inode flags kvtrace does not set (0x40,"
    )
    storage.inherit_nothing(str(folder), storage.PUBLIC_FOLDER)
    assert flags["now"] == policy
    assert storage.foreign_metadata(str(folder), "x") == []


def test_a_project_inheriting_parent_passes_a_publishable_folder(tmp_path):
    """The real flag, where ext4 keeps it (chattr +P): inherited, kept, not named."""
    parent = tmp_path / "project"
    parent.mkdir()
    _add_flag(parent, storage.FS_PROJINHERIT_FL)
    staging = parent / ".out.kvtrace-staging-0123456789ab"
    make_staging(str(staging))
    assert storage.foreign_metadata(str(staging), "s", frozenset({storage.PRIVATE_MARK})) == []


@pytest.mark.parametrize("listed", ["system.nfs4_acl", "lustre.lov"])
def test_a_file_system_listing_an_attribute_on_every_file_is_refused_plainly(
    tmp_path, monkeypatch, listed
):
    """NFSv4's ACL and Lustre's layout are on every entry and come off none: one line, one piece
    of advice, no staging folder named."""
    real = storage.foreign_attributes
    monkeypatch.setattr(
        storage, "foreign_attributes", lambda entry, kept=frozenset(): real(entry, kept) | {listed}
    )
    staging = tmp_path / ".out.kvtrace-staging-0123456789ab"
    with pytest.raises(OutputRefused) as err:
        make_staging(str(staging))
    assert str(err.value) == (
        f"this file system lists {listed} on every file; stage nights on a local disk and "
        f"copy the published folder"
    )
    assert os.listdir(tmp_path) == []


def test_an_ungated_output_is_not_refused_for_what_its_parent_passes_on(tmp_path, monkeypatch):
    """analyze's folder (a report, never audited) is made where a night would be refused."""
    parent = tmp_path / "shared"
    parent.mkdir()
    _add_flag(parent, FS_NODUMP_FL)

    def refused(descriptor: int, flags: int) -> None:
        raise PermissionError("operation not permitted")

    monkeypatch.setattr(storage, "_set_inode_flags", refused)
    staging = parent / ".out.kvtrace-staging-0123456789ab"
    make_staging(str(staging), gated=False)
    assert staging.is_dir()
    with pytest.raises(OutputRefused):
        make_staging(str(parent / ".b.kvtrace-staging-0123456789ab"))
