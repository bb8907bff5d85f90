"""`kvtrace anonymize --streaming` on gcloud's Pub/Sub emulator (deploy/pubsub/emulator.sh):

- sustained: a backlog of N requests (old timestamps, 1-minute windows) drained; records per
  second from the first published window to the last request accounted (start-up apart), and
  the process's peak memory;
- latency: requests published in real time (timestamps = now) into 10-second windows; for each
  window, how long after its deadline (end + allowed lateness) its folder was published. A
  request waits for its window to end anyway; what the pipeline adds is that delay.

    python benchmarks/bench_streaming.py [--tokenizer DIR] [--requests N] [--kafka]

With --kafka, the backlog comes from a Kafka broker (deploy/kafka/local-broker.sh) and runs on
the local Flink cluster (deploy/flink/local-cluster.sh start first).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvtrace.transforms.trace_format import window_name

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "kvtrace-bench"
LIVE_WINDOW_MS = 10_000
LIVE_SECONDS = 45


def free_ports(count: int) -> list[int]:
    """Distinct loopback ports nothing listens on (the probes are held until all are bound)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def request(i: int, timestamp_ms: int) -> bytes:
    return json.dumps(
        {
            "timestamp": timestamp_ms,
            "output_length": 50,
            "messages": [
                {
                    "role": "system",
                    "content": "You are a helpful assistant for questions about caches.",
                },
                {
                    "role": "user",
                    "content": f"Question {i}: how does prefix caching help " * (1 + i % 8),
                },
            ],
        }
    ).encode()


def subscription(host: str, name: str):
    os.environ["PUBSUB_EMULATOR_HOST"] = host
    from google.cloud import pubsub_v1

    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic = publisher.topic_path(PROJECT, name)
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=subscriber.subscription_path(PROJECT, name), topic=topic)
    return publisher, topic, f"pubsub:projects/{PROJECT}/subscriptions/{name}"


