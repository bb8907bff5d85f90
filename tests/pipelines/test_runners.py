"""The same pipeline on the runners users deploy to, as far as each runs offline: the portable
path Flink uses (an embedded job server, workers in this process) and Dataflow's translation."""

from __future__ import annotations

import base64
import bz2
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from helpers import free_port, render_deploy
from kvtrace.pipelines.anonymize_config import IdMapRun
from kvtrace.transforms.encode.blocks import HASH_SCHEME, salt_fingerprint
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.errors import ConfigError
from kvtrace.transforms.ids.id_map import MapIdentity, MapVersion

pytestmark = pytest.mark.beam  # imports Beam: its tests share one worker

SALT = b"a-salt-that-must-never-be-staged"


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_dataflow_translation_keeps_the_salt_out_of_the_staged_job(tmp_path):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

    from kvtrace.config import beam_flags, load_presets
    from kvtrace.pipelines.anonymize_beam import AnonymizeConfig, build

    pytest.importorskip(
        "apache_beam.runners.dataflow.internal.apiclient",
        reason="needs the deploy-test extra (apache-beam[gcp])",
    )
    pytest.importorskip("google.cloud.storage", reason="needs the deploy-test extra")
    salt_file = tmp_path / "salt"
    salt_file.write_bytes(SALT)
    identity = MapIdentity("0" * 16, 512, {"tokenizer.json": "ab"}, HASH_SCHEME, {})
    base = MapVersion(
        3,
        identity,
        1_700_000_000_000,
        {"blocks": 10, "sessions": 2},
        {
            "blocks": ["segments/000001/blocks-00000.parquet"],
            "sessions": ["segments/000001/sessions-00000.parquet"],
        },
        hash_shards=64,
        checksums={
            f"segments/000001/{kind}-00000.{suffix}": {"sha256": "0" * 64, "bytes": 1}
            for kind in ("blocks", "sessions")
            for suffix in ("parquet", "index.npz")
        },
    )
    config = AnonymizeConfig(
        inputs=(("gs://kvtrace-logs/2026-11-20/part-0.jsonl.gz", 10_000_000),),
        output="gs://kvtrace-traces/2026-11-20",
        staging="gs://kvtrace-traces/.2026-11-20.kvtrace-staging-run",
        tokenizer="deepseek-ai/DeepSeek-R1",
        salt=SaltSource("file", "gs://kvtrace-secrets/salt"),
        dead_letter="gs://kvtrace-traces/2026-11-20-rejected",
        id_map=IdMapRun("gs://kvtrace-maps/deepseek-r1", base, "gs://kvtrace-secrets/marks"),
    )
    # The Beam options of configs/dataflow.yaml as deploy/render.sh fills it from a site's values.
    presets = render_deploy(
        tmp_path / "site",
        KVTRACE_GCP_PROJECT="kvtrace-test",
        KVTRACE_GCP_REGION="europe-west4",
        KVTRACE_BUCKET="kvtrace-tmp",
        KVTRACE_DATAFLOW_SERVICE_ACCOUNT="kvtrace@kvtrace-test.iam.gserviceaccount.com",
        KVTRACE_IMAGE="europe-docker.pkg.dev/kvtrace-test/kvtrace/worker:1",
    )
    _, beam_options = load_presets([str(presets / "configs" / "dataflow.yaml")])
    options = PipelineOptions([*beam_flags(beam_options), "--dry_run=true", "--no_auth"])
    pipeline = beam.Pipeline(options=options)
    build(pipeline, config)
    result = pipeline.run()  # dry run: translated into a Dataflow job, not submitted

    proto = pipeline.runner.proto_pipeline
    names = {t.unique_name for t in proto.components.transforms.values()}
    for step in (
        "Encode/RenderTokenizeHash",
        "BlockIds/Assign/LookUpShard",
        "BlockIds/MapFiles",
        "BlockIds/WriteSegment",
        "WriteShards",
        "StageNight",
    ):
        assert any(name.startswith(step) for name in names), step
    assert not any("Commit" in name for name in names)  # the launcher commits, the job done
    images = {env.payload for env in proto.components.environments.values()}
    assert any(b"kvtrace/worker:1" in image for image in images)
    # Each rendered value under the name Dataflow's runner reads it by (a misspelt key is not).
    cloud = options.view_as(GoogleCloudOptions)
    assert (cloud.project, cloud.region) == ("kvtrace-test", "europe-west4")
    assert cloud.service_account_email == "kvtrace@kvtrace-test.iam.gserviceaccount.com"
    assert cloud.temp_location.startswith("gs://kvtrace-tmp/")
    staged = unpacked(proto.SerializeToString()) + unpacked(str(result.job.proto).encode())
    assert b"gs://kvtrace-secrets/salt" in staged  # where the salt is, not what it is
    assert SALT not in staged


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_a_local_pipeline_graph_holds_no_salt_either(tiny_tokenizer, tmp_path, monkeypatch):
    import apache_beam as beam

    from kvtrace.pipelines.anonymize_beam import AnonymizeConfig, build

    monkeypatch.setenv("KVTRACE_SALT", SALT.decode())
    config = AnonymizeConfig(
        inputs=((str(Path(tmp_path) / "in.jsonl"), 100),),
        output=str(tmp_path / "o"),
        staging=str(tmp_path / "staging"),
        tokenizer=tiny_tokenizer,
        salt=SaltSource("env", "KVTRACE_SALT").pinned(),  # as the launcher gives it
        dead_letter=str(tmp_path / "r"),
    )
    pipeline = beam.Pipeline()
    build(pipeline, config)
    staged = unpacked(pipeline.to_runner_api().SerializeToString())
    assert b"KVTRACE_SALT" in staged and SALT not in staged
    # the salt's public fingerprint travels, for the workers to check theirs against
    assert salt_fingerprint(SALT).encode() in staged


