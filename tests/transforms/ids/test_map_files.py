"""Every read of an id map's files (and its marks') opens them as regular files, in one place:
anything else in a file's place is refused in one line, never waited on."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from kvtrace.transforms import storage
from kvtrace.transforms.ids import map_files

IDS = Path(map_files.__file__).parent
# What opens a file by name: the builtin, os's, pathlib's shortcuts, storage's openers.
OPENERS = {"open", "open_read", "open_regular", "fdopen", "read_bytes", "read_text", "read_table"}


def _openers(path: Path) -> list[str]:
    """The calls in a module that open a file by name, as `line: source`, but a folder's lock
    (os.open with O_DIRECTORY: a FIFO or device in its place is refused by the kernel)."""
    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", getattr(node.func, "id", None))
        if name not in OPENERS:  # before the segment: each costs a pass over the source
            continue
        text = ast.get_source_segment(source, node) or ""
        if "O_DIRECTORY" not in text:
            found.append(f"{path.name}:{node.lineno}: {text}")
    return found


def test_every_read_of_the_map_opens_through_map_files():
    others = [
        call
        for module in sorted(IDS.glob("*.py"))
        if module.name != "map_files.py"
        for call in _openers(module)
    ]
    assert others == []


def test_the_opener_rule_sees_an_open_call(tmp_path):
    module = tmp_path / "module.py"
    module.write_text(
        "import os\nfrom kvtrace.transforms import storage\n"
        "def f(p):\n    os.open(p, os.O_RDONLY)\n    return storage.open_read(p)\n"
    )
    assert len(_openers(module)) == 2


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _link(path: Path, to: Path) -> Path:
    path.symlink_to(to)
    return path


@pytest.mark.parametrize(
    "place, why",
    [
        (lambda tmp: _fifo(tmp / "CURRENT"), "not a regular file"),
        (lambda tmp: _link(tmp / "CURRENT", _fifo(tmp / "fifo")), "is a link"),
        (lambda tmp: _link(tmp / "CURRENT", Path("/dev/zero")), "is a link"),
        (lambda tmp: _link(tmp / "CURRENT", tmp / "nothing"), "is a link"),
        (lambda tmp: (tmp / "CURRENT").mkdir() or tmp / "CURRENT", "not a regular file"),
    ],
    ids=["fifo", "link to a fifo", "link to a device", "link to nothing", "folder"],
)
def test_anything_but_a_regular_file_is_refused_in_one_line(tmp_path, place, why):
    path = place(tmp_path)
    assert map_files.map_file_exists(str(path))  # there: refused, never taken for absent
    with pytest.raises(storage.UnfitFile, match=why) as refused:
        map_files.open_map_file(str(path))
    assert "\n" not in str(refused.value)


def test_a_regular_file_is_read_as_stored(tmp_path):
    (tmp_path / "CURRENT").write_bytes(b'{"version": 3}\n')
    with map_files.open_map_file(str(tmp_path / "CURRENT")) as handle:
        assert handle.read() == b'{"version": 3}\n'
    assert not map_files.map_file_exists(str(tmp_path / "absent"))


@pytest.mark.parametrize(
    "place",
    [
        lambda tmp: _fifo(tmp / "COMMITTED"),
        lambda tmp: _link(tmp / "COMMITTED", tmp / "elsewhere"),
        lambda tmp: (tmp / "COMMITTED").mkdir() or tmp / "COMMITTED",
    ],
    ids=["fifo", "link to nothing", "folder"],
)
def test_a_mark_is_never_written_through_what_is_in_its_place(tmp_path, place):
    path = place(tmp_path)
    with pytest.raises(storage.UnfitFile, match="not a regular file") as refused:
        map_files.create_mark(str(path))
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "elsewhere").exists()  # a link's target is never made


def test_a_mark_is_made_owner_only_once(tmp_path):
    mark = tmp_path / "COMMITTED"
    map_files.create_mark(str(mark))
    assert mark.is_file() and mark.stat().st_mode & 0o777 == storage.PRIVATE_FILE
    map_files.create_mark(str(mark))  # a mark there already: marked
    assert mark.read_bytes() == map_files.MARK_BYTES != b""  # an object store refuses empty


@pytest.mark.parametrize("held", [b"", b"kvtr", b"kvtrace\nmore"])
def test_a_mark_torn_or_of_other_bytes_is_made_whole(tmp_path, held):
    """A mark killed before its fsync (a power cut keeps part of it), or empty as kvtrace once
    made them, is written again in the one format."""
    mark = tmp_path / "COMMITTED"
    mark.write_bytes(held)
    map_files.create_mark(str(mark))
    assert mark.read_bytes() == map_files.MARK_BYTES
