"""`kvtrace anonymize --streaming` end to end on gcloud's Pub/Sub emulator: every message
published ends in exactly one window's trace or as a late dead letter, the windows concatenated
are the batch job's output of the records they hold, and each window passes `kvtrace audit`."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from helpers import check_stream_against_batch, run_stream_until_accounted, stream_request
from kvtrace.cli import main

PROJECT = "kvtrace-test"  # Beam checks project names: 6 to 30 characters
MESSAGES = 40

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("gcloud") is None, reason="gcloud (and its Pub/Sub emulator) not installed"
    ),
]


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


def test_every_message_lands_once_and_the_windows_equal_batch(emulator, tiny_tokenizer, tmp_path):
    records = [stream_request(i, MESSAGES) for i in range(MESSAGES)]
    source = publish(emulator, records)
    run_stream_until_accounted(
        tmp_path, tiny_tokenizer, source, len(records), {"PUBSUB_EMULATOR_HOST": emulator}
    )
    check_stream_against_batch(tmp_path, tiny_tokenizer, records)
    windows = sorted(p for p in (tmp_path / "stream").iterdir() if p.is_dir())
    assert [w.name for w in windows] == [f"window-{n:06d}" for n in range(len(windows))]
    # Every window publishable as it stands, each numbered on from the one before.
    assert main(["audit", str(tmp_path / "stream"), "--tokenizer", tiny_tokenizer]) == 0
