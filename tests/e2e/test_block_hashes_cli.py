"""--emit-block-hashes across a failed and a killed run, end to end: the output is published
first, its hashes after, in one publication (docs/BLOCK_HASHES.md), so a failure publishes
neither and hashes a kill left from before say they are not the output's."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import kvtrace.transforms.write.shards as shards
from helpers import anonymize, chat, kvtrace_child, write_jsonl
from kvtrace.transforms.write.publish import STAGING_MARK
from kvtrace.transforms.write.shards import BLOCK_HASHES_OUTPUT


def _belongs(hashes: Path, out: Path) -> bool:
    """What `cd OUT && sha256sum -c HASHES/manifest.json.sha256` says."""
    digest, name = (hashes / BLOCK_HASHES_OUTPUT).read_text().split()
    return hashlib.sha256((out / name).read_bytes()).hexdigest() == digest


# A kill (SIGKILL: nothing runs after it) once the output is swapped in, before the hashes are.
_KILLED_BETWEEN_THE_TWO = """
import os
from kvtrace.transforms.write import shards
def _killed(*args, **kwargs):
    os._exit(137)
shards.publish_folder = _killed
"""


@pytest.mark.slow  # four anonymize runs
def test_a_run_killed_between_the_two_publishes_leaves_hashes_that_say_they_are_not_its(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """The decision of docs/BLOCK_HASHES.md: the output first, its hashes after, in one
    publication; hashes that cannot be published put the output back, and a run that dies in
    between (a kill) leaves the earlier hashes, which then do not name the output beside them."""
    salt = tmp_path / "salt"
    salt.write_text("0123456789abcdef0123456789abcdef")
    out, hashes = tmp_path / "out", tmp_path / "hashes"
    args = [
        "--block-size",
        "4",
        "--salt-file",
        str(salt),
        "--hash-scheme",
        "dynamo",
        "--emit-block-hashes",
        str(hashes),
    ]
    night = [
        write_jsonl(
            tmp_path / f"night{n}.jsonl", [chat(i, 1000 * i, rotate=n) for i in range(3 + n)]
        )
        for n in range(2)
    ]
    assert anonymize(tiny_tokenizer, [night[0]], out, *args) == 0
    assert _belongs(hashes, out)
    first = {p.name: p.read_bytes() for p in hashes.iterdir()}
    trace = (out / "manifest.json").read_bytes()

    def refused(*args, **kwargs):
        raise RuntimeError("the hashes cannot be published")

    with monkeypatch.context() as patch:
        patch.setattr(shards, "publish_folder", refused)
        assert anonymize(tiny_tokenizer, [night[1]], out, *args) != 0
    assert (out / "manifest.json").read_bytes() == trace  # put back: neither published
    assert {p.name: p.read_bytes() for p in hashes.iterdir()} == first
    killed = kvtrace_child(
        "anonymize",
        "--input",
        str(night[1]),
        "--output",
        str(out),
        "--tokenizer",
        tiny_tokenizer,
        *args,
        prelude=_KILLED_BETWEEN_THE_TWO,
        timeout=120,
    )
    assert killed.returncode == 137, killed.stderr[-2000:]
    assert (out / "manifest.json").read_bytes() != trace  # the new output
    assert {p.name: p.read_bytes() for p in hashes.iterdir()} == first
    assert not _belongs(hashes, out)  # the new output, the old hashes: detectable
    assert anonymize(tiny_tokenizer, [night[1]], out, *args) == 0  # the rerun mends it
    assert _belongs(hashes, out)
    assert not list(tmp_path.glob(f".hashes{STAGING_MARK}*"))
