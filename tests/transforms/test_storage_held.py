"""storage.held and storage.remove_unheld: what a run makes for itself is removed by another run
only once nobody holds it (its maker done, or dead however it died)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from helpers import ROOT
from kvtrace.transforms import storage


def _folder(tmp_path) -> str:
    return tempfile.mkdtemp(prefix="held-", dir=tmp_path)


def _file(tmp_path) -> str:
    handle, path = tempfile.mkstemp(prefix="held-", dir=tmp_path)
    os.close(handle)
    return path


@pytest.mark.parametrize("make", [_folder, _file])
def test_what_is_held_stays_and_goes_once_let_go(tmp_path, make):
    with storage.held(lambda: make(tmp_path)) as path:
        assert not storage.remove_unheld(path)
        assert os.path.lexists(path)
    assert storage.remove_unheld(path)
    assert not os.path.lexists(path)


def test_a_holder_killed_lets_go(tmp_path):
    """The lock is the kernel's: a SIGKILLed holder's goes with it (no pid is compared)."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, tempfile\n"
            "from kvtrace.transforms import storage\n"
            f"with storage.held(lambda: tempfile.mkdtemp(dir={str(tmp_path)!r})) as path:\n"
            "    print(path, flush=True)\n"
            "    sys.stdin.read()\n",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        path = holder.stdout.readline().strip()
        os.mkdir(os.path.join(path, "beam-temp"))
        assert not storage.remove_unheld(path)
    finally:
        holder.kill()
        holder.wait()
    assert storage.remove_unheld(path)
    assert not os.path.lexists(path)


def test_a_name_cleared_before_it_was_locked_is_made_again(tmp_path):
    """A clearer that removes what the maker made before the maker locked it leaves the maker
    a name no longer there: held makes another, and holds that."""
    made = []

    def make() -> str:
        made.append(_folder(tmp_path))
        if len(made) == 1:
            assert storage.remove_unheld(made[0])  # a clearer, between make and lock
        return made[-1]

    with storage.held(make) as path:
        assert path == made[1] and os.path.isdir(path)
        assert not os.path.lexists(made[0])


def test_links_and_other_kinds_of_file_are_never_removed(tmp_path):
    target = _file(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(target)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert not storage.remove_unheld(str(link))
    assert not storage.remove_unheld(str(fifo))
    assert not storage.remove_unheld(str(tmp_path / "missing"))
    assert link.is_symlink() and fifo.exists() and os.path.isfile(target)
