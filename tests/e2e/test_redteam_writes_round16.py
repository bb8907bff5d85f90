"""Red team round 16, writes, stops and crashes: reproducers of holes left after the fifteenth
round's fixes. Each asserts the promised behaviour, so each fails until it is fixed.

A stop swept over every durable step of a night's parent process (local engine and Beam's
parent, an id map extended) held: each run said what it published, and what it said stood
whole. What follows is what broke."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import agent_log, anonymize, chat, kvtrace_child, night_args, write_jsonl
from kvtrace.cli import main

pytestmark = pytest.mark.slow

# SIGTERM once the id map's version 2 record is linked into versions/ (exclusive._create_local:
# the commit's one atomic step), as the versions folder is synced next; that sync then takes
# longer than the stop's deadline (a loaded disk, a network file system): it waits on a pipe
# nobody writes, so the CLI's own deadline (STOP_DEADLINE_S) ends the run, as it ends any
# unwinding that does not end.
_STOP_AS_THE_COMMIT_IS_SYNCED = """
import os, signal
_link, _fsync, _linked = os.link, os.fsync, []
def _note_link(source, destination, *args, **kwargs):
    done = _link(source, destination, *args, **kwargs)
    if str(destination).endswith("/versions/000002.json"):
        _linked.append(destination)
    return done
def _slow_sync(fd):
    if _linked:
        os.kill(os.getpid(), signal.SIGTERM)
        os.read(os.pipe()[0], 1)
    return _fsync(fd)
os.link, os.fsync = _note_link, _slow_sync
"""

# The same place, failing: syncing the versions folder once version 2's record is linked
# reports EIO (a disk error, a network file system's write-back failing).
_FAIL_AS_THE_COMMIT_IS_SYNCED = """
import errno, os
_link, _fsync, _linked = os.link, os.fsync, []
def _note_link(source, destination, *args, **kwargs):
    done = _link(source, destination, *args, **kwargs)
    if str(destination).endswith("/versions/000002.json"):
        _linked.append(destination)
    return done
def _failing_sync(fd):
    if _linked:
        _linked.clear()
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    return _fsync(fd)
os.link, os.fsync = _note_link, _failing_sync
"""


def _agentic_edges(export: Path) -> set[tuple]:
    """Each dependency of a dynamo-agentic export as (row, the row it waits on, relation, delay),
    rows named by what they hold (arrival, prompt and output lengths): names that do not
    depend on which other rows the export holds."""
    rows = [json.loads(line) for line in export.read_text().splitlines()[1:]]
    named = {
        r["request_id"]: (r["not_before_ms"], r["input_length"], r["output_length"]) for r in rows
    }
    assert len(set(named.values())) == len(named)  # every row told apart by what it holds
    return {
        (named[r["request_id"]], named[d["request_id"]], d["relation"], d["delay_ms"])
        for r in rows
        for d in r.get("dependencies", [])
    }


def test_exporting_two_nights_never_links_one_nights_rows_to_the_others(tiny_tokenizer, tmp_path):
    """`parent_row` is "the 0-based number of that row across the shards" of its own night
    (docs/OUTPUT.md), and a night's links never leave it (docs/PRIVACY.md: "a request continued
    an earlier one of the same night"). `kvtrace export` takes several traces (a week of nights
    replayed together) and read_trace concatenates their rows, parent_row as it stands: a row
    of the second night now names a row of the first. Replayed with the agent form, the agent's
    turns wait on another night's unrelated requests (a spawn with a negative delay, here), and
    the graph changes with the order the nights are given in: a silently wrong benchmark."""
    agents = write_jsonl(tmp_path / "agents.jsonl", [record for record, _ in agent_log()])
    chats = write_jsonl(tmp_path / "chats.jsonl", [chat(i, 1_000 * i) for i in range(3)])
    for name, log in (("agents", agents), ("chats", chats)):
        assert (
            anonymize(tiny_tokenizer, [log], tmp_path / name, "--block-size", "4", "--emit-parents")
            == 0
        )
    alone, both = tmp_path / "alone.jsonl", tmp_path / "both.jsonl"
    to = ["--to", "dynamo-agentic", "-o"]
    assert main(["export", str(tmp_path / "agents"), *to, str(alone)]) == 0
    assert main(["export", str(tmp_path / "chats"), str(tmp_path / "agents"), *to, str(both)]) == 0
    # The chats link nothing: the agents' links, and only theirs, whatever else is replayed.
    assert _agentic_edges(both) == _agentic_edges(alone)


def _second_night(tmp_path: Path, tokenizer: str) -> list[str]:
    """Night 2's arguments, its id map at version 1 (night 1 committed it) and new keys to add."""
    first = night_args(tmp_path, tokenizer, tmp_path / "night1", "--id-map", str(tmp_path / "map"))
    assert kvtrace_child(*first).returncode == 0
    records = [chat(i, 1_000 * i, f"s{i % 5}", rotate=i % 3) for i in range(12, 26)]
    return night_args(
        tmp_path, tokenizer, tmp_path / "night2", "--id-map", str(tmp_path / "map"), records=records
    )


def test_a_stop_past_its_deadline_as_the_map_commits_names_the_version_committed(
    tiny_tokenizer, tmp_path
):
    """A stop's line says what the run published (publish.published_here): "published version
    N of the id map before the stop" once the version stands. The version is committed the
    moment its record is linked into versions/ (current_version_number: the highest record;
    CURRENT is a hint), but the run records it only once create_exclusive has returned, after
    the versions folder is synced. A stop landing in that sync, which outlasts the deadline,
    ends the run by the hard end (abandon_staged), whose record of the publication under way
    (anonymize_night._committed) is still empty: the line says "stopped: nothing published"
    while version 2 stands in the map, the next night continuing from it. The operator is told
    the map is as it was."""
    stopped = kvtrace_child(
        *_second_night(tmp_path, tiny_tokenizer), prelude=_STOP_AS_THE_COMMIT_IS_SYNCED
    )
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert (tmp_path / "map" / "versions" / "000002.json").is_file()  # committed: it stands
    assert "version 2 of the id map" in stopped.stderr, stopped.stderr[-2000:]


def test_a_failure_as_the_map_commits_names_the_version_committed(tiny_tokenizer, tmp_path):
    """The failure's line says what the run published before it (cli._failed, round 13):
    "published version N of the id map before the failure". The same gap as the stop's: the
    versions folder's sync failing once the record is linked fails create_exclusive before the
    run records its commit, so the line is the bare error while version 2 stands."""
    failed = kvtrace_child(
        *_second_night(tmp_path, tiny_tokenizer), prelude=_FAIL_AS_THE_COMMIT_IS_SYNCED
    )
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert (tmp_path / "map" / "versions" / "000002.json").is_file()  # committed: it stands
    assert "version 2 of the id map" in failed.stderr, failed.stderr[-2000:]
