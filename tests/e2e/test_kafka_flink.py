"""`kvtrace anonymize --streaming` from a real Kafka broker (deploy/kafka/local-broker.sh) on the
local Flink cluster (deploy/flink/local-cluster.sh, which .ci/run starts), through Beam's Kafka
IO: every message once, in a window or as a late dead letter, and the windows concatenated equal
the batch job's output of the requests they hold."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator

import pytest

from conftest import (ROOT, check_stream_against_batch, free_port, run_stream_until_accounted,
                      stream_request)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.flink,
    pytest.mark.skipif(not os.environ.get("KVTRACE_FLINK"), reason=(
        "needs the cluster: deploy/flink/local-cluster.sh start, then KVTRACE_FLINK=1 (.ci/run "
        "does both)")),
]
MESSAGES = 40
KAFKA_EXPANSION = "localhost:8096"  # local-cluster.sh's expansion service for Kafka reads
CLUSTER = str(ROOT / "deploy" / "flink" / "local-cluster.sh")
BROKER = str(ROOT / "deploy" / "kafka" / "local-broker.sh")


@pytest.fixture
def broker(tmp_path_factory) -> Iterator[tuple[int, dict[str, str]]]:
    """A Kafka broker on loopback: its port, and the environment its script needs."""
    env = {**os.environ, "KVTRACE_KAFKA_HOME": str(tmp_path_factory.mktemp("kafka"))}
    port = free_port()
    started = subprocess.run([BROKER, "start", str(port)], env=env, capture_output=True,
                             text=True)
    assert started.returncode == 0, started.stderr
    try:
        yield port, env
    finally:
        subprocess.run([BROKER, "stop"], env=env, check=True)


def cancel_running_jobs() -> None:
    """A stream runs until cancelled in Flink: Beam 2.62's Flink job server does not pass on the
    launcher's cancel."""
    subprocess.run([CLUSTER, "cancel-jobs"], check=True, capture_output=True)


def test_kafka_on_flink_every_message_once_and_the_windows_equal_batch(broker, tiny_tokenizer,
                                                                       tmp_path):
    port, env = broker
    cancel_running_jobs()  # a stream left by an earlier run holds the cluster's slots
    records = [stream_request(i, MESSAGES) for i in range(MESSAGES)]
    lines = "".join(json.dumps(record) + "\n" for record in records)
    subprocess.run([BROKER, "produce", str(port), "requests"], input=lines, text=True, env=env,
                   check=True)
    try:
        run_stream_until_accounted(
            tmp_path, tiny_tokenizer, f"kafka://127.0.0.1:{port}/requests", MESSAGES,
            {"KVTRACE_KAFKA_EXPANSION": KAFKA_EXPANSION},
            "--config", str(ROOT / "configs" / "flink-local.yaml"))
    finally:
        cancel_running_jobs()
    check_stream_against_batch(tmp_path, tiny_tokenizer, records)
