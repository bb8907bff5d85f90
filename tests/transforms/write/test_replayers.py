"""write/replayers.py: the replay command per replayer that a manifest publishes."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.trace_format import MANIFEST_SCHEMA, schema_problems, shard_name
from kvtrace.transforms.write.replayers import (
    BLOCK_REQUESTS,
    CONSUMERS,
    RECUT,
    WHOLE,
    replay_commands,
)

ONE = [shard_name(0, 1, ".jsonl"), shard_name(0, 1, ".parquet"), "stats.json"]
TWO = [shard_name(i, 2, suffix) for i in range(2) for suffix in (".jsonl", ".parquet")]


def test_a_single_shard_is_replayed_as_published_by_the_replayers_that_read_it_whole():
    commands = replay_commands(64, 10, ONE)
    assert set(commands) == set(CONSUMERS)
    for name, consumer in CONSUMERS.items():
        exported = commands[name].startswith("kvtrace export")
        assert exported == (consumer.form != WHOLE), name
        if not exported:
            assert ONE[0] in commands[name], name


def test_several_shards_go_through_export_for_every_replayer():
    commands = replay_commands(64, 10, TWO)
    assert all(
        c.startswith(
            f"kvtrace export . --to {name} -o ../kvtrace.{name}{CONSUMERS[name].suffix} && "
        )
        for name, c in commands.items()
    )


@pytest.mark.parametrize("folder", ["out", "out/", "gs://bucket/night"])
def test_an_exported_file_is_written_beside_the_folder_never_into_it(folder):
    for name, command in replay_commands(16, 3, TWO, folder).items():
        words = shlex.split(command.split(" && ")[0])
        written = words[words.index("-o") + 1]
        assert not written.startswith(folder.rstrip("/") + "/"), written
        suffix = CONSUMERS[name].suffix
        assert words[2] == folder and written == f"{folder.rstrip('/')}.{name}{suffix}"


def test_every_replayer_is_given_the_block_size_it_must_replay_at():
    """A replayer left at its own block size replays every prompt at the wrong length; SGLang
    is the exception: its ids are re-cut to its own size by export; and libCacheSim, whose
    records each carry their block's size."""
    commands = replay_commands(4321, 10, ONE)
    for name, consumer in CONSUMERS.items():
        assert ("4321" in commands[name]) == (consumer.form not in (RECUT, BLOCK_REQUESTS)), name


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 1 << 20), st.integers(0, (1 << 40) - 1), st.integers(1, 99_999))
def test_the_commands_fit_the_manifests_declared_replay_field(block_size, rows, shards):
    """Whatever the block size, rows and shard count, the manifest's replay object meets the
    schema the publication gate checks (at most 16 commands of 1,024 characters)."""
    files = [shard_name(shard, shards, ".jsonl") for shard in {0, shards - 1}]
    replay = {"replay": replay_commands(block_size, rows, files)}
    schema = {"type": "object", "properties": {"replay": MANIFEST_SCHEMA["properties"]["replay"]}}
    assert schema_problems(replay, schema) == []
