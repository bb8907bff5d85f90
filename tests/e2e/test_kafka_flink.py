"""`kvtrace anonymize --streaming` from a real Kafka broker (deploy/kafka/local-broker.sh) on the
local Flink cluster (deploy/flink/local-cluster.sh, which .ci/run starts), through Beam's Kafka
IO: every message once, in a window or as a late dead letter, and the windows concatenated equal
the batch job's output of the requests they hold."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator

import pytest

from conftest import (ON_FLINK, ROOT, check_stream_against_batch, free_ports,
                      run_stream_until_accounted, running_stream, stream_accounted,
                      stream_request)

pytestmark = ON_FLINK
MESSAGES = 40
KAFKA_EXPANSION = "localhost:8096"  # local-cluster.sh's expansion service for Kafka reads
CLUSTER = str(ROOT / "deploy" / "flink" / "local-cluster.sh")
BROKER = str(ROOT / "deploy" / "kafka" / "local-broker.sh")
FLINK_REST = "http://127.0.0.1:8081"
CHECKPOINT_S = 60  # local-cluster.sh checkpoints every 10 s


@pytest.fixture
def broker(tmp_path_factory) -> Iterator[tuple[int, dict[str, str]]]:
    """A Kafka broker on loopback: its port, and the environment its script needs."""
    env = {**os.environ, "KVTRACE_KAFKA_HOME": str(tmp_path_factory.mktemp("kafka"))}
    port, controller = free_ports(2)  # the controller's own port: PORT+1 may be taken
    started = subprocess.run([BROKER, "start", str(port), str(controller)], env=env,
                             capture_output=True, text=True)
    assert started.returncode == 0, started.stderr
    try:
        yield port, env
    finally:
        subprocess.run([BROKER, "stop"], env=env, check=True)


def cancel_running_jobs() -> None:
    """A stream runs until cancelled in Flink: Beam 2.62's Flink job server does not pass on the
    launcher's cancel."""
    subprocess.run([CLUSTER, "cancel-jobs"], check=True, capture_output=True)


def produce(port: int, env: dict[str, str], records: list[dict]) -> None:
    lines = "".join(json.dumps(record) + "\n" for record in records)
    subprocess.run([BROKER, "produce", str(port), "requests"], input=lines, text=True, env=env,
                   check=True)


def checkpoints() -> dict[str, int]:
    """The (one) running job's checkpoint counts: completed, restored, ..."""
    with urllib.request.urlopen(f"{FLINK_REST}/jobs") as response:
        running = [job["id"] for job in json.load(response)["jobs"] if job["status"] == "RUNNING"]
    assert len(running) == 1, running
    with urllib.request.urlopen(f"{FLINK_REST}/jobs/{running[0]}/checkpoints") as response:
        return json.load(response)["counts"]


def test_kafka_on_flink_every_message_once_and_the_windows_equal_batch(broker, tiny_tokenizer,
                                                                       tmp_path):
    port, env = broker
    cancel_running_jobs()  # a stream left by an earlier run holds the cluster's slots
    records = [stream_request(i, MESSAGES) for i in range(MESSAGES)]
    produce(port, env, records)
    try:
        run_stream_until_accounted(
            tmp_path, tiny_tokenizer, f"kafka://127.0.0.1:{port}/requests", MESSAGES,
            {"KVTRACE_KAFKA_EXPANSION": KAFKA_EXPANSION},
            "--config", str(ROOT / "configs" / "flink-local.yaml"))
    finally:
        cancel_running_jobs()
    check_stream_against_batch(tmp_path, tiny_tokenizer, records)


def test_a_taskmanager_lost_mid_stream_resumes_from_its_checkpoint(broker, tiny_tokenizer,
                                                                  tmp_path):
    """State (the id map, what was published) and Kafka offsets come back from the checkpoint:
    nothing read twice (a duplicate would be accounted twice), nothing lost, ids continue."""
    port, env = broker
    cancel_running_jobs()
    records = [stream_request(i, MESSAGES) for i in range(MESSAGES)]
    half = MESSAGES // 2
    produce(port, env, records[:half])
    try:
        with running_stream(tmp_path, tiny_tokenizer, f"kafka://127.0.0.1:{port}/requests",
                            {"KVTRACE_KAFKA_EXPANSION": KAFKA_EXPANSION},
                            "--config", str(ROOT / "configs" / "flink-local.yaml")) as wait_for:
            assert wait_for(half) == half
            # A checkpoint after the first half was accounted for: what the restart restores.
            taken, deadline = checkpoints()["completed"], time.monotonic() + CHECKPOINT_S
            while checkpoints()["completed"] == taken and time.monotonic() < deadline:
                time.sleep(0.5)
            assert checkpoints()["completed"] > taken
            subprocess.run([CLUSTER, "kill-taskmanager"], check=True, capture_output=True)
            produce(port, env, records[half:])
            wait_for(MESSAGES)
            assert checkpoints()["restored"] >= 1  # the run went on from a checkpoint
    finally:
        cancel_running_jobs()
    assert stream_accounted(tmp_path / "stream") == MESSAGES
    check_stream_against_batch(tmp_path, tiny_tokenizer, records)
