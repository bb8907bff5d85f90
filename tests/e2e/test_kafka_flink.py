"""`kvtrace anonymize --streaming` from a real Kafka broker (deploy/kafka/local-broker.sh) on the
local Flink cluster (deploy/flink/local-cluster.sh, which .ci/run starts), through Beam's Kafka
IO: every message once, the windows concatenated equal the batch job's output of the requests
they hold, and each window passes `kvtrace audit`. The requests are of January 2026, produced
now: backfills, on time all the same; and a state past the JobManager's 5 MB survives
TaskManagers killed again and again."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator

import pytest

from helpers import (
    ON_FLINK,
    ROOT,
    STREAM_START_MS,
    check_stream_against_batch,
    free_ports,
    run_stream_until_accounted,
    running_stream,
    stream_counts,
    stream_request,
)
from kvtrace.cli import main
from tiny_tokenizer import CORPUS

pytestmark = ON_FLINK
MESSAGES = 40
KAFKA_EXPANSION = "localhost:8096"  # local-cluster.sh's expansion service for Kafka reads
CLUSTER = str(ROOT / "deploy" / "flink" / "local-cluster.sh")
BROKER = str(ROOT / "deploy" / "kafka" / "local-broker.sh")
FLINK_REST = "http://127.0.0.1:8081"
CHECKPOINT_S = 60  # local-cluster.sh checkpoints every 10 s
JOBMANAGER_CAP = 5 * 1024 * 1024  # what a checkpoint kept in the JobManager's memory may hold
FLINK_ENDED = {"FINISHED", "FAILED", "CANCELED"}


@pytest.fixture
def broker(tmp_path_factory) -> Iterator[tuple[int, dict[str, str]]]:
    """A Kafka broker on loopback: its port, and the environment its script needs."""
    env = {**os.environ, "KVTRACE_KAFKA_HOME": str(tmp_path_factory.mktemp("kafka"))}
    port, controller = free_ports(2)  # the controller's own port: PORT+1 may be taken
    started = subprocess.run(
        [BROKER, "start", str(port), str(controller)], env=env, capture_output=True, text=True
    )
    assert started.returncode == 0, started.stderr
    try:
        yield port, env
    finally:
        subprocess.run([BROKER, "stop"], env=env, check=True)


def cancel_running_jobs() -> None:
    """What a failed test left running: a stream runs until cancelled in Flink."""
    subprocess.run([CLUSTER, "cancel-jobs"], check=True, capture_output=True)


def jobs_still_on(within_s: float = 60.0) -> list[str]:
    """The cluster's jobs not ended once within_s has passed (or none is left)."""
    deadline = time.monotonic() + within_s
    # Polled: a cancel completes in Flink without telling anyone; each look is one request.
    while True:
        on = [j["id"] for j in rest("/jobs")["jobs"] if j["status"] not in FLINK_ENDED]
        if not on or time.monotonic() > deadline:
            return on
        time.sleep(0.5)


def produce(port: int, env: dict[str, str], records: list[dict]) -> None:
    lines = "".join(json.dumps(record) + "\n" for record in records)
    subprocess.run(
        [BROKER, "produce", str(port), "requests"], input=lines, text=True, env=env, check=True
    )


def rest(path: str) -> dict:
    with urllib.request.urlopen(f"{FLINK_REST}{path}") as response:
        return json.load(response)


def running_job() -> str:
    running = [job["id"] for job in rest("/jobs")["jobs"] if job["status"] == "RUNNING"]
    assert len(running) == 1, running
    return running[0]


def checkpoints() -> dict[str, int]:
    """The (one) running job's checkpoint counts: completed, restored, ..."""
    return rest(f"/jobs/{running_job()}/checkpoints")["counts"]


def next_checkpoint() -> dict:
    """The running job's next completed checkpoint (failing if none completes in
    CHECKPOINT_S), as Flink's REST API reports it."""
    taken, deadline = checkpoints()["completed"], time.monotonic() + CHECKPOINT_S
    # Polled: Flink says nothing when a checkpoint completes; each look is one request.
    while checkpoints()["completed"] == taken and time.monotonic() < deadline:
        time.sleep(0.5)
    assert checkpoints()["completed"] > taken
    return rest(f"/jobs/{running_job()}/checkpoints")["latest"]["completed"]


def dead_letters(tmp_path) -> list[dict]:
    return [
        json.loads(line)
        for path in (tmp_path / "stream-rejected").rglob("*.jsonl")
        for line in path.read_text().splitlines()
    ]


