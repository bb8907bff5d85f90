"""publish on an object store (no folders, no attributes, no atomic rename of a folder): a
command's folder without a manifest is marked by an object listing what its run published.
The store is Beam's local filesystem behind a URL scheme (kvtest://), with an object store's
ways: a match reads its pattern as Beam does over every object's name, a rename makes no
folder first."""

from __future__ import annotations

import functools
import json
import os
import posixpath
import re

import pytest

from kvtrace.transforms import storage
from kvtrace.transforms.write import publish
from kvtrace.transforms.write.publish import OutputRefused, folder_output

SCHEME = "kvtest://"
pytestmark = pytest.mark.beam  # Beam's file systems: its tests share one worker


@functools.cache  # once: Beam finds a file system by its subclasses, one per scheme
def object_store() -> type:
    """The store's class, made when a test first asks: Beam is loaded by its tests alone."""
    from apache_beam.io.filesystem import FileMetadata, FileSystem, MatchResult
    from apache_beam.io.localfilesystem import LocalFileSystem

    class ObjectStore(LocalFileSystem):
        """kvtest://NAME is the local file ROOT/NAME (ROOT: each test's, set by the fixture)."""

        root = ""

        @classmethod
        def scheme(cls) -> str:
            return SCHEME[:-3]

        def _local(self, url: str) -> str:
            return os.path.join(self.root, url[len(SCHEME) :])

        def join(self, base, *names):
            return posixpath.join(base, *names)

        def split(self, url):
            return posixpath.split(url)

        def match(self, patterns, limits=None):
            """As an object store matches: Beam's own reading of the pattern (`*` within a
            name, `**` across names) over every object's name."""
            objects = sorted(
                SCHEME + os.path.relpath(os.path.join(parent, name), self.root)
                for parent, _, names in os.walk(self.root)
                for name in names
            )
            return [
                MatchResult(
                    pattern,
                    [
                        FileMetadata(url, os.path.getsize(self._local(url)))
                        for url in objects
                        if re.fullmatch(FileSystem.translate_pattern(pattern), url)
                    ],
                )
                for pattern in patterns
            ]

        def create(self, url, *args, **kwargs):
            return super().create(self._local(url), *args, **kwargs)

        def open(self, url, *args, **kwargs):
            return super().open(self._local(url), *args, **kwargs)

        def exists(self, url):
            return super().exists(self._local(url))

        def rename(self, sources, destinations):
            for destination in destinations:
                os.makedirs(os.path.dirname(self._local(destination)), exist_ok=True)
            return super().rename(
                [self._local(s) for s in sources], [self._local(d) for d in destinations]
            )

        def delete(self, urls):
            return super().delete([self._local(u) for u in urls])

    return ObjectStore


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(object_store(), "root", str(tmp_path))
    return tmp_path


def _publish(output: str, text: str) -> None:
    with folder_output(output, "analyze") as staged:
        with storage.create(storage.join(staged.path, "analysis.txt")) as handle:
            handle.write(text.encode())


def test_a_folder_is_marked_by_an_object_and_replaced_only_by_its_command(store):
    output = f"{SCHEME}bucket/analysis"
    for text in ("1", "2"):  # the second run replaces what the first one's mark lists
        _publish(output, text)
    folder = store / "bucket" / "analysis"
    assert sorted(os.listdir(folder)) == ["analysis.txt", publish.OUTPUT_MARK_OBJECT]
    assert (folder / "analysis.txt").read_text() == "2"
    assert json.loads((folder / publish.OUTPUT_MARK_OBJECT).read_text()) == {
        "writer": "analyze",
        "files": ["analysis.txt"],
    }
    assert publish.folder_writer(output) == "analyze"
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(OutputRefused, match=r"did not write \(notes.txt\)"):
        _publish(output, "3")


def test_a_folder_without_the_mark_is_nobodys_output(store):
    """The user's own files by the names analyze writes: refused, never replaced."""
    (store / "bucket" / "notes").mkdir(parents=True)
    (store / "bucket" / "notes" / "analysis.txt").write_text("my notes")
    output = f"{SCHEME}bucket/notes"
    assert publish.folder_writer(output) == ""
    with pytest.raises(OutputRefused, match=r"did not write \(analysis.txt\)"):
        _publish(output, "1")
    assert (store / "bucket" / "notes" / "analysis.txt").read_text() == "my notes"


def test_a_folder_named_with_a_glob_character_is_itself_not_its_look_alikes(store):
    """out[1] is listed by its name as spelled (storage.files_in): its own objects move in and
    go stale, never those of out1, which a glob of the name would match."""
    (store / "bucket" / "out1").mkdir(parents=True)
    (store / "bucket" / "out1" / "analysis.txt").write_text("a neighbour's")
    output = f"{SCHEME}bucket/out[1]"
    for text in ("1", "2"):
        _publish(output, text)
    assert (store / "bucket" / "out[1]" / "analysis.txt").read_text() == "2"
    assert (store / "bucket" / "out1" / "analysis.txt").read_text() == "a neighbour's"


def test_a_streams_folder_is_marked_by_an_object_a_place_inside_it_is_refused(store):
    """An object store's stream folder is a command's output (mark_stream_object), its mark
    the same bytes whatever it holds (is_stream_mark_object): a night inside it is refused."""
    output = f"{SCHEME}bucket/live"
    publish.mark_stream_object(output)
    assert publish.folder_writer(output) == publish.STREAM_WRITER
    mark = (store / "bucket" / "live" / publish.OUTPUT_MARK_OBJECT).read_bytes()
    assert publish.is_stream_mark_object(mark)
    assert not publish.is_stream_mark_object(mark.replace(b"[]", b'["a"]'))
    night = publish.Location("--output", f"{output}/window-000000", publish.FOLDER, "anonymize")
    with pytest.raises(OutputRefused, match="lies inside .* anonymize --streaming"):
        publish.plan_locations([], [night])
