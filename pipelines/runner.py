"""Beam options and the runner a job runs on.

Beam's DirectRunner first tries to download the Prism runner binary and silently falls back when
offline, so the same command could run on different engines on different machines. Locally we
therefore pin the embedded FnApiRunner (what DirectRunner uses for batch jobs); any other
--runner (DataflowRunner, FlinkRunner, PortableRunner, ...) is used as given.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import signal
import socket
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import (
    DirectOptions,
    FlinkRunnerOptions,
    PipelineOptions,
    PortableOptions,
    StandardOptions,
)

from kvtrace.pipelines.processes import STOP_SIGNALS, terminate_descendants
from kvtrace.transforms import storage
from kvtrace.transforms.errors import ConfigError
from kvtrace.transforms.trace_format import parse_json

_LOG = logging.getLogger("kvtrace")
LOCAL_RUNNERS = (None, "DirectRunner", "direct", "FnApiRunner")
# A job server or worker pool that is up accepts a connection at once; Beam would wait minutes.
ENDPOINT_CONNECT_S = 5
# How long Flink itself waits for a task slot (its slot.request.timeout's default) before it
# fails the job, which its restart strategy then runs again (20 times): a job none of whose tasks
# started by then waits for slots the cluster cannot give (a --parallelism above its free ones).
TASKS_START_S = 300
FLINK_TASK_STARTED = ("deploying", "initializing", "running", "finished", "reconciling")
FLINK_ENDED = ("FINISHED", "FAILED", "CANCELED")  # its waiting thread ends with it
CANCEL_WAIT_S = 30  # for a cancelled job to end; its launcher ends either way
WATCH_POLL_S = 2  # between two looks at the job's tasks (one small GET on the cluster's REST)


class FlinkCheckpointOptions(PipelineOptions):
    """Options of Beam's Flink runner (Java) that a Python pipeline must declare to pass them on:
    a portable job server drops options no Python class knows. Flink's own configuration does
    not reach a job Beam builds, so streams checkpoint only when asked here."""

    @classmethod
    def _add_argparse_args(cls, parser: Any) -> None:
        parser.add_argument(
            "--checkpointing_interval",
            type=int,
            default=None,
            help="Flink: checkpoint a streaming job's state every this many ms",
        )


def pipeline_options(flags: Sequence[str]) -> PipelineOptions:
    return PipelineOptions(list(flags))


def is_remote(options: PipelineOptions) -> bool:
    """A runner whose workers cannot see this machine's files."""
    return options.view_as(StandardOptions).runner not in LOCAL_RUNNERS


def refuse_unsupervised_workers(options: PipelineOptions) -> None:
    """Refuse a run whose steps would run in SDK worker processes Beam starts itself on this
    machine (the DirectRunner's multi_processing mode; an embedded job server's PROCESS or
    DOCKER environment): the Beam child that reports to the CLI never hears what those workers
    commit or make, nor their deaths (one killed leaves the run waiting for good), so a night
    there could neither say its commit nor end. A cluster's workers are its runner's to watch."""
    portable = options.view_as(PortableOptions)
    environment = (portable.environment_type or "").upper()
    if not is_remote(options):
        if options.view_as(DirectOptions).direct_running_mode != "multi_processing":
            return
        starts = "--direct_running_mode multi_processing"
        remedy = "--direct_running_mode multi_threading, or --engine local --processes N"
    elif portable.job_endpoint == "embed" and environment in ("PROCESS", "DOCKER"):
        starts = f"--job_endpoint embed with --environment_type {environment}"
        remedy = "--environment_type LOOPBACK"
    else:
        return
    raise ConfigError(
        f"{starts} is refused: its SDK worker processes report to no one (a worker's death "
        f"would hang the run); use {remedy}"
    )


def run_for_report(
    build: Callable[[beam.Pipeline], beam.PCollection],
    flags: Sequence[str],
    folder: str | None,
    name: str,
    needs: str,
) -> dict:
    """Run a pipeline whose output is one report element, written as JSON to folder/name (any
    Beam filesystem) and read back here; without a folder, into a temporary local one, which
    only local runners can write (a remote run is refused, saying what it `needs`)."""
    from apache_beam.io.filesystems import FileSystems

    options = pipeline_options(flags)
    if folder is None and is_remote(options):
        raise ConfigError(f"--engine beam on a remote runner needs {needs}")
    with tempfile.TemporaryDirectory() as tmp:
        path = FileSystems.join(folder or tmp, name)

        def write(report: dict) -> None:
            with FileSystems.create(path) as handle:
                handle.write(json.dumps(report).encode())

        run(lambda p: build(p) | "Write" >> beam.Map(write), options)
        with FileSystems.open(path) as handle:
            return json.loads(handle.read())


