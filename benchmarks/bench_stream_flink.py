"""The stream on the local Flink cluster, from Kafka, in one-hour windows, against the local
engine's batch run on the same requests (issue 36.3): a backlog (the corpus, e.g. a day) produced
into a Kafka topic, then `kvtrace anonymize --streaming` drains it with --id-shards N.

CPU seconds (user + system) of every process a run uses: the launcher and its workers (LOOPBACK:
the Python steps run in the launcher), and on Flink the JobManager, TaskManager and job server
(bench_flink's accounting); the broker's CPU is reported apart, not counted. Two sizes (the
corpus's first --small lines, and all of it) give the fixed cost per job and the cost per
request apart, as bench_flink does for batch. Runs alternate (paired). For each stream run:
sustained requests/s from its first published window to the last request accounted, dead
letters (late ones must be 0: windows follow the requests' own timestamps), whether the windows
concatenated equal the batch output, the TaskManager's RSS and the largest subtask state of
each stateful step in the last checkpoint.

    deploy/flink/local-cluster.sh start
    python benchmarks/bench_stream_direct.py corpus --requests 20000 --hours 24 --out /tmp/d.jsonl
    python benchmarks/bench_stream_flink.py /tmp/d.jsonl --small 3334 \\
        --tokenizer ../shared/tokenizers/deepseek-r1 --id-shards 1,4,16 --runs 2
    deploy/flink/local-cluster.sh stop
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_flink import FLINK_PYTHON, JVMS, jvm_cpu_by_name
from bench_streaming import free_ports, run_counts
from measure import run_measured_cpu

ROOT = Path(__file__).resolve().parents[1]
BROKER = str(ROOT / "deploy" / "kafka" / "local-broker.sh")
CLUSTER = str(ROOT / "deploy" / "flink" / "local-cluster.sh")
FLINK_REST = "http://127.0.0.1:8081"
KAFKA_EXPANSION = "localhost:8096"  # local-cluster.sh's expansion service for Kafka reads
STATEFUL = ("PublishWindows", "SeenShards", "NumberNew", "ShardStores", "WriteWindows")
DRAIN_S = 1200  # a stream that has not accounted for every request by then has failed


def rest(path: str) -> dict:
    with urllib.request.urlopen(f"{FLINK_REST}{path}") as response:
        return json.load(response)


def proc_cpu(pid: int) -> float:
    """CPU seconds of pid and of the children it has waited for (utime, stime, cutime, cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(map(int, fields[11:15])) / os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def tree_cpu(pid: int) -> float:
    """CPU seconds of a live process, its live descendants and the children it waited for."""
    total = proc_cpu(pid)
    for child in descendants(pid):
        try:
            total += proc_cpu(child)
        except OSError:
            continue
    return total


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def taskmanager_pid() -> int:
    return int(next(Path.home().glob(".cache/kvtrace/flink-*/run/taskmanager.pid")).read_text())


def rows(folder: Path) -> list[bytes]:
    """The trace rows of a batch output, or of a stream's windows in order."""
    windows = sorted(p for p in folder.iterdir() if p.is_dir()) or [folder]
    return [
        line
        for window in windows
        for path in sorted(window.glob("trace-*.jsonl"))
        for line in path.read_bytes().splitlines()
    ]


def running_job() -> str:
    running = [job["id"] for job in rest("/jobs")["jobs"] if job["status"] == "RUNNING"]
    return running[0] if len(running) == 1 else ""


def largest_states(job: str, after_ms: float) -> dict[str, int]:
    """The largest subtask state (bytes) of each stateful step, in the first checkpoint completed
    after after_ms (epoch ms), waiting for it up to a minute."""
    deadline = time.time() + 60
    while time.time() < deadline:
        latest = (rest(f"/jobs/{job}/checkpoints").get("latest") or {}).get("completed")
        if latest and latest["latest_ack_timestamp"] > after_ms:
            break
        time.sleep(1)
    else:
        return {}
    sizes: dict[str, int] = {}
    for vertex in rest(f"/jobs/{job}")["vertices"]:
        detail = rest(f"/jobs/{job}/checkpoints/details/{latest['id']}/subtasks/{vertex['id']}")
        largest = max((s.get("state_size", 0) for s in detail.get("subtasks", [])), default=0)
        for step in STATEFUL:
            if step in vertex["name"]:
                sizes[step] = max(sizes.get(step, 0), largest)
    return sizes


def stream_run(
    args: argparse.Namespace, port: int, topic: str, lines: bytes, requests: int, out: Path
) -> dict:
    """Produce the requests into a new topic, drain them on Flink; the run's figures."""
    env = {**os.environ, "KVTRACE_KAFKA_EXPANSION": KAFKA_EXPANSION}
    # A fresh cluster per run: the TaskManager's metaspace grows with every job the session has
    # run (each loads Beam's classes anew) until it dies of it, after about four stream jobs here.
    subprocess.run([CLUSTER, "stop"], check=True, capture_output=True)
    subprocess.run([CLUSTER, "start"], check=True, capture_output=True)
    subprocess.run([BROKER, "produce", str(port), topic], input=lines, env=env, check=True)
    taskmanager = taskmanager_pid()
    jvms_before = jvm_cpu_by_name()
    started = time.perf_counter()
    stream = subprocess.Popen(
        [
            *FLINK_PYTHON,
            *("-m", "kvtrace.cli", "anonymize", "--streaming"),
            *("--input", f"kafka://127.0.0.1:{port}/{topic}", "--output", str(out)),
            *("--window", "1h", "--id-shards", str(args.shards_now)),
            *("--tokenizer", args.tokenizer, "--block-size", args.block_size),
            *("--salt-file", str(args.salt), "--config", str(ROOT / "configs/flink-local.yaml")),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    first = None
    try:
        while True:
            counts = run_counts(out)
            if counts and first is None:
                first = (time.perf_counter(), counts["read"])
            if counts and counts["read"] >= requests:
                break
            if stream.poll() is not None:
                raise SystemExit(f"the stream exited ({stream.returncode}) before draining")
            if time.perf_counter() > started + DRAIN_S:
                raise SystemExit(f"the stream did not drain in {DRAIN_S} s")
            time.sleep(0.05)
        done = time.perf_counter()
        launcher = tree_cpu(stream.pid)
        jvms = {name: cpu - jvms_before[name] for name, cpu in jvm_cpu_by_name().items()}
        launcher_peak = status_kib(stream.pid, "VmHWM") / 1024
        if taskmanager_pid() != taskmanager:
            raise SystemExit("the TaskManager restarted mid-run: its CPU is not all counted")
        taskmanager_rss = status_kib(taskmanager, "VmRSS") / 1024
        job = running_job()
        states = largest_states(job, time.time() * 1000) if job else {}
    finally:
        subprocess.run([CLUSTER, "cancel-jobs"], check=False, capture_output=True)
        stream.terminate()
        stream.wait()
    counts = run_counts(out)
    return {
        "cpu": launcher + sum(jvms.values()),
        "launcher": launcher,
        **jvms,
        "wall": done - started,
        "rate": (requests - first[1]) / (done - first[0]) if first and done > first[0] else 0,
        "rejected": counts.get("rejected", -1),
        "launcher_mib": launcher_peak,
        "taskmanager_mib": taskmanager_rss,
        "states": states,
    }


def per_request(figures: dict, engine: str, field: str, added: int) -> list[float]:
    """Each pair's cost of a request beyond start-up: (large - small) / requests added."""
    small, large = figures[engine, "small"], figures[engine, "large"]
    return [(b[field] - a[field]) / added for a, b in zip(small, large, strict=True)]


def summarize(figures: dict, engines: list[str], small: int, added: int) -> None:
    cpu = {
        engine: statistics.median(per_request(figures, engine, "cpu", added)) for engine in engines
    }
    for engine in engines:
        pairs = ", ".join(f"{1 / p:.0f}" for p in per_request(figures, engine, "cpu", added))
        fixed = statistics.median(r["cpu"] for r in figures[engine, "small"]) - cpu[engine] * small
        large = figures[engine, "large"]
        if engine == "local":  # its rate beyond start-up, as the stream's after its first window
            rates = [1 / p for p in per_request(figures, engine, "wall", added)]
        else:
            rates = [r["rate"] for r in large]
        whole = ", ".join(f"{r['cpu']:.1f}" for r in large)
        print(
            f"{engine:9} {1 / cpu[engine]:5.0f} requests per CPU-s beyond start-up (pairs {pairs}),"
            f" fixed {fixed:5.1f} CPU-s; whole run {whole}"
            f" CPU-s; sustained {', '.join(f'{r:.0f}' for r in rates)} requests/s"
        )
        if engine != "local":
            split = ", ".join(
                f"{field} {statistics.median(per_request(figures, engine, field, added)) * 1e3:.2f}"
                for field in ("launcher", *JVMS)
            )
            print(
                f"{'':9} per request (ms CPU): {split}; / the local engine's requests per CPU-s "
                f"{cpu['local'] / cpu[engine]:.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("corpus", help="requests, one JSON a line (bench_stream_direct corpus)")
    parser.add_argument("--small", type=int, required=True, help="the small run's first lines")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--block-size", default="16")
    parser.add_argument("--id-shards", default="1,4", help="shard counts, comma-separated")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-stream-flink-"))
    args.salt = work / "salt"
    args.salt.write_text("a-benchmark-salt-long-enough-to-use")
    everything = Path(args.corpus).read_bytes().splitlines(keepends=True)
    sizes = {"small": everything[: args.small], "large": everything}
    for size, lines in sizes.items():
        (work / f"{size}.jsonl").write_bytes(b"".join(lines))
    engines = ["local", *(f"stream-{n}" for n in args.id_shards.split(","))]
    kafka_env = {**os.environ, "KVTRACE_KAFKA_HOME": os.environ.get("KVTRACE_KAFKA_HOME", "")}
    kafka_env["KVTRACE_KAFKA_HOME"] = kafka_env["KVTRACE_KAFKA_HOME"] or str(work / "kafka")
    port, controller = free_ports(2)
    subprocess.run([BROKER, "start", str(port), str(controller)], env=kafka_env, check=True)
    broker_pid = int((Path(kafka_env["KVTRACE_KAFKA_HOME"]) / "pid").read_text())
    figures: dict[tuple[str, str], list[dict]] = {}
    try:
        for run in range(args.runs):
            for size, lines in sizes.items():
                for engine in engines:
                    out = work / f"{engine}-{size}-{run}"
                    if engine == "local":
                        wall, cpu, peak = run_measured_cpu(
                            [
                                *(sys.executable, "-m", "kvtrace.cli", "anonymize"),
                                *("--input", str(work / f"{size}.jsonl"), "--output", str(out)),
                                *("--tokenizer", args.tokenizer, "--block-size", args.block_size),
                                *("--salt-file", str(args.salt)),
                            ],
                            ROOT,
                            {k: v for k, v in os.environ.items() if k != "KVTRACE_SALT"},
                        )
                        result = {"cpu": cpu, "wall": wall, "rate": len(lines) / wall}
                        result["launcher_mib"] = peak
                    else:
                        args.shards_now = int(engine.split("-")[1])
                        broker_before = proc_cpu(broker_pid)
                        result = stream_run(
                            args, port, f"{size}-{run}-{engine}", b"".join(lines), len(lines), out
                        )
                        result["broker"] = proc_cpu(broker_pid) - broker_before
                        result["equal"] = rows(out) == rows(work / f"local-{size}-0")
                    figures.setdefault((engine, size), []).append(result)
                    print(f"run {run} {size:5} {engine:9} {json.dumps(result)}", flush=True)
    finally:
        subprocess.run([BROKER, "stop"], env=kafka_env, check=True)
    summarize(figures, engines, args.small, len(everything) - args.small)


if __name__ == "__main__":
    main()
