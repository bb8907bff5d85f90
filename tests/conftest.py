"""Fixtures every test may ask for: a tiny trained tokenizer and the real tokenizers of ../shared.
The helpers the tests import are in helpers.py."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import is_hypothesis_test, settings
from xdist.scheduler import LoadScopeScheduling

from helpers import ROOT, free_port, shared_path
from tiny_tokenizer import build_tiny_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
# Property tests assert results, not speed (speed lives in benchmarks/): a loaded CI machine
# must not fail an example for taking over hypothesis's default 200 ms.
settings.register_profile("kvtrace", deadline=None)
# The fast set (the README's command) runs each property test's first FAST_EXAMPLES examples;
# .ci/run's property pass (--hypothesis-profile=ci -m property) runs every one a test asks for.
settings.register_profile("ci", parent=settings.get_profile("kvtrace"))
settings.load_profile("kvtrace")
FAST_EXAMPLES = 25


# Whole CLI runs (a process each, a tokenizer loaded, often several nights): the fast set keeps
# the files marked smoke, one per command's main path; .ci/run's slow pass runs every other.
END_TO_END = "tests/e2e/"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Property tests are marked property, and hold to FAST_EXAMPLES outside the ci profile;
    end-to-end tests not marked smoke are marked slow."""
    for item in items:
        if item.nodeid.startswith(END_TO_END) and not item.get_closest_marker("smoke"):
            item.add_marker(pytest.mark.slow)
        test = getattr(item, "obj", None)
        if test is not None and is_hypothesis_test(test):
            item.add_marker(pytest.mark.property)
            if settings.get_current_profile_name() != "ci":
                hold_to_fast_examples(getattr(test, "__func__", test))


def hold_to_fast_examples(test) -> None:
    """The test's own settings with at most FAST_EXAMPLES examples. Hypothesis reads them from
    this attribute as the test runs; a second @settings on a decorated test would be refused."""
    written = test._hypothesis_internal_use_settings
    if written.max_examples > FAST_EXAMPLES:
        test._hypothesis_internal_use_settings = settings(written, max_examples=FAST_EXAMPLES)


# The test folders whose tests start encode workers: the CLI's runs in this process (which
# tests/test_layout.py keeps out of tests/transforms/) and the engines'. In a worker that loaded
# Beam those start from a forkserver and rebuild their tokenizer, at several times the cost.
STARTS_WORKERS = ("tests/e2e/", "tests/cli/", "tests/pipelines/")


def next_scope(queue: list[str], beam_worker: bool) -> str:
    """The scope a worker runs next: the beam group first; then, for the worker that ran it,
    a file of no STARTS_WORKERS folder, for the others one of those folders' files, while
    there are any; else the queue's head."""
    if "beam" in queue:
        return "beam"
    fitting = (scope for scope in queue if scope.startswith(STARTS_WORKERS) != beam_worker)
    return next(fitting, queue[0])


# Where xdist's workers list the tests marked beam for the scheduler, which sees test ids
# only: xdist's own groups (xdist_group) name a test by changing item._nodeid, which pytest 9
# no longer reads.
BEAM_TESTS = "KVTRACE_BEAM_TESTS"


class LoadFileAndBeamScheduling(LoadScopeScheduling):
    """Tests marked beam run in one xdist worker: Beam loads gRPC, which is not fork-safe, and a
    worker that loaded it starts every in-process run's encode workers from a forkserver
    (rebuilding their tokenizer) instead of forking. Every other test goes with its file's: a
    module's fixtures (a published output, a loaded tokenizer) are built in one worker. Scopes
    go out in next_scope's order."""

    def __init__(self, config: pytest.Config, log=None) -> None:
        super().__init__(config, log)
        self.beam_workers: set = set()
        self.beam_tests: set[str] | None = None  # read once the workers have collected

    def _split_scope(self, nodeid: str) -> str:
        if self.beam_tests is None:
            listing = Path(os.environ[BEAM_TESTS])
            self.beam_tests = set(listing.read_text().splitlines()) if listing.exists() else set()
        return "beam" if nodeid in self.beam_tests else nodeid.split("::", 1)[0]

    def _assign_work_unit(self, node) -> None:
        """Puts the scope this node should run next at the head of the queue it pops."""
        scope = next_scope(list(self.workqueue), node in self.beam_workers)
        self.workqueue.move_to_end(scope, last=False)
        if scope == "beam":
            self.beam_workers.add(node)
        super()._assign_work_unit(node)


