"""The same pipeline on the runners users deploy to, as far as each runs offline: the portable
path Flink uses (an embedded job server, workers in this process) and Dataflow's translation.

The whole CLI runs; the unit tests are in tests/pipelines/test_runners.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, free_port, kvtrace_child, night_args, write_jsonl
from kvtrace.cli import main
from kvtrace.transforms.errors import ConfigError

SALT = b"a-salt-that-must-never-be-staged"


def chat(i: int, ts: int) -> dict:
    return {
        "timestamp": ts,
        "session_id": f"s{i % 3}",
        "output_length": i,
        "messages": [
            {"role": "system", "content": "hello world this is a prompt about caching blocks"},
            {"role": "user", "content": "the quick brown fox jumps over the lazy dog"[: 4 + 3 * i]},
        ],
    }


@pytest.mark.slow  # over a second: .ci/run runs the slow set
@pytest.mark.beam  # its job server runs in this process
def test_portable_runner_as_flink_uses_it_gives_the_same_trace(
    tiny_tokenizer, tmp_path, monkeypatch
):
    monkeypatch.setenv("KVTRACE_SALT", SALT.decode())
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 40 * i) for i in range(15)])
    common = [
        "anonymize",
        "--input",
        str(src),
        "--tokenizer",
        tiny_tokenizer,
        "--block-size",
        "4",
        "--id-map",
    ]
    assert (
        main(
            [
                *common,
                str(tmp_path / "map-a"),
                "--id-map-marks",
                str(tmp_path / "marks-a"),
                "--output",
                str(tmp_path / "a"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                *common,
                str(tmp_path / "map-b"),
                "--id-map-marks",
                str(tmp_path / "marks-b"),
                "--output",
                str(tmp_path / "b"),
                "--runner",
                "PortableRunner",
                "--job_endpoint",
                "embed",
                "--environment_type",
                "LOOPBACK",
            ]
        )
        == 0
    )
    for name in (
        "trace-00000-of-00001.jsonl",
        "trace-00000-of-00001.parquet",
        "stats.json",
        "manifest.json",
    ):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()

    def without_run_ids(path):  # segment folders carry each run's own id, by design, and the
        record = json.loads(path.read_text())  # version's MAC covers those names
        record.pop("mac")
        return re.sub(r"(segments/\d{6})-[0-9a-f]+", r"\1", json.dumps(record, sort_keys=True))

    assert without_run_ids(tmp_path / "map-a" / "versions" / "000001.json") == without_run_ids(
        tmp_path / "map-b" / "versions" / "000001.json"
    )


@pytest.mark.beam
def test_a_worker_pool_where_nothing_listens_is_refused_at_once(tiny_tokenizer, tmp_path, capsys):
    from apache_beam.options.pipeline_options import PipelineOptions

    from kvtrace.pipelines.runner import check_endpoints

    port = free_port()
    src = write_jsonl(tmp_path / "in.jsonl", [chat(1, 0)])
    assert (
        main(
            [
                "anonymize",
                "--input",
                str(src),
                "--tokenizer",
                tiny_tokenizer,
                "--output",
                str(tmp_path / "out"),
                "--runner",
                "PortableRunner",
                "--job_endpoint",
                "embed",
                "--environment_type",
                "EXTERNAL",
                "--environment_config",
                f"127.0.0.1:{port}",
            ]
        )
        == 2
    )
    assert f"the SDK worker pool at 127.0.0.1:{port} does not answer" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="needs --environment_config"):
        check_endpoints(PipelineOptions(["--environment_type", "EXTERNAL"]))


def listening_addresses(port: int) -> set[str]:
    """The addresses a local TCP port listens on, from the kernel's socket tables."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


@pytest.mark.beam
@pytest.mark.slow  # a portable job: ~10 s
def test_the_worker_pool_listens_on_loopback_only_and_runs_a_job(
    tiny_tokenizer, tmp_path, monkeypatch
):
    from kvtrace.pipelines.worker_pool import serve

    if not Path("/proc/net/tcp").exists():
        pytest.skip("no /proc/net/tcp to read listening sockets from")
    address, server = serve("127.0.0.1:0")
    try:
        # 127.0.0.1, as IPv4 or IPv4-mapped IPv6 (never 0.0.0.0 or ::, every interface)
        assert listening_addresses(int(address.rpartition(":")[2])) <= {
            "0100007F",
            "0000000000000000FFFF00000100007F",
        }
        assert listening_addresses(int(address.rpartition(":")[2]))
        monkeypatch.setenv("KVTRACE_SALT", SALT.decode())
        src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 40 * i) for i in range(6)])
        common = [
            "anonymize",
            "--input",
            str(src),
            "--tokenizer",
            tiny_tokenizer,
            "--block-size",
            "4",
        ]
        assert main([*common, "--output", str(tmp_path / "a")]) == 0
        assert (
            main(
                [
                    *common,
                    "--output",
                    str(tmp_path / "b"),
                    "--runner",
                    "PortableRunner",
                    "--job_endpoint",
                    "embed",
                    "--environment_type",
                    "EXTERNAL",
                    "--environment_config",
                    address,
                ]
            )
            == 0
        )
    finally:
        server.stop(None)
    for name in ("trace-00000-of-00001.jsonl", "stats.json", "manifest.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


# The disk fills as the CLI's process publishes the staged trace, after the night's commit.
_DISK_FULL_AT_THE_PUBLICATION = """
import errno
from kvtrace.pipelines import anonymize_night
def _full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")
anonymize_night.publish_folder = _full
"""


@pytest.mark.slow  # a portable job: ~10 s
def test_a_night_whose_steps_run_in_another_process_says_its_commit_when_it_fails(
    tiny_tokenizer, tmp_path
):
    """A cluster runs a job's steps in processes no one of kvtrace's hears (a TaskManager): here
    an external worker pool of its own process. The id map's commit is the launcher's, once the
    job has finished (anonymize_night.finish_staged), never a step's, so a failure after it (the
    publication, on a full disk) is told as a local night's is: the error names the version the
    night committed. As a step in the pool it committed where no one was told."""
    pool = subprocess.Popen(
        [sys.executable, "-m", "kvtrace.pipelines.worker_pool", "--address", "127.0.0.1:0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        address = pool.stdout.readline().split()[-1]  # "worker pool listening on HOST:PORT"
        out, id_map = tmp_path / "out", tmp_path / "map"
        night = night_args(tmp_path, tiny_tokenizer, out)
        night += ["--id-map", str(id_map), "--id-map-marks", str(tmp_path / "marks")]
        night += ["--runner", "PortableRunner", "--job_endpoint", "embed"]
        night += ["--environment_type", "EXTERNAL", "--environment_config", address]
        failed = kvtrace_child(*night, prelude=_DISK_FULL_AT_THE_PUBLICATION, timeout=300)
    finally:
        pool.terminate()
        pool.wait()
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert not out.exists()
    assert (id_map / "versions" / "000001.json").is_file()  # the map kept the night
    said = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert said and f"version 1 of the id map {id_map}" in said[-1], said
