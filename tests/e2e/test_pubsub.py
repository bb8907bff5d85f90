"""`kvtrace anonymize --streaming` end to end on gcloud's Pub/Sub emulator: every message
published ends in exactly one window's trace or as a late dead letter, and the windows
concatenated are the batch job's output of the records they hold."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT, write_jsonl
from kvtrace.cli import main

PROJECT = "kvtrace-test"  # Beam checks project names: 6 to 30 characters
MESSAGES = 40
WINDOW_MS = 60_000
START_MS = 1_767_225_600_000  # 2026-01-01: long before the emulator's clock, the watermark
# A generous bound for a loaded 2-core machine; the wait returns as soon as all are accounted.
STREAM_S = 240

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    shutil.which("gcloud") is None, reason="gcloud (and its Pub/Sub emulator) not installed")]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> Iterator[str]:
    """A Pub/Sub emulator on loopback, started by the project's script; its address."""
    script = str(ROOT / "deploy" / "pubsub" / "emulator.sh")
    env = {**os.environ, "KVTRACE_PUBSUB_HOME": str(tmp_path_factory.mktemp("pubsub"))}
    started = subprocess.run([script, "start", str(free_port())], env=env, capture_output=True,
                             text=True)
    assert started.returncode == 0, started.stderr
    try:
        yield started.stdout.strip().rpartition("=")[2]
    finally:
        subprocess.run([script, "stop"], env=env, check=True)


def request(i: int) -> dict:
    # Unique timestamps over three windows; a shared system prompt, so ids repeat.
    return {"timestamp": START_MS + i * (3 * WINDOW_MS // MESSAGES) + i % 7, "output_length": 3,
            "messages": [{"role": "system", "content": "you answer questions about caches"},
                         {"role": "user", "content": f"question {i}: " + "why " * (i % 5)}]}


def publish(host: str, records: list[dict]) -> str:
    os.environ["PUBSUB_EMULATOR_HOST"] = host
    from google.cloud import pubsub_v1

    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic = publisher.topic_path(PROJECT, "requests")
    subscription = subscriber.subscription_path(PROJECT, "kvtrace")
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=subscription, topic=topic)
    for record in records:
        publisher.publish(topic, json.dumps(record).encode()).result()
    return f"pubsub:{subscription}"


def accounted(output: Path) -> int:
    """Requests the stream has published or dead-lettered so far."""
    try:
        cumulative = json.loads((output / "cumulative.json").read_text())
    except (FileNotFoundError, ValueError):  # not yet written
        return 0
    return cumulative["rows"] + cumulative["rejected"]


def test_every_message_lands_once_and_the_windows_equal_batch(emulator, tiny_tokenizer, tmp_path):
    records = [request(i) for i in range(MESSAGES)]
    source = publish(emulator, records)
    salt = tmp_path / "salt"
    salt.write_bytes(os.urandom(32))
    output = tmp_path / "stream"
    common = ["--tokenizer", tiny_tokenizer, "--block-size", "4", "--salt-file", str(salt)]
    stream = subprocess.Popen(
        [sys.executable, "-c", "import sys; from kvtrace.cli import main; sys.exit(main())", "anonymize", "--streaming", "--input", source,
         "--output", str(output), "--window", "1m", *common],
        cwd=ROOT, env={**os.environ, "PUBSUB_EMULATOR_HOST": emulator},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + STREAM_S
        # Polled: the stream has no end to wait for; each look is a file read.
        while accounted(output) < MESSAGES and stream.poll() is None and time.monotonic() < deadline:
            time.sleep(0.25)
        assert stream.poll() is None, stream.stderr.read()
    finally:
        stream.terminate()
        stream.wait()
    assert accounted(output) == MESSAGES

    letters = [json.loads(line) for path in (tmp_path / "stream-rejected").rglob("*.jsonl")
               for line in path.read_text().splitlines()]
    assert {letter["error"] for letter in letters} <= {"late"}
    late = {int(letter["message"].split()[2]) for letter in letters}
    windows = sorted(p for p in output.iterdir() if p.is_dir())
    streamed = [line for window in windows for path in sorted(window.glob("trace-*.jsonl"))
                for line in path.read_text().splitlines()]
    assert len(streamed) + len(late) == MESSAGES

    kept = [r for r in records if r["timestamp"] not in late]
    batch_input = write_jsonl(tmp_path / "kept.jsonl", kept)
    assert main(["anonymize", "--input", str(batch_input), "--output", str(tmp_path / "batch"),
                 *common]) == 0
    batch = [line for path in sorted((tmp_path / "batch").glob("trace-*.jsonl"))
             for line in path.read_text().splitlines()]
    assert streamed == batch
