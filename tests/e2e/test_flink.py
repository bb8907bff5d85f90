"""anonymize on a real Flink cluster (deploy/flink/local-cluster.sh, which .ci/run starts): two
nights with an id map give the local engine's trace, stats, dead letters and map, byte for byte."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from helpers import ON_FLINK, ROOT, SALT, anonymize_night, assert_same_output, chat, write_jsonl

pytestmark = ON_FLINK
FLINK = ("--config", str(ROOT / "configs" / "flink-local.yaml"))


def nights(folder: Path) -> list[Path]:
    """Two nights of chats; the second repeats some of the first's prompts and sessions."""
    return [
        write_jsonl(
            folder / f"night-{n}.jsonl",
            [
                chat(i + n, ts=86_400_000 * n + 1_000 * i, session=f"s{i % 4}", rotate=n)
                for i in range(12)
            ]
            + [{"broken": True}],
        )
        for n in (1, 2)
    ]


def without_run_ids(text: str) -> str:
    """Segment folders carry each run's own id, by design; the version's MAC and the next
    version's previous_sha256 cover them."""
    return re.sub(r"(segments/\d{6})-[0-9a-f]+", r"\1", text)


def map_contents(directory: Path) -> dict[str, bytes | str]:
    contents: dict[str, bytes | str] = {}
    for path in sorted(directory.rglob("*")):
        name = without_run_ids(str(path.relative_to(directory)))
        if path.suffix == ".json" and path.parent.name == "versions":
            record = json.loads(path.read_text())
            record.pop("mac")  # both digest the record's bytes, run ids included:
            record.pop("previous_sha256")
            contents[name] = without_run_ids(json.dumps(record, sort_keys=True))
        elif path.is_file() and path.name != "COMMITTED":
            contents[name] = path.read_bytes()
    return contents


def own_marks(folder: Path, engine: str) -> tuple[str, str]:
    """A folder of marks per engine: the two maps grow from the same nights and salt, so they
    are one map (the same id, the same bytes), and one folder of marks would take the second
    engine's first night for a rollback of the first engine's second."""
    return "--id-map-marks", str(folder / f"marks-{engine}")


def test_two_nights_on_flink_equal_the_local_engine(tiny_tokenizer, tmp_path, monkeypatch):
    monkeypatch.delenv("KVTRACE_SALT", raising=False)
    salt_file = tmp_path / "salt"
    salt_file.write_text(SALT)
    for engine, extra in (("local", ()), ("flink", FLINK)):
        for n, night in enumerate(nights(tmp_path), 1):
            assert (
                anonymize_night(
                    tiny_tokenizer,
                    [night],
                    tmp_path / f"{engine}-{n}",
                    "--id-map",
                    str(tmp_path / f"map-{engine}"),
                    "--salt-file",
                    str(salt_file),
                    *own_marks(tmp_path, engine),
                    *extra,
                )
                == 0
            )
    for n in (1, 2):
        assert_same_output(tmp_path / f"local-{n}", tmp_path / f"flink-{n}")
    assert map_contents(tmp_path / "map-local") == map_contents(tmp_path / "map-flink")


def test_a_successful_run_exits_without_a_traceback(tiny_tokenizer, tmp_path):
    """As a user runs it, in a process of its own: what it prints up to and at its exit (where
    Beam's in-process workers end) is kvtrace's, not a gRPC stream's traceback."""
    salt_file = tmp_path / "salt"
    salt_file.write_text(SALT)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from kvtrace.cli import main; sys.exit(main())",
            "anonymize",
            *FLINK,
            "--input",
            str(nights(tmp_path)[0]),
            "--output",
            str(tmp_path / "out"),
            "--tokenizer",
            tiny_tokenizer,
            "--block-size",
            "4",
            "--salt-file",
            str(salt_file),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={name: value for name, value in os.environ.items() if name != "KVTRACE_SALT"},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "manifest.json").is_file()
    assert "Traceback" not in done.stderr, done.stderr


# The killed TaskManager's data streams end in the in-process worker's threads, which say so.
@pytest.mark.beam
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_taskmanager_killed_mid_night_is_replaced_and_the_night_is_unchanged(
    tiny_tokenizer, tmp_path, monkeypatch
):
    import kvtrace.transforms.write.steps as write_steps
    from kvtrace.pipelines import child_process

    monkeypatch.delenv("KVTRACE_SALT", raising=False)
    salt_file = tmp_path / "salt"
    salt_file.write_text(SALT)
    night = nights(tmp_path)[0]
    killed = []
    write_shard = write_steps.write_shard

    def kill_once_then_write(*args, **kwargs):
        # The Python parts run in this process (LOOPBACK): the first trace shard's write kills
        # the TaskManager that sent it, while the night is under way.
        if not killed:
            killed.append(
                subprocess.run(
                    [str(ROOT / "deploy" / "flink" / "local-cluster.sh"), "kill-taskmanager"],
                    check=True,
                )
            )
        return write_shard(*args, **kwargs)

    runs = {}
    for engine, extra in (("local", ()), ("flink", FLINK)):
        if engine == "flink":
            monkeypatch.setattr(write_steps, "write_shard", kill_once_then_write)
            # The job in this process, so the hook above runs where `killed` is read (the child
            # it otherwise runs in is tested in tests/pipelines/test_child_process.py).
            monkeypatch.setattr(child_process, "run_in_child", lambda job, *unwind: job())
        runs[engine] = tmp_path / engine
        assert (
            anonymize_night(
                tiny_tokenizer,
                [night],
                runs[engine],
                "--id-map",
                str(tmp_path / f"map-{engine}"),
                "--salt-file",
                str(salt_file),
                *own_marks(tmp_path, engine),
                *extra,
            )
            == 0
        )
    assert killed
    with urllib.request.urlopen("http://127.0.0.1:8081/jobs/overview") as response:
        last = max(json.load(response)["jobs"], key=lambda job: job["start-time"])
    with urllib.request.urlopen(f"http://127.0.0.1:8081/jobs/{last['jid']}/exceptions") as response:
        failures = json.load(response)["exceptionHistory"]["entries"]
    assert last["state"] == "FINISHED" and failures  # it failed, restarted and finished
    assert_same_output(runs["local"], runs["flink"])
    assert map_contents(tmp_path / "map-local") == map_contents(tmp_path / "map-flink")