def start_stream(
    source: str, output: Path, window: str, tokenizer: str, env: dict[str, str], *extra: str
):
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from kvtrace.cli import main; sys.exit(main())",
            "anonymize",
            "--streaming",
            "--input",
            source,
            "--output",
            str(output),
            "--window",
            window,
            "--tokenizer",
            tokenizer,
            "--block-size",
            "16",
            *extra,
        ],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def cumulative(output: Path) -> dict:
    try:
        return json.loads((output / "cumulative.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def run_counts(output: Path) -> dict:
    """The stream's own counts (read, exported, rejected), beside its dead letters (the CLI's
    default DIR-rejected): cumulative.json publishes only what the rows prove."""
    try:  # its one run-counts-KEY.json (named by the stream's output)
        (path,) = Path(f"{output}-rejected").glob("run-counts-*.json")
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):  # none yet, or being replaced
        return {}


def peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


BACKLOG_START_MS = 1_767_225_600_000  # 2026-01-01: every window long past its deadline


def backlog(requests: int) -> list[bytes]:
    return [request(i, BACKLOG_START_MS + i * 600_000 // requests * 10) for i in range(requests)]


def sustained(host: str, tokenizer: str, requests: int, work: Path) -> None:
    publisher, topic, source = subscription(host, "backlog")
    for future in [publisher.publish(topic, message) for message in backlog(requests)]:
        future.result()
    drain(source, tokenizer, requests, work / "backlog", {"PUBSUB_EMULATOR_HOST": host})


def sustained_kafka(tokenizer: str, requests: int, work: Path) -> None:
    """The same backlog from a Kafka broker, on the local Flink cluster (started beforehand)."""
    env = {**os.environ, "KVTRACE_KAFKA_HOME": str(work / "kafka")}
    broker, (port, controller) = str(ROOT / "deploy" / "kafka" / "local-broker.sh"), free_ports(2)
    subprocess.run(
        [broker, "start", str(port), str(controller)], env=env, capture_output=True, check=True
    )
    try:
        lines = b"".join(message + b"\n" for message in backlog(requests))
        subprocess.run([broker, "produce", str(port), "backlog"], input=lines, env=env, check=True)
        drain(
            f"kafka://127.0.0.1:{port}/backlog",
            tokenizer,
            requests,
            work / "kafka-backlog",
            {"KVTRACE_KAFKA_EXPANSION": "localhost:8096"},
            "--config",
            str(ROOT / "configs" / "flink-local.yaml"),
        )
    finally:
        subprocess.run(
            [str(ROOT / "deploy" / "flink" / "local-cluster.sh"), "cancel-jobs"],
            check=True,
            capture_output=True,
        )
        subprocess.run([broker, "stop"], env=env, check=True)


def drain(
    source: str, tokenizer: str, requests: int, output: Path, env: dict[str, str], *extra: str
) -> None:
    started = time.perf_counter()
    stream = start_stream(source, output, "1m", tokenizer, env, *extra)
    first = None
    try:
        while True:
            seen = run_counts(output)
            if seen and first is None:
                first = (time.perf_counter(), seen["read"])
            if seen and seen["read"] >= requests:
                break
            time.sleep(0.05)
        done = time.perf_counter()
        peak = peak_mib(stream.pid)
    finally:
        stream.terminate()
        stream.wait()
    seen, counts = cumulative(output), run_counts(output)
    rate = (requests - first[1]) / (done - first[0]) if done > first[0] else float("nan")
    print(
        f"sustained ({source.partition(':')[0]}): {requests} requests ({seen['rows']} published in {seen['windows']} "
        f"windows, {counts['rejected']} late) in {done - started:.1f} s from launch; "
        f"{rate:.0f} requests/s after the first window; peak {peak:.0f} MiB"
    )


def latency(host: str, tokenizer: str, work: Path, rate: int) -> None:
    publisher, topic, source = subscription(host, "live")
    output = work / "live"
    stream = start_stream(
        source, output, f"{LIVE_WINDOW_MS // 1000}s", tokenizer, {"PUBSUB_EMULATOR_HOST": host}
    )
    published: dict[str, float] = {}
    deadline_by_end: dict[int, float] = {}
    try:
        begin = time.time()
        i, zero_ms = 0, None
        while time.time() < begin + LIVE_SECONDS:
            now_ms = int(time.time() * 1000)
            zero_ms = now_ms if zero_ms is None else zero_ms  # windows are cut from the first
            publisher.publish(topic, request(i, now_ms))
            window_end = zero_ms + ((now_ms - zero_ms) // LIVE_WINDOW_MS + 1) * LIVE_WINDOW_MS
            deadline_by_end.setdefault(window_end, window_end / 1000)
            i += 1
            for folder in output.glob("window-*"):
                published.setdefault(folder.name, time.time())
            time.sleep(1 / rate)
        end = time.time() + 2 * LIVE_WINDOW_MS / 1000
        while time.time() < end:
            for folder in output.glob("window-*"):
                published.setdefault(folder.name, time.time())
            time.sleep(0.05)
    finally:
        stream.terminate()
        stream.wait()
    # Windows are named by their place among the published ones, not by time: the k-th window
    # the requests fell in is window k (every window here holds requests).
    deadlines = {
        window_name(k): deadline_by_end[end] for k, end in enumerate(sorted(deadline_by_end))
    }
    delays = [
        published[name] - deadline for name, deadline in deadlines.items() if name in published
    ]
    late = run_counts(output).get("rejected", 0)
    print(
        f"latency: {i} requests at up to {rate}/s ({late} late) into {LIVE_WINDOW_MS // 1000} s windows; "
        f"{len(delays)} of {len(deadlines)} windows published; after the deadline: median "
        f"{statistics.median(delays):.2f} s, max {max(delays):.2f} s"
        if delays
        else "latency: no window published"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", default=str(ROOT.parent / "shared/tokenizers/deepseek-r1"))
    parser.add_argument("--requests", type=int, default=3000, help="backlog size")
    parser.add_argument("--rate", type=int, default=20, help="live requests per second")
    parser.add_argument(
        "--kafka",
        action="store_true",
        help="the backlog from a Kafka broker on the local Flink cluster instead "
        "(deploy/flink/local-cluster.sh start first)",
    )
    args = parser.parse_args()
    if args.kafka:
        with tempfile.TemporaryDirectory() as tmp:
            sustained_kafka(args.tokenizer, args.requests, Path(tmp))
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = {**os.environ, "KVTRACE_PUBSUB_HOME": str(work / "emulator")}
        script = str(ROOT / "deploy" / "pubsub" / "emulator.sh")
        started = subprocess.run(
            [script, "start", str(free_ports(1)[0])],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        host = started.stdout.strip().rpartition("=")[2]
        try:
            sustained(host, args.tokenizer, args.requests, work)
            latency(host, args.tokenizer, work, args.rate)
        finally:
            subprocess.run([script, "stop"], env=env, check=True)


if __name__ == "__main__":
    main()
