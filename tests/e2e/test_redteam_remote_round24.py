"""Red team round 24, remote runners (Beam on a real local Flink cluster): reproducers of the
holes found, each asserting the promised behaviour, so each fails until it is fixed. They need
the cluster: deploy/flink/local-cluster.sh start, then KVTRACE_FLINK=1
deploy/flink/local-cluster.sh python -m pytest -q -n 0 -m slow
tests/e2e/test_redteam_remote_round24.py.

Faults are injected by a prelude run in the launcher's process before the CLI's main (the job's
Python steps run there too: configs/flink-local.yaml's LOOPBACK environment), wrapping one of
kvtrace's own functions: nothing depends on timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import (
    ON_FLINK,
    ROOT,
    SALT,
    STREAM_START_MS,
    chat,
    free_ports,
    kvtrace_child,
    staged_record_prelude,
    write_jsonl,
)

pytestmark = [pytest.mark.slow, *ON_FLINK]
FLINK = ("--config", str(ROOT / "configs" / "flink-local.yaml"))
CLUSTER = ROOT / "deploy" / "flink" / "local-cluster.sh"
ROUND = pytest.mark.xfail(strict=True, reason="red team round 24")


def night(folder: Path) -> list[str]:
    """A night of a few chats on the local Flink cluster, its salt in a file."""
    (folder / "salt").write_text(SALT)
    source = write_jsonl(
        folder / "in.jsonl", [chat(i, 1_000 * i, session=f"s{i % 3}") for i in range(8)]
    )
    return [
        *FLINK,
        "--input",
        str(source),
        "--block-size",
        "4",
        "--salt-file",
        str(folder / "salt"),
    ]


# The night's record (anonymize_night.stage_night) as the job stages it for the launcher, its
# manifest damaged on the way: one trace file's entry gone from `files` and `sha256`.
_MANIFEST_SHORT_OF_A_FILE = staged_record_prelude(
    """
    name = next(f for f in record["manifest"]["files"] if f.endswith(".parquet"))
    record["manifest"]["files"].remove(name)
    del record["manifest"]["sha256"][name]
    """,
    "manifest",
)


def test_a_staged_manifest_that_does_not_list_the_staged_files_publishes_nothing(
    tiny_tokenizer, tmp_path
):
    """Promise (docs/ID_MAP.md, 'On the Beam engine': a damaged record is a one-line error;
    anonymize_night.finish_staged: 'A record missing or damaged ... is a one-line JobStopped:
    nothing committed, nothing published'; brief: a night publishes whole or not at all).
    Round 23 derived the id map's commit from the run's segment folder, but the manifest the
    launcher publishes is still the record's word: finish_staged stages record["manifest"] as
    it is and publish_staged swaps the staging folder in, neither compared with the other.
    Measured: exit 0, the folder published with trace-00000-of-00001.parquet unlisted, and
    `kvtrace audit` of it: 'manifest.json lists [...], the folder holds [...]', 'NOT
    publishable'."""
    out = tmp_path / "out"
    said = kvtrace_child(
        "anonymize",
        *night(tmp_path),
        "--tokenizer",
        tiny_tokenizer,
        "--output",
        str(out),
        "--quiet",
        prelude=_MANIFEST_SHORT_OF_A_FILE,
        timeout=300,
    )
    errors = [line for line in said.stderr.splitlines() if line.startswith("error:")]
    assert said.returncode != 0 and len(errors) == 1, said.stderr[-2000:]
    assert "Traceback" not in said.stderr
    assert not out.exists()


# A trace file the job staged, written again after the job's manifest took its digest (a
# retried task's zombie attempt, still running in its worker, finishing its write late).
_A_STAGED_FILE_WRITTEN_AFTER_THE_JOB = """
import os
import kvtrace.pipelines.anonymize_night as night
_stage_manifest = night.stage_manifest
def _late_write(config, manifest):
    with open(os.path.join(config.staging, "trace-00000-of-00001.jsonl"), "ab") as handle:
        handle.write(b'{"prompt": "a late attempt\\'s line"}\\n')
    return _stage_manifest(config, manifest)
night.stage_manifest = _late_write
"""


def test_a_staged_trace_file_that_is_not_the_manifests_publishes_nothing(tiny_tokenizer, tmp_path):
    """Promise (brief: a night publishes whole or not at all; the published folder is what
    its manifest says, which `kvtrace audit` checks). The launcher publishes the staging folder
    the job's workers wrote without comparing a file with the digest the manifest gives it: a
    remote runner's task retried after a lost TaskManager can leave an attempt still writing
    (on Flink a LOOPBACK or EXTERNAL worker outlives the task the TaskManager ran). Measured:
    exit 0, the shard published with a line its manifest's sha256 does not cover; `kvtrace
    audit`: 'trace-00000-of-00001.jsonl is not the file manifest.json lists (sha256
    differs)'."""
    out = tmp_path / "out"
    said = kvtrace_child(
        "anonymize",
        *night(tmp_path),
        "--tokenizer",
        tiny_tokenizer,
        "--output",
        str(out),
        "--quiet",
        prelude=_A_STAGED_FILE_WRITTEN_AFTER_THE_JOB,
        timeout=300,
    )
    errors = [line for line in said.stderr.splitlines() if line.startswith("error:")]
    assert said.returncode != 0 and len(errors) == 1, said.stderr[-2000:]
    assert "Traceback" not in said.stderr
    assert not out.exists()


FLINK_REST = "http://127.0.0.1:8081"  # configs/flink-local.yaml's flink_master
JOB_S = 120  # a bound on each wait for the cluster (a night here takes ~30 s)


def _flink_jobs() -> dict[str, str]:
    """Every Flink job on the cluster: its id -> its state."""
    import urllib.request

    with urllib.request.urlopen(f"{FLINK_REST}/jobs/overview", timeout=5) as response:
        return {job["jid"]: job["state"] for job in json.load(response)["jobs"]}


def _first_running_job(before: set[str]) -> str | None:
    """A job not in before with a task running (polled: Flink says nothing when one starts)."""
    import urllib.request

    deadline = time.monotonic() + JOB_S
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{FLINK_REST}/jobs/overview", timeout=5) as response:
            for job in json.load(response)["jobs"]:
                if job["jid"] not in before and job["tasks"].get("running", 0) > 0:
                    return job["jid"]
        time.sleep(0.3)
    return None


def test_a_stopped_launcher_leaves_no_job_writing_beside_its_output(tiny_tokenizer, tmp_path):
    """Promise (pipelines/runner.cancelled_if_stopped: 'stopping the launcher (Ctrl-C, SIGTERM)
    cancels it'; the CLI's own line, 'stopped: nothing published', with the run's staging
    removed; docs/deploy/FLINK.md runs the Python steps in an EXTERNAL worker pool beside each
    TaskManager). On Flink the launcher's cancel goes to Beam's job server, which drops it
    (round 22 cancels through the cluster's REST address only a job whose tasks never
    started): the job runs on in the pool after the launcher has said it stopped, cleaned up
    and let go of the output's lock, and its steps write again what the cleanup removed.
    Measured: the job FINISHED ~13 s after the launcher's exit 143, leaving
    .out.kvtrace-staging-RUNID/ beside the output, rwxr-xr-x (the staging folder is made
    owner-only; the step re-making it does not), holding the night's trace shards and stats,
    and the run's letters staging with its night.json in the dead-letter folder; with an id
    map, the run's segment folder is written into the map after the run's cleanup, racing the
    next run of the night."""
    import signal

    from kvtrace.pipelines.worker_pool import serve

    pool, server = serve("127.0.0.1:0")
    before = set(_flink_jobs())
    out = tmp_path / "out"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvtrace.cli",
            "anonymize",
            *night(tmp_path),
            "--environment_type",
            "EXTERNAL",
            "--environment_config",
            pool,
            "--tokenizer",
            tiny_tokenizer,
            "--output",
            str(out),
            "--quiet",
        ],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        job = _first_running_job(before)
        assert job is not None, "the night's job never started its tasks"
        launcher.send_signal(signal.SIGTERM)
        _, stderr = launcher.communicate(timeout=JOB_S)
        deadline = time.monotonic() + JOB_S
        while _flink_jobs()[job] == "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.5)  # polled: whatever the job does next, it has done once it ends
        ended = _flink_jobs()[job]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        subprocess.run([str(CLUSTER), "cancel-jobs"], capture_output=True, timeout=JOB_S)
        server.stop(None)
    assert launcher.returncode == 128 + signal.SIGTERM, stderr[-1000:]
    assert ended == "CANCELED", ended
    left = sorted(p.name for p in tmp_path.iterdir() if ".kvtrace-staging-" in p.name)
    assert not out.exists() and left == [], left