def runner_for(options: PipelineOptions) -> Any:
    """The FnApiRunner for local batch runs, Beam's bundle-based DirectRunner for local streaming
    (it runs unbounded sources, state and timers); None lets Beam build the runner named in the
    options."""
    if not is_remote(options) and options.view_as(StandardOptions).streaming:
        from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner

        return BundleBasedDirectRunner()
    if not is_remote(options):
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        return FnApiRunner()
    return None


def run(build: Callable[[beam.Pipeline], Any], options: PipelineOptions) -> Any:
    """Build the pipeline with build(pipeline), run it to completion, return build's outputs."""
    refuse_unsupervised_workers(options)  # the CLI refused it already: any other caller here
    check_endpoints(options)
    check_parallelism(options)
    pipeline = beam.Pipeline(runner=runner_for(options), options=options)
    # Beam's own temporary folder, which it removes only once run() has started: in the run's
    # registry from the moment it exists, so a stop while the pipeline is built leaves none.
    temporary = storage.remove_on_exit(pipeline.local_tempdir)
    try:
        outputs = build(pipeline)
        cluster = flink_cluster(options)
        with contextlib.nullcontext() if is_remote(options) else workers_ended_if_stopped():
            result = pipeline.run()
        with cancelled_if_stopped(result, cluster):
            wait_for_tasks(result, options)
    finally:
        storage.remove_folder(temporary)
        storage.forget_on_exit(temporary)
    _log_counters(result)
    return outputs


@contextlib.contextmanager
def workers_ended_if_stopped() -> Iterator[None]:
    """A local run (which pipeline.run() is, whole) stopped (STOP_SIGNALS) ends its SDK
    worker processes first: Beam, unwinding, would wait for each to finish its bundle. The
    signal then goes on to whoever handled it before (the CLI's stop, else KeyboardInterrupt)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        terminate_descendants()
        _handled_before(previous[signum], signum, frame)

    previous = {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def cancelled_if_stopped(result: Any, cluster: str | None) -> Iterator[None]:
    """A job outlives its launcher on a cluster: stopping the launcher (Ctrl-C, SIGTERM) cancels
    it, so that a stream does not hold its slots (and its LOOPBACK workers, gone with us) forever.
    On a Flink cluster (cluster: its REST address, flink_cluster) it is cancelled there and
    waited for: Beam's job server drops a cancel."""

    def stop(signum: int, frame: Any) -> None:
        _handled_before(previous, signum, frame)

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    except KeyboardInterrupt:
        _LOG.warning("stopped: cancelling the job")
        if cluster is not None:  # first: Beam's own cancel may wait on the job server
            _cancel_flink_job(result, cluster)
        try:
            result.cancel()
        except Exception as err:  # the job may be gone already: say so and stop anyway
            _LOG.warning("could not cancel the job: %s", err)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def stop_grace_s(flags: Sequence[str]) -> float:
    """How much longer than a local run a stopped launcher of these Beam flags may unwind: a
    Flink job it cancels through the cluster (_cancel_flink_job) gets CANCEL_WAIT_S to end, so
    that none of its steps writes after the launcher's cleanup."""
    return float(CANCEL_WAIT_S) if flink_cluster(pipeline_options(flags)) else 0.0


def flink_cluster(options: PipelineOptions) -> str | None:
    """The REST address of the Flink cluster a job of these options runs on (Beam's Flink
    runner, or its portable runner: the Flink job server this project deploys), where a stop
    cancels it; None for Dataflow's service and the local runners, which take Beam's own
    cancel. Read before the run: Beam's portable runner clears the runner option as it runs."""
    runner = (options.view_as(StandardOptions).runner or "").lower()
    on_flink = "flink" in runner or "portable" in runner
    return flink_rest(options) if on_flink else None