def pytest_configure(config: pytest.Config) -> None:
    if config.getvalue("dist") == "loadgroup":  # the controller, before it starts the workers
        os.environ[BEAM_TESTS] = str(Path(tempfile.mkdtemp(prefix="kvtrace-tests-")) / "beam")


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.getvalue("dist") == "loadgroup":
        shutil.rmtree(Path(os.environ.pop(BEAM_TESTS)).parent, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before the worker reports its collection to the controller
def pytest_collection_finish(session: pytest.Session) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and BEAM_TESTS in os.environ:  # every worker collects the same tests
        listing = Path(os.environ[BEAM_TESTS])
        staged = listing.with_name(f"{listing.name}.{worker}")
        marked = [item.nodeid for item in session.items if item.get_closest_marker("beam")]
        staged.write_text("".join(f"{nodeid}\n" for nodeid in marked))
        staged.replace(listing)


def pytest_xdist_make_scheduler(config: pytest.Config, log) -> LoadScopeScheduling | None:
    if config.getvalue("dist") == "loadgroup":
        return LoadFileAndBeamScheduling(config, log)
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A test that loads Beam into a worker that had not must say so (mark it beam): else it
    lands beside the others and takes their forks away. A warning, not a failure: it is seen
    only where the test runs first in its worker, which depends on how xdist spread them."""
    loaded = "apache_beam" in sys.modules
    result = yield
    if not loaded and "apache_beam" in sys.modules and not item.get_closest_marker("beam"):
        warnings.warn(pytest.PytestWarning("this test loads Beam: mark it @pytest.mark.beam"))
    return result


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory) -> str:
    """Built once per run, however many xdist workers: building imports transformers (~2.5
    CPU-s), which a worker running no test that needs it then never pays. Read-only to tests."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return str(build_tiny_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer")))
    run = tmp_path_factory.getbasetemp().parent  # this run's, shared by its workers alone
    built = run / "tiny-tokenizer"
    with open(run / "tiny-tokenizer.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
        if not built.exists():  # staged, then renamed: a worker killed mid-build leaves no half
            staged = tmp_path_factory.mktemp("tiny-tokenizer")
            build_tiny_tokenizer(staged).rename(built)
    return str(built)


@pytest.fixture(scope="session")
def deepseek_tokenizer() -> str:
    return str(shared_path("tokenizers", "deepseek-r1"))


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> str:
    return str(shared_path("tokenizers", "qwen3"))


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> Iterator[str]:
    """A Pub/Sub emulator on loopback, started by the project's script; its address."""
    script = str(ROOT / "deploy" / "pubsub" / "emulator.sh")
    env = {**os.environ, "KVTRACE_PUBSUB_HOME": str(tmp_path_factory.mktemp("pubsub"))}
    started = subprocess.run(
        [script, "start", str(free_port())], env=env, capture_output=True, text=True
    )
    assert started.returncode == 0, started.stderr
    try:
        yield started.stdout.strip().rpartition("=")[2]
    finally:
        subprocess.run([script, "stop"], env=env, check=True)


@pytest.fixture
def s3(monkeypatch) -> Iterator[object]:
    """An S3 mock (moto) in this process, Beam's S3 filesystem set to reach it: a boto3 client
    of it (a test makes its buckets). Beam is imported: mark the test `beam`."""
    moto = pytest.importorskip("moto")
    import boto3
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    options = ["--s3_region_name=us-east-1", "--s3_access_key_id=testing"]
    options += ["--s3_secret_access_key=testing"]
    monkeypatch.setattr(FileSystems, "_pipeline_options", PipelineOptions(options))
    with moto.mock_aws():
        yield boto3.client("s3", region_name="us-east-1")