def unpacked(serialized: bytes) -> bytes:
    """The serialized pipeline with every pickled function Beam packed into it (base64 of bz2)
    unpacked, so that a search for the salt also looks inside them."""
    packed = re.findall(rb"QlpoOTFBWSZT[A-Za-z0-9+/]+=*", serialized)
    return serialized + b"".join(bz2.decompress(base64.b64decode(chunk)) for chunk in packed)


def test_a_job_endpoint_where_nothing_listens_is_refused_at_once():
    from apache_beam.options.pipeline_options import PipelineOptions

    from kvtrace.pipelines.runner import check_endpoints

    port = free_port()
    options = PipelineOptions(["--runner", "PortableRunner", "--job_endpoint", f"localhost:{port}"])
    with pytest.raises(ConfigError, match=f"job server at localhost:{port} does not answer"):
        check_endpoints(options)
    check_endpoints(PipelineOptions(["--runner", "PortableRunner", "--job_endpoint", "embed"]))


@pytest.mark.parametrize(
    "flags, refused",
    [
        (["--direct_running_mode", "multi_processing"], True),
        (["--runner", "DirectRunner", "--direct_running_mode=multi_processing"], True),
        (["--direct_running_mode", "multi_threading", "--direct_num_workers", "2"], False),
        ([], False),
        (["--runner", "DataflowRunner", "--direct_running_mode", "multi_processing"], False),
        (["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=PROCESS"], True),
        (["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=docker"], True),
        (["--runner", "PortableRunner", "--job_endpoint", "embed"], False),
        (["--runner", "FlinkRunner", "--environment_type", "PROCESS"], False),
    ],
)
def test_local_sdk_worker_processes_are_refused(flags, refused):
    """Processes Beam starts itself on this machine report to no one: a run in them is refused
    (the DirectRunner's mode, an embedded job server's); a cluster's are its runner's."""
    from kvtrace.pipelines.runner import pipeline_options, refuse_unsupervised_workers

    if refused:
        with pytest.raises(ConfigError, match="is refused: its SDK worker processes"):
            refuse_unsupervised_workers(pipeline_options(flags))
    else:
        refuse_unsupervised_workers(pipeline_options(flags))


def test_a_process_environment_whose_command_is_missing_is_refused_at_once(tmp_path):
    from apache_beam.options.pipeline_options import PipelineOptions

    from kvtrace.pipelines.runner import check_endpoints

    def options(config: str) -> PipelineOptions:
        return PipelineOptions(
            [
                "--runner",
                "PortableRunner",
                "--job_endpoint",
                "embed",
                "--environment_type",
                "PROCESS",
                "--environment_config",
                config,
            ]
        )

    with pytest.raises(ConfigError, match="is not an executable file here"):
        check_endpoints(options(json.dumps({"command": str(tmp_path / "no-boot")})))
    with pytest.raises(ConfigError, match="needs --environment_config"):
        check_endpoints(options("{}"))
    boot = tmp_path / "boot"
    boot.write_text("#!/bin/sh\n")
    boot.chmod(0o755)
    check_endpoints(options(json.dumps({"command": str(boot)})))


def test_a_launcher_stopped_by_sigterm_cancels_its_job_and_restores_the_handler():
    from kvtrace.pipelines.runner import cancelled_if_stopped

    class Job:  # the part of a PipelineResult a stop uses
        cancelled = False

        def cancel(self) -> None:
            self.cancelled = True

    job, before = Job(), signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with cancelled_if_stopped(job, None):
            os.kill(os.getpid(), signal.SIGTERM)
    assert job.cancelled
    assert signal.getsignal(signal.SIGTERM) == before