def _cancel_flink_job(result: Any, rest: str) -> None:
    """Cancel a stopped launcher's job on its Flink cluster (Beam's job server drops a cancel)
    and wait up to CANCEL_WAIT_S for it to end, so that no step of it writes after the
    launcher's cleanup (its staging, its id map segments)."""
    job = _flink_job(rest, getattr(result, "_job_id", ""))
    if job is None or job.get("state") in FLINK_ENDED:
        return
    _cancel_on_cluster(rest, job["jid"])
    deadline = time.monotonic() + CANCEL_WAIT_S
    # Polled: Flink tells no one when a job ends; each look is one small request.
    while time.monotonic() < deadline:
        try:
            if _rest_json(f"{rest}/jobs/{job['jid']}")["state"] in FLINK_ENDED:
                return
        except (OSError, ValueError, KeyError, TypeError):
            pass  # the cluster did not answer this look: the next one may
        time.sleep(WATCH_POLL_S)
    _LOG.warning("Flink job %s did not end within %d s of its cancel", job["jid"], CANCEL_WAIT_S)


def _handled_before(handler: Any, signum: int, frame: Any) -> None:
    """A stop signal passed on to the handler it had before ours, which decides (the CLI's stop
    raises KeyboardInterrupt once, noting the signal, and ignores repeats); without one, raise."""
    if not callable(handler):
        raise KeyboardInterrupt
    handler(signum, frame)


def check_endpoints(options: PipelineOptions) -> None:
    """Refuse at once a job endpoint (--job_endpoint HOST:PORT) or an external worker pool
    (--environment_type EXTERNAL) where nothing listens: Beam would wait minutes."""
    portable = options.view_as(PortableOptions)
    if portable.job_endpoint and portable.job_endpoint != "embed":
        _check_listening(
            portable.job_endpoint,
            "Beam's job server",
            "start it first (a local Flink cluster: deploy/flink/local-cluster.sh start)",
        )
    if (portable.environment_type or "").upper() == "EXTERNAL":
        pool = portable.environment_config or portable.lookup_environment_option(
            "external_service_address"
        )
        if not pool:
            raise ConfigError(
                "--environment_type EXTERNAL needs --environment_config HOST:PORT "
                "(a worker pool: python -m kvtrace.pipelines.worker_pool)"
            )
        _check_listening(
            pool,
            "the SDK worker pool",
            "start it first: python -m kvtrace.pipelines.worker_pool --address " + pool,
        )
    if (portable.environment_type or "").upper() == "PROCESS":
        _check_process_command(portable.environment_config or "")


def _check_process_command(config: str) -> None:
    """A PROCESS environment's command must be there to run: else Beam waits minutes for
    workers that never start."""
    try:
        command = parse_json(config).get("command") if config.strip().startswith("{") else config
    except ValueError:
        command = None
    if not command:
        raise ConfigError(
            '--environment_type PROCESS needs --environment_config \'{"command": "/path/to/boot"}\''
        )
    if shutil.which(command) is None:
        raise ConfigError(
            f"the PROCESS environment's command {command!r} is not an executable "
            "file here; workers could not start"
        )


def flink_rest(options: PipelineOptions) -> str | None:
    """The Flink cluster's REST address, when a remote run names it (--flink_master HOST:PORT;
    configs/flink-local.yaml does); None otherwise (the job server's own, unknown here)."""
    master = options.view_as(FlinkRunnerOptions).flink_master or ""
    if not is_remote(options) or not master or master.startswith("["):  # [auto], [local]
        return None
    return (master if "://" in master else f"http://{master}").rstrip("/")