BROKER = ROOT / "deploy" / "kafka" / "local-broker.sh"
KAFKA_EXPANSION = "localhost:8096"  # local-cluster.sh's expansion service for Kafka reads
PROMPT = "the quick brown fox jumps over the lazy dog and the quick brown fox again"


@pytest.fixture
def broker(tmp_path_factory) -> Iterator[tuple[int, dict[str, str]]]:
    """A Kafka broker on loopback (as tests/e2e/test_kafka_flink.py's): its port and the
    environment its script needs."""
    env = {**os.environ, "KVTRACE_KAFKA_HOME": str(tmp_path_factory.mktemp("kafka"))}
    port, controller = free_ports(2)
    started = subprocess.run(
        [str(BROKER), "start", str(port), str(controller)], env=env, capture_output=True, text=True
    )
    assert started.returncode == 0, started.stderr
    try:
        yield port, env
    finally:
        subprocess.run([str(BROKER), "stop"], env=env, check=True)


def _produce(port: int, env: dict[str, str], records: list[dict]) -> None:
    lines = "".join(json.dumps(record) + "\n" for record in records)
    subprocess.run(
        [str(BROKER), "produce", str(port), "requests"], input=lines, text=True, env=env, check=True
    )


def _asking(ms: int, i: int) -> dict:
    """A request of the one prompt (its first blocks shared by every request), i at its end."""
    return {
        "timestamp": STREAM_START_MS + ms,
        "output_length": 3,
        "messages": [{"role": "user", "content": f"{PROMPT} q{i}"}],
    }


