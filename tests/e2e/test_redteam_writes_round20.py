"""Red team round 20, writes, stops and crashes: reproducers of holes left after the nineteenth
round's fixes. Each asserts the promised behaviour, so each fails until it is fixed.

With --direct_running_mode multi_processing the Beam engine's child had Beam start SDK worker
processes (then pipelines/sdk_worker.py, since removed), fresh interpreters that run the pipeline's steps, the id
map's commit (CommitIdMap) and its folders (BlockIds/WriteSegment) among them. A fault is
injected there as the system gives it: a sitecustomize that only those workers act on (the
CLI names itself in the environment they inherit) wraps one of kvtrace's own steps, so nothing
depends on timing.

Fixed by refusal (the brief's option C): kvtrace cannot hear those workers (what they commit, the
folders they make, their deaths), so the CLI refuses multi_processing in one line before any
work (runner.refuse_unsupervised_workers); the same faulty workers then never start. That rules
out the second test's assertion as written (no worker commits, so the map stays as it was)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers import ROOT, kvtrace_child, night_args

pytestmark = pytest.mark.slow

_MULTI_PROCESSING = ("--direct_running_mode", "multi_processing", "--direct_num_workers", "2")
_NAME_THE_CLI = "import os\nos.environ['ROUND20_CLI'] = str(os.getpid())"

# In an SDK worker: the night's id-map version committed (anonymize_night.commit_id_map), then
# the worker ends as given.
_AFTER_THE_COMMIT = """
import errno, os, signal
if os.environ.get("ROUND20_CLI"):
    from kvtrace.pipelines import anonymize_night
    _commit = anonymize_night.commit_id_map
    def _commit_then_end(*args, **kwargs):
        _commit(*args, **kwargs)
        {end}
    anonymize_night.commit_id_map = _commit_then_end
"""

# In an SDK worker: the disk fails (EIO) as it opens the night's first id-map segment file,
# after it made the new map's folders, before any commit.
_EIO_AS_A_WORKER_WRITES_A_SEGMENT = """
import errno, os
if os.environ.get("ROUND20_CLI"):
    _open = os.open
    def _fail(path, *args, **kwargs):
        if "/segments/" in str(path):
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))
        return _open(path, *args, **kwargs)
    os.open = _fail
"""


def _beam_night_with_a_faulty_worker(
    tmp_path: Path, tokenizer: str, id_map: Path, site: str, timeout: float = 120
) -> subprocess.CompletedProcess:
    """A Beam night in multi_processing mode on a new id map, its SDK workers running site."""
    packages = tmp_path.parent / f"{tmp_path.name}-site"  # beside tmp_path: it stays as it was
    packages.mkdir()
    (packages / "sitecustomize.py").write_text(site)
    night = night_args(tmp_path, tokenizer, tmp_path / "night" / "out", "--engine", "beam")
    night += [*_MULTI_PROCESSING, "--id-map", str(id_map), "--id-map-marks", str(tmp_path / "m")]
    return kvtrace_child(
        *night, prelude=_NAME_THE_CLI, timeout=timeout, env={"PYTHONPATH": f"{packages}:{ROOT}"}
    )


def _refused_before_any_work(said: subprocess.CompletedProcess, tmp_path: Path) -> None:
    """The CLI's one-line refusal (exit 2), and nothing made: no output, no map, no folder."""
    assert said.returncode == 2, said.stderr[-2000:]
    errors = [line for line in said.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "multi_processing is refused" in errors[0], said.stderr[-2000:]
    assert "Traceback" not in said.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "salt"]


@pytest.mark.beam
def test_a_beam_night_killed_in_an_sdk_worker_ends_with_an_error(tiny_tokenizer, tmp_path):
    """A night never hangs: a worker's death is the run's one-line error (child_process: "its
    death is this process's one-line error"). The OOM killer ending an SDK worker of a Beam
    night in multi_processing mode (here right after it committed the night's id-map version)
    left the CLI waiting for good: no process kvtrace supervises saw the death. The night is
    now refused before any work, so no such worker runs, and the error comes at once."""
    id_map = tmp_path / "map"
    site = _AFTER_THE_COMMIT.format(end="os.kill(os.getpid(), signal.SIGKILL)")
    try:
        said = _beam_night_with_a_faulty_worker(tmp_path, tiny_tokenizer, id_map, site, 60)
    except subprocess.TimeoutExpired:
        pytest.fail("the night hung after its SDK worker was killed")
    _refused_before_any_work(said, tmp_path)


@pytest.mark.beam
def test_a_beam_night_failing_in_an_sdk_worker_after_its_commit_says_the_map_was_extended(
    tiny_tokenizer, tmp_path
):
    """NIGHTLY.md / round 10: a failure after the map's commit names the version committed
    (publish.published_here). In multi_processing mode the commit ran in an SDK worker, which
    told nobody: a night failing after it said it changed nothing, its map extended. Refused
    before any work, no worker commits: the map is not even made, and the line says why."""
    id_map = tmp_path / "map"
    site = _AFTER_THE_COMMIT.format(end='raise OSError(errno.EIO, "Input/output error")')
    said = _beam_night_with_a_faulty_worker(tmp_path, tiny_tokenizer, id_map, site)
    _refused_before_any_work(said, tmp_path)


@pytest.mark.beam
def test_a_beam_night_failing_in_an_sdk_worker_leaves_no_folder_it_made(tiny_tokenizer, tmp_path):
    """storage.run_folders: "a run that publishes nothing leaves the operator's folders as they
    were". In multi_processing mode an SDK worker made the new map's folders and told nobody,
    so a night failing there (EIO on a segment) left the owner-only `maps/` behind. Refused
    before any work, the night makes none."""
    id_map = tmp_path / "maps" / "m"
    site = _EIO_AS_A_WORKER_WRITES_A_SEGMENT
    said = _beam_night_with_a_faulty_worker(tmp_path, tiny_tokenizer, id_map, site)
    _refused_before_any_work(said, tmp_path)
