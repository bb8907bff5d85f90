"""The temp files of the id map's commits: only those temp_name names for a file kvtrace writes
in the folder are ever cleared, never a folder, a link or a name of anyone else's."""

from __future__ import annotations

import os
from pathlib import Path

from kvtrace.transforms.ids import exclusive


def test_only_temp_files_of_the_files_written_there_are_removed(tmp_path):
    stale = Path(exclusive.temp_name(str(tmp_path / "CURRENT")))
    stale.write_bytes(b"a killed commit's")
    theirs = {
        "thesis.tmp-final": "folder",
        "notes.txt.tmp-0123456789abcdef": "file",  # a name kvtrace does not write here
        "CURRENT.tmp-0123456789abcde": "file",  # not temp_name's digits
        "CURRENT.tmp-fedcba9876543210": "folder",
        "CURRENT.tmp-00112233445566ff": "link",
    }
    for name, kind in theirs.items():
        path = tmp_path / name
        if kind == "folder":
            path.mkdir()
            (path / "kept").write_text("years of work\n")
        elif kind == "link":
            path.symlink_to(tmp_path / "thesis.tmp-final")
        else:
            path.write_text("theirs\n")
    assert exclusive.remove_stale_temp_files(str(tmp_path), "CURRENT") == [stale.name]
    assert sorted(os.listdir(tmp_path)) == sorted(theirs)
    assert (tmp_path / "thesis.tmp-final" / "kept").exists()
    assert (tmp_path / "CURRENT.tmp-fedcba9876543210" / "kept").exists()