def test_kafka_on_flink_every_message_once_and_the_windows_equal_batch(
    broker, tiny_tokenizer, tmp_path
):
    port, env = broker
    cancel_running_jobs()  # a stream left by an earlier run holds the cluster's slots
    records = [stream_request(i, MESSAGES) for i in range(MESSAGES)]
    produce(port, env, records)
    try:
        run_stream_until_accounted(
            tmp_path,
            tiny_tokenizer,
            f"kafka://127.0.0.1:{port}/requests",
            MESSAGES,
            {"KVTRACE_KAFKA_EXPANSION": KAFKA_EXPANSION},
            "--config",
            str(ROOT / "configs" / "flink-local.yaml"),
        )
        # The launcher stopped (SIGTERM) cancels its job on the cluster, which Beam's job
        # server alone would not: a stream left running holds its slots for ever.
        assert jobs_still_on() == []
    finally:
        cancel_running_jobs()
    assert dead_letters(tmp_path) == []  # a backfill: nothing late
    check_stream_against_batch(tmp_path, tiny_tokenizer, records)
    windows = sorted(p.name for p in (tmp_path / "stream").iterdir() if p.is_dir())
    assert windows == ["window-000000", "window-000001", "window-000002"]  # no time in a name
    # Every window publishable as it stands, each numbered on from the one before.
    assert main(["audit", str(tmp_path / "stream"), "--tokenizer", tiny_tokenizer]) == 0


WORDS = sorted({word for line in CORPUS for word in line.split()})
LARGE_REQUESTS = 400
LARGE_WINDOWS = 5
LARGE_WORDS = 3_200  # ~800 blocks of 4 each: 320,000 ids, ~8 MB of id map in state
KILLS = 3


def large_request(i: int) -> dict:
    """Request i of LARGE_REQUESTS: a prompt of its own from the first block on (known words,
    i's digits in base len(WORDS)), so each adds ~800 ids to the map."""
    digits = [WORDS[i // len(WORDS) ** d % len(WORDS)] for d in range(3)]
    text = " ".join(digits + [WORDS[(i + n) % len(WORDS)] for n in range(LARGE_WORDS)])
    return {
        "timestamp": STREAM_START_MS + i * (LARGE_WINDOWS * 60_000 // LARGE_REQUESTS),
        "output_length": 3,
        "messages": [{"role": "user", "content": text}],
    }


# The killed TaskManager's data streams end in the in-process worker's threads, which say so.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_taskmanagers_killed_again_and_again_every_request_once_ids_continue(
    broker, tiny_tokenizer, tmp_path
):
    """A state past the JobManager's 5 MB in files; TaskManagers killed mid-stream KILLS times:
    each restart restores the id map, what was published and the Kafka offsets, so every
    request is published once (a duplicate would be counted twice, a window of a restarted id
    space would differ from batch), none is a dead letter, and the windows are the batch job's
    bytes."""
    port, env = broker
    cancel_running_jobs()
    records = [large_request(i) for i in range(LARGE_REQUESTS)]
    per_window = LARGE_REQUESTS // LARGE_WINDOWS
    # Each chunk a few requests into a window: the pause before the next one (a checkpoint's
    # wait) stays short of what closes the open window as idle.
    ends = [per_window * k + 5 for k in range(1, KILLS + 1)] + [LARGE_REQUESTS]
    try:
        with running_stream(
            tmp_path,
            tiny_tokenizer,
            f"kafka://127.0.0.1:{port}/requests",
            {"KVTRACE_KAFKA_EXPANSION": KAFKA_EXPANSION},
            "--config",
            str(ROOT / "configs" / "flink-local.yaml"),
        ) as wait_for:
            produce(port, env, records[: ends[0]])
            for kill in range(KILLS):
                wait_for(per_window * (kill + 1))  # the windows the chunks so far close
                next_checkpoint()
                produce(port, env, records[ends[kill] : ends[kill + 1]])
                subprocess.run([CLUSTER, "kill-taskmanager"], check=True, capture_output=True)
            assert wait_for(LARGE_REQUESTS) == LARGE_REQUESTS
            latest = next_checkpoint()
            assert latest["checkpointed_size"] > JOBMANAGER_CAP
            assert (
                rest(f"/jobs/{running_job()}/checkpoints/config")["checkpoint_storage"]
                == "FileSystemCheckpointStorage"
            )
            assert checkpoints()["restored"] >= 1  # the run went on from its checkpoints
    finally:
        cancel_running_jobs()
    cumulative = json.loads((tmp_path / "stream" / "cumulative.json").read_text())
    counts = stream_counts(tmp_path / "stream-rejected")  # the operator's, not published
    assert cumulative["rows"] == counts["exported"] == counts["read"] == LARGE_REQUESTS
    assert counts["rejected"] == 0 and "rejected" not in cumulative
    assert dead_letters(tmp_path) == []
    check_stream_against_batch(tmp_path, tiny_tokenizer, records)