def check_parallelism(options: PipelineOptions) -> None:
    """Refuse before submission a --parallelism above the Flink cluster's task slots (its REST
    address known): the job would wait for slots it can never have."""
    rest = flink_rest(options)
    parallelism = options.view_as(FlinkRunnerOptions).parallelism or -1
    if rest is None or parallelism <= 0:
        return
    try:
        total = _rest_json(f"{rest}/overview")["slots-total"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(
            f"the Flink cluster's REST address {rest} (--flink_master) does not answer "
            f"({error}); start the cluster, or name its address"
        ) from None
    if type(total) is int and parallelism > total:
        raise ConfigError(
            f"--parallelism {parallelism} is above the {total} task slots of the Flink "
            f"cluster at {rest}: its tasks could never all start; give at most {total}"
        )


def wait_for_tasks(result: Any, options: PipelineOptions) -> None:
    """result.wait_until_finish(), and when the job runs on a Flink cluster whose REST address
    is known, watched there: a job none of whose tasks started within TASKS_START_S is
    cancelled (on the cluster: Beam's job server drops a cancel) and ends the run in one line.
    A job the watch cannot find or see is waited for as before."""
    rest = flink_rest(options)
    if rest is None:
        result.wait_until_finish()
        return
    outcome: list[BaseException | None] = []
    waiting = threading.Thread(
        target=_outcome_of, args=(result.wait_until_finish, outcome), daemon=True
    )
    waiting.start()
    job = None
    started = False
    deadline = time.monotonic() + TASKS_START_S
    while not started and time.monotonic() < deadline:
        waiting.join(WATCH_POLL_S)
        if not waiting.is_alive():
            break
        job = _flink_job(rest, getattr(result, "_job_id", "")) or job
        started = job is not None and _tasks_started(job)
    if waiting.is_alive() and job is not None and not started:
        _cancel_on_cluster(rest, job["jid"])
        waiting.join(CANCEL_WAIT_S)
        parallelism = options.view_as(FlinkRunnerOptions).parallelism or -1
        asked = f"--parallelism {parallelism}" if parallelism > 0 else "the job's parallelism"
        raise ConfigError(
            f"the cluster could not start the job's tasks within {TASKS_START_S} s (Flink job "
            f"{job['jid']} cancelled): is {asked} above its free slots?"
        )
    waiting.join()
    if outcome and outcome[0] is not None:
        raise outcome[0]


def _outcome_of(wait: Callable[[], Any], outcome: list[BaseException | None]) -> None:
    try:
        wait()
    except BaseException as error:  # raised in the launcher's thread, as if waited there
        outcome.append(error)
    else:
        outcome.append(None)


def _flink_job(rest: str, job_id: str) -> dict | None:
    """The Flink job of Beam's job job_id (Beam names it job_id's part before its last `_`), as
    the cluster's job overview says it; None when not there or the cluster does not answer."""
    try:
        jobs = _rest_json(f"{rest}/jobs/overview")["jobs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return next(
        (
            job
            for job in jobs
            if isinstance(job, dict)
            and isinstance(job.get("name"), str)
            and job_id.startswith(job["name"] + "_")
        ),
        None,
    )


def _tasks_started(job: dict) -> bool:
    """Whether any of the job's tasks got a slot (deploying, or on since), or the job ended."""
    tasks = job.get("tasks") if isinstance(job.get("tasks"), dict) else {}
    return job.get("state") in FLINK_ENDED or any(
        type(tasks.get(state)) is int and tasks[state] > 0 for state in FLINK_TASK_STARTED
    )


def _cancel_on_cluster(rest: str, jid: str) -> None:
    try:
        request = urllib.request.Request(f"{rest}/jobs/{jid}?mode=cancel", method="PATCH")
        with urllib.request.urlopen(request, timeout=ENDPOINT_CONNECT_S):
            pass
    except OSError as error:  # said, and the run ends anyway
        _LOG.warning("could not cancel Flink job %s: %s", jid, error)


def _rest_json(url: str) -> Any:
    """One small GET on the cluster's REST address, bounded in time and size."""
    with urllib.request.urlopen(url, timeout=ENDPOINT_CONNECT_S) as response:
        return parse_json(response.read(1 << 20))


def _check_listening(endpoint: str, what: str, remedy: str) -> None:
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection(
            (host.strip("[]") or "localhost", int(port)), timeout=ENDPOINT_CONNECT_S
        ):
            pass
    except (OSError, ValueError) as error:
        raise ConfigError(f"{what} at {endpoint} does not answer ({error}); {remedy}") from None


def _log_counters(result: Any) -> None:
    """What the night read of its id map (LookUpShard's counters) and what the workers' segment
    caches did (EncodeRequests'), as the local engine says them."""
    from apache_beam.metrics.metric import MetricsFilter

    from kvtrace.transforms.encode.segment_cache import COUNTED, CacheCounts, log_counts

    try:
        counters = result.metrics().query(MetricsFilter().with_namespace("kvtrace"))["counters"]
    except NotImplementedError:  # runners without metrics
        return
    totals: dict[str, int] = {}
    for counter in counters:
        totals[counter.key.metric.name] = totals.get(counter.key.metric.name, 0) + counter.committed
    if "map_bytes_read" in totals:
        _LOG.info(
            "id map: read %.1f MiB, %d of %d row groups",
            totals["map_bytes_read"] / 2**20,
            totals.get("map_row_groups_read", 0),
            totals.get("map_row_groups", 0),
        )
    log_counts(CacheCounts(**{name: totals.get(f"segment_cache_{name}", 0) for name in COUNTED}))