def _accounted(output: Path) -> int:
    """Requests the stream has published or lettered so far (its run counts)."""
    counts = list(Path(f"{output}-rejected").glob("run-counts-*.json"))
    return json.loads(counts[0].read_text())["read"] if counts else 0


def _completed_checkpoints(job: str) -> int:
    import urllib.request

    with urllib.request.urlopen(f"{FLINK_REST}/jobs/{job}/checkpoints", timeout=5) as response:
        return json.load(response)["counts"]["completed"]


def test_a_salt_file_rotated_under_a_running_stream_never_renumbers_its_prefixes(
    broker, tiny_tokenizer, tmp_path
):
    """Promise (docs/STREAMING.md: 'block ids stand for one prefix across windows', 'ids go on
    from the checkpoint's'; the tokenizer's files are checked on every worker against the run's
    (round 22), the salt never is). Each worker fetches --salt-file when its encoder is set up
    (encode_requests.open_encoder: salt.load()), the launcher only once, at launch: a salt file
    replaced while a stream runs (a Kubernetes Secret mounted as a file is updated in running
    pods) is taken up by every worker Flink starts after a TaskManager is lost. The restored
    id map (keyed state) holds the old salt's hashes, so the same prefix gets new ids, silently:
    no letter, no error, and the audit cannot tell (it has no salt). Measured: window-000000's
    rows and the first row of window-000001 hash_ids [0, 1, 2, 3, 4, 5], the same prompt's rows
    after the restart [6, 7, 8, 9, 10, 11]. (A Beam night's commit refuses it, through the map's
    mark, with a message about an altered mark.)"""
    port, env = broker
    subprocess.run([str(CLUSTER), "cancel-jobs"], capture_output=True, timeout=JOB_S)
    salt = tmp_path / "salt"
    salt.write_bytes(b"s" * 32)
    output = tmp_path / "stream"
    # Window 0's four requests, and one in window 1 that makes the stream's clock pass window 0.
    _produce(port, env, [_asking(1_000 * i, i) for i in range(4)] + [_asking(61_000, 4)])
    before = set(_flink_jobs())
    stream = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvtrace.cli",
            "anonymize",
            "--streaming",
            *FLINK,
            "--input",
            f"kafka://127.0.0.1:{port}/requests",
            "--output",
            str(output),
            "--window",
            "1m",
            "--tokenizer",
            tiny_tokenizer,
            "--block-size",
            "4",
            "--salt-file",
            str(salt),
        ],
        cwd=ROOT,
        env={**os.environ, "KVTRACE_KAFKA_EXPANSION": KAFKA_EXPANSION},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def wait_for(requests: int) -> None:
        deadline = time.monotonic() + 3 * JOB_S
        # Polled: a stream has no end to wait for; each look is one file read.
        while _accounted(output) < requests and stream.poll() is None:
            assert time.monotonic() < deadline, f"{_accounted(output)} of {requests} accounted"
            time.sleep(0.5)

    try:
        wait_for(4)  # window 0 published under the first salt
        job = _first_running_job(before)
        assert job is not None
        taken = _completed_checkpoints(job)
        deadline = time.monotonic() + JOB_S
        while _completed_checkpoints(job) < taken + 2:  # one taken wholly after window 0
            assert time.monotonic() < deadline, "no checkpoint completed"
            time.sleep(0.5)
        salt.write_bytes(b"r" * 32)  # the salt's file replaced in place
        subprocess.run([str(CLUSTER), "kill-taskmanager"], check=True, capture_output=True)
        _produce(port, env, [_asking(62_000 + 1_000 * i, 10 + i) for i in range(3)])
        _produce(port, env, [_asking(125_000, 20)])  # passes window 1
        wait_for(8)
    finally:
        subprocess.run([str(CLUSTER), "cancel-jobs"], capture_output=True, timeout=JOB_S)
        stream.terminate()
        stream.wait(timeout=JOB_S)
    firsts = {
        tuple(json.loads(line)["hash_ids"][:5])
        for path in sorted(output.glob("window-*/trace-*.jsonl"))
        for line in path.read_text().splitlines()
    }
    assert len(firsts) == 1, sorted(firsts)  # one prefix, one run of ids