class FakeFlinkRest:
    """A Flink cluster's REST address on loopback: 2 slots, one job (Beam's job "BeamApp-t")
    whose tasks are `tasks`; a look at the jobs is noted (seen), as is a cancel (PATCH)."""

    def __init__(self, tasks: dict[str, int]):
        import http.server
        import threading

        self.tasks, self.seen, self.cancelled = tasks, threading.Event(), threading.Event()
        rest = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                state = "CANCELED" if rest.cancelled.is_set() else "RUNNING"
                job = {"jid": "f1", "name": "BeamApp-t", "state": state, "tasks": rest.tasks}
                body = {
                    "/overview": {"slots-total": 2},
                    "/jobs/overview": {"jobs": [job]},
                    "/jobs/f1": job,
                }
                self._answer(body.get(self.path, {}))
                if self.path == "/jobs/overview":
                    rest.seen.set()

            def do_PATCH(self) -> None:
                if self.path == "/jobs/f1?mode=cancel":
                    rest.cancelled.set()
                self._answer({})

            def _answer(self, body: dict) -> None:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(json.dumps(body).encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def options(self, parallelism: int):
        from kvtrace.pipelines.runner import pipeline_options

        return pipeline_options(
            [
                "--runner=PortableRunner",
                f"--flink_master=127.0.0.1:{self.server.server_port}",
                f"--parallelism={parallelism}",
            ]
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class FakeJob:
    """Beam's result of the fake cluster's job: waiting ends in failure once `ends` is set."""

    _job_id = "BeamApp-t_0123-4567"

    def __init__(self, ends: Any):
        self._ends = ends

    def wait_until_finish(self) -> None:
        if not self._ends.wait(60):  # bounded: a failing test never hangs
            raise AssertionError("never ended")
        raise RuntimeError("Pipeline BeamApp-t_0123-4567 failed in state CANCELLED")


def test_a_stopped_launcher_cancels_its_job_on_the_flink_cluster_and_waits_for_its_end(monkeypatch):
    """Beam's job server drops a launcher's cancel: a stop (SIGTERM) cancels the job through
    the cluster's REST address too and returns once the cluster says it ended, so no step of it
    writes after the launcher's cleanup."""
    from kvtrace.pipelines import runner

    monkeypatch.setattr(runner, "WATCH_POLL_S", 0.01)

    class Job(FakeJob):
        def cancel(self) -> None:  # what Beam's job server does with it: nothing
            pass

    rest = FakeFlinkRest({"total": 2, "running": 2})
    try:
        with pytest.raises(KeyboardInterrupt):
            with runner.cancelled_if_stopped(Job(rest.seen), runner.flink_cluster(rest.options(2))):
                os.kill(os.getpid(), signal.SIGTERM)
        assert rest.cancelled.is_set()
        assert runner._rest_json(f"{runner.flink_rest(rest.options(2))}/jobs/f1")["state"] == (
            "CANCELED"
        )
    finally:
        rest.close()


def test_a_parallelism_above_the_clusters_slots_is_refused_before_submission():
    from kvtrace.pipelines.runner import check_parallelism

    rest = FakeFlinkRest({})
    try:
        check_parallelism(rest.options(2))  # what the cluster holds passes
        with pytest.raises(ConfigError, match=r"^--parallelism 3 is above the 2 task slots"):
            check_parallelism(rest.options(3))
    finally:
        rest.close()


def test_a_job_none_of_whose_tasks_start_is_cancelled_and_ends_in_one_line(monkeypatch):
    """Slots free when it was submitted, taken since (another job): its tasks stay scheduled.
    At the deadline the job is cancelled on the cluster and the wait ends in one line."""
    from kvtrace.pipelines import runner

    monkeypatch.setattr(runner, "TASKS_START_S", 0.3)
    monkeypatch.setattr(runner, "WATCH_POLL_S", 0.01)
    rest = FakeFlinkRest({"total": 8, "created": 0, "scheduled": 8, "running": 0})
    try:
        with pytest.raises(ConfigError) as refused:
            runner.wait_for_tasks(FakeJob(rest.cancelled), rest.options(2))
        assert rest.cancelled.is_set()
    finally:
        rest.close()
    assert str(refused.value) == (
        "the cluster could not start the job's tasks within 0.3 s (Flink job f1 cancelled): "
        "is --parallelism 2 above its free slots?"
    )


def test_a_job_whose_tasks_started_is_waited_for_and_its_outcome_raised(monkeypatch):
    """Once a task has started the watch ends: the job's own outcome is the run's (here a
    failure, raised in the launcher's thread as Beam raised it), however long it takes."""
    from kvtrace.pipelines import runner

    monkeypatch.setattr(runner, "TASKS_START_S", 0.3)
    monkeypatch.setattr(runner, "WATCH_POLL_S", 0.01)
    rest = FakeFlinkRest({"total": 8, "scheduled": 6, "running": 2})
    try:
        with pytest.raises(RuntimeError, match="failed in state CANCELLED"):
            runner.wait_for_tasks(FakeJob(rest.seen), rest.options(2))  # ends once seen
        assert not rest.cancelled.is_set()
    finally:
        rest.close()
