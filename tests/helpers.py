"""Helpers the tests share: paths to ../shared, records of each shape, anonymize runs with their
outputs read back, free ports and streams. Fixtures are in conftest.py."""

from __future__ import annotations

import contextlib
import filecmp
import json
import os
import re
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from kvtrace.cli import main
from kvtrace.transforms.read.trace_io import Trace

if TYPE_CHECKING:  # annotations only: Beam is imported by the tests that run it
    from apache_beam.testing.test_stream import TestStream

    from kvtrace.pipelines.anonymize_streaming import StreamingConfig


TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent  # the checkout
# ../shared sits beside the checkout, on developers' machines and in CI alike.
SHARED = Path(os.environ.get("KVTRACE_SHARED", ROOT.parent / "shared"))


def shared_path(*parts: str) -> Path:
    """A file from ../shared; the test is skipped where ../shared is absent (a fresh machine)."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not present (../shared is only on the project's machines)")
    return path


def write_jsonl(path: Path, records: list) -> Path:
    """Records as JSONL; a str or bytes record is written as the raw line."""
    with open(path, "wb") as f:
        for record in records:
            if isinstance(record, bytes):
                f.write(record + b"\n")
            elif isinstance(record, str):
                f.write(record.encode() + b"\n")
            else:
                f.write(json.dumps(record).encode() + b"\n")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]


WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "again"]


def chat(i: int, ts: int, session: str | None = None, rotate: int = 0) -> dict:
    """A chat request in the tiny tokenizer's vocabulary. All share a system prompt, so blocks
    recur; i picks the user turn's length and rotate its words, so new blocks appear too."""
    words = WORDS[rotate:] + WORDS[:rotate]
    record = {
        "timestamp": ts,
        "messages": [
            {"role": "system", "content": "hello world this is a prompt about caching blocks"},
            {"role": "user", "content": " ".join(words[: 1 + i % len(words)])},
        ],
        "output_length": i,
    }
    if session:
        record["session_id"] = session
    return record


# Requests in each chat shape (OpenAI tool calling, Responses API, Anthropic Messages).
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
OPENAI_TOOL_TURN = {
    "timestamp": 1,
    "tools": TOOLS,
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
    ],
}
RESPONSES = {
    "timestamp": 1,
    "instructions": "Be brief.",
    "tools": [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Weather",
            "parameters": {"type": "object"},
        }
    ],
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": '{"temp_c": 21}'},
    ],
}
ANTHROPIC = {
    "timestamp": 1,
    "system": "Be brief.",
    "tools": [
        {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}
    ],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": '{"temp_c": 21}'}],
        },
    ],
}
SHAPES = {"openai-tool-calling": OPENAI_TOOL_TURN, "responses": RESPONSES, "anthropic": ANTHROPIC}


SALT = "a-salt-for-tests-that-is-long-enough"
FRANCE = {
    "timestamp": 0,
    "input": [{"role": "user", "content": "What is the capital of France ?"}],
    "output": "The capital of France is Paris .",
}
FINLAND = {
    "timestamp": 300,
    "input": [{"role": "user", "content": "What is the capital of Finland ?"}],
    "output": "The capital of Finland is Helsinki .",
}


def agent_log() -> list[dict]:
    """An agent's requests, linked as the logs link them (anonymize --emit-parents), in time
    order: (record, the index of the record its row's parent_row names, or None). Each link is
    a tool call's (a request naming a stored response by `previous_response_id` is a
    stored_context letter: docs/ANONYMIZE.md)."""
    call = {"id": "call_9", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    ask = [{"role": "user", "content": "List the files ."}]
    weather = [
        {"role": "user", "content": "Weather in Paris ?"},
        {"type": "function_call", "call_id": "c_x", "name": "w", "arguments": "{}"},
    ]

    def answer(output: str, call_id: str = "c_x") -> list[dict]:
        return [*weather, {"type": "function_call_output", "call_id": call_id, "output": output}]

    return [
        # 0: a Responses request; its response (resp_a) calls a tool
        (
            {
                "timestamp": 0,
                "session_id": "agent",
                "input": weather[:1],
                "response": {
                    "id": "resp_a",
                    "output": [{"type": "function_call", "call_id": "c_x", "name": "w"}],
                    "usage": {"output_tokens": 12},
                },
            },
            None,
        ),
        # 1 and 2: the tool's result, whose answer calls another tool, and that one's result
        (
            {
                "timestamp": 500,
                "session_id": "agent",
                "input": answer("21C"),
                "response": {
                    "id": "resp_s",
                    "output": [{"type": "function_call", "call_id": "c_y", "name": "w"}],
                    "usage": {"output_tokens": 3},
                },
            },
            0,
        ),
        (
            {
                "timestamp": 800,
                "session_id": "agent",
                "input": [
                    *answer("21C"),
                    {"type": "function_call", "call_id": "c_y", "name": "w", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c_y", "output": "dry"},
                ],
                "output_length": 3,
            },
            1,
        ),
        # 3 and 4: two more branches answering resp_a's call
        (
            {
                "timestamp": 1000,
                "session_id": "agent",
                "input": answer("22C"),
                "response": {"id": "resp_b", "output": [], "usage": {"output_tokens": 5}},
            },
            0,
        ),
        ({"timestamp": 1500, "session_id": "agent", "input": answer("20C"), "output_length": 7}, 0),
        # 5 and 6: a chat whose answer calls a tool, then the request holding its result
        (
            {
                "timestamp": 2000,
                "session_id": "s2",
                "messages": ask,
                "response": {"choices": [{"message": {"role": "assistant", "tool_calls": [call]}}]},
                "output_length": 9,
            },
            None,
        ),
        (
            {
                "timestamp": 2600,
                "session_id": "s2",
                "messages": [
                    *ask,
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_9", "content": "a.txt b.txt"},
                ],
                "output_length": 4,
            },
            5,
        ),
        # 7: a lone request answering a call (of no session, it names none)
        ({"timestamp": 3000, "input": answer("gone", "c_gone"), "output_length": 2}, None),
    ]


def anonymize(tokenizer, inputs, out: Path, *extra: str) -> int:
    args = ["anonymize", "--output", str(out), "--tokenizer", tokenizer, *extra]
    for path in inputs:
        args += ["--input", str(path)]
    return main(args)


KVTRACE = [sys.executable, "-m", "kvtrace.cli"]  # the CLI as a command runs it


def night_args(
    tmp_path: Path, tokenizer: str, out: Path, *extra: str, records: list | None = None
) -> list[str]:
    """An anonymize run's arguments on a log of records (by default 12 chats) and one dead
    letter, for tests about a whole night's process: written into tmp_path with a salt file,
    the default log on first use only, given records each time."""
    src = tmp_path / "in.jsonl"
    if records is not None or not src.exists():
        default = [chat(i, 1000 * i) for i in range(12)]
        write_jsonl(src, [*(default if records is None else records), b"{broken"])
        (tmp_path / "salt").write_text(SALT)
    return [
        "anonymize",
        "--input",
        str(src),
        "--tokenizer",
        tokenizer,
        "--block-size",
        "4",
        "--salt-file",
        str(tmp_path / "salt"),
        "--output",
        str(out),
        *extra,
    ]


def kvtrace_child(
    *args: str,
    prelude: str = "",
    timeout: float = 300,
    text: bool = True,
    env: dict[str, str] | None = None,
    **kwargs,
) -> subprocess.CompletedProcess:
    """The CLI in a child process, for tests about the process (its exit code, its streams, a
    fault injected by prelude: Python run before main), never raising on its exit code. The
    checkout's code, offline; env adds to this process's environment."""
    code = f"{prelude}\nimport sys\nfrom kvtrace.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=text,
        timeout=timeout,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", **(env or {})},
        **kwargs,
    )


def under_rlimit(command: list[str], limit: str, value: int) -> list[str]:
    """command run under a resource limit (resource.RLIMIT_*) that the new process sets itself
    before it execs: a preexec_fn runs Python between fork and exec, unsafe in a test worker
    where gRPC's threads live (its fork handlers aborted the child, exit -6)."""
    setup = (
        f"import os, resource, sys; resource.setrlimit(resource.{limit}, ({value}, {value})); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    return [sys.executable, "-c", setup, *command]


def peak_rss_mb(command: list[str], cwd: Path = ROOT) -> tuple[int, int, str]:
    """(exit code, peak RSS in MB of the command and its children, stderr) of a command run in
    a child of a fresh interpreter: this process's own memory is not counted."""
    probe = (
        "import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
        "print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, *command],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    code, peak = done.stdout.split()[-2:]
    return int(code), int(peak), done.stderr


def trace(out: Path) -> list[dict]:
    return [row for path in sorted(out.glob("trace-*.jsonl")) for row in read_jsonl(path)]


def anonymize_night(tokenizer: str, inputs: list[Path], out: Path, *extra: str) -> int:
    """One night of the id-map tests: anonymize at block size 4."""
    return anonymize(tokenizer, inputs, out, "--block-size", "4", *extra)


def trace_bytes(out: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(out.glob("trace-*.jsonl")))


def assert_same_output(left: Path, right: Path) -> None:
    names = sorted(p.name for p in left.iterdir())
    assert names == sorted(p.name for p in right.iterdir())
    assert "manifest.json" in names
    _, mismatch, errors = filecmp.cmpfiles(left, right, names, shallow=False)
    assert not mismatch and not errors
    folders = [Path(f"{out}-rejected") for out in (left, right)]
    assert folders[0].exists() == folders[1].exists()  # none where nothing was rejected
    if folders[0].exists():
        a, b = (published_letters(folder) for folder in folders)
        # Named by their runs; their bytes in the one declared order (dead_letters.py).
        assert a.read_bytes() == b.read_bytes()


def published_letters(folder: Path) -> Path:
    """The one run's dead letters a folder holds (rejected-RUNID.jsonl), nothing else beside."""
    (letters,) = folder.iterdir()
    assert re.fullmatch(r"rejected-[0-9a-f]{12}\.jsonl", letters.name), letters.name
    return letters


def trace_of(rows: list[tuple[int, float, list[int]]], block_size: int = 4) -> Trace:
    """A trace from (file index, timestamp, hash ids) rows: files in order, lines counted per
    file, each row's last block one token short."""
    rows = sorted(rows, key=lambda r: r[0])  # file order: files first, then as given
    lengths = np.array([len(ids) for _, _, ids in rows], dtype=np.int64)
    lines = np.zeros(len(rows), dtype=np.int64)
    for i, (file, _, _) in enumerate(rows):
        lines[i] = 1 + sum(1 for f, _, _ in rows[:i] if f == file)
    return Trace(
        timestamp=np.array([t for _, t, _ in rows], dtype=np.float64),
        input_length=np.maximum(lengths * block_size - 1, 0),
        output_length=np.ones(len(rows), np.int64),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        ids=np.array([i for _, _, ids in rows for i in ids], dtype=np.int64),
        session=None,
        line=lines,
        file_index=np.array([f for f, _, _ in rows], dtype=np.int32),
        files=[f"f{i}" for i in range(3)],
    )


# Tests on the local Flink cluster (tests/e2e/test_flink.py, test_kafka_flink.py).
ON_FLINK = [
    pytest.mark.slow,
    pytest.mark.flink,
    pytest.mark.beam,  # they submit Beam pipelines from the test process
    pytest.mark.skipif(
        not os.environ.get("KVTRACE_FLINK"),
        reason=(
            "needs the cluster: deploy/flink/local-cluster.sh start, then KVTRACE_FLINK=1 "
            "deploy/flink/local-cluster.sh python -m pytest -m flink (.ci/run does both)"
        ),
    ),
]


def free_port() -> int:
    """A loopback port nothing listens on (once the probe closes)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """Distinct loopback ports nothing listens on (the probes are held until all are bound)."""
    import contextlib
    import socket

    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]


# Streaming end to end (tests/e2e/test_pubsub.py, test_kafka_flink.py). A generous bound for a
# loaded 2-core machine; the wait returns as soon as every request is accounted for.
STREAM_S = 300
STREAM_START_MS = 1_767_225_600_000  # 2026-01-01: long before the sources' clocks, the watermark


def stream_request(i: int, total: int) -> dict:
    """Request i of total: unique timestamps over three 1-minute windows, a shared system
    prompt so that ids repeat."""
    return {
        "timestamp": STREAM_START_MS + i * (180_000 // total) + i % 7,
        "output_length": 3,
        "messages": [
            {"role": "system", "content": "you answer questions about caches"},
            {"role": "user", "content": f"question {i}: " + "why " * (i % 5)},
        ],
    }


def stream_counts(dead_letter: str | Path) -> dict[str, int]:
    """A stream's run counts: its one run-counts-KEY.json (named by its output, as its letters
    are) in its dead-letter folder; ValueError when there is none."""
    (path,) = Path(dead_letter).glob("run-counts-*.json")
    return json.loads(path.read_text())


def stream_accounted(output: Path) -> int:
    """Requests a stream has published or dead-lettered so far: its run counts, the operator's,
    beside its dead letters (the CLI's default DIR-rejected), never in the published folder."""
    try:
        counts = stream_counts(f"{output}-rejected")
    except (FileNotFoundError, ValueError):  # not yet written
        return 0
    assert counts["read"] == counts["exported"] + counts["rejected"], counts  # nothing lost
    return counts["read"]


@contextlib.contextmanager
def running_stream(
    tmp_path: Path, tokenizer: str, source: str, env: dict[str, str], *extra: str
) -> Iterator[Callable[[int], int]]:
    """`anonymize --streaming` (1-minute windows, a fixed salt) as a process writing into
    tmp_path/stream; yields wait_for(n): returns the requests accounted for once there are n,
    failing if the stream died or took STREAM_S. Stopped on leaving."""
    import subprocess
    import sys
    import time

    (tmp_path / "salt").write_bytes(b"s" * 32)
    output = tmp_path / "stream"
    stream = subprocess.Popen(
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
            "1m",
            "--tokenizer",
            tokenizer,
            "--block-size",
            "4",
            "--salt-file",
            str(tmp_path / "salt"),
            *extra,
        ],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def wait_for(requests: int) -> int:
        deadline = time.monotonic() + STREAM_S
        # Polled: a stream has no end to wait for; each look is one file read.
        while (
            stream_accounted(output) < requests
            and stream.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.25)
        assert stream.poll() is None, stream.stderr.read()
        return stream_accounted(output)

    try:
        yield wait_for
    finally:
        stream.terminate()
        stream.wait()


def run_stream_until_accounted(
    tmp_path: Path, tokenizer: str, source: str, total: int, env: dict[str, str], *extra: str
) -> None:
    """A stream stopped once all total requests are accounted for, none twice."""
    with running_stream(tmp_path, tokenizer, source, env, *extra) as wait_for:
        wait_for(total)
    assert stream_accounted(tmp_path / "stream") == total


def check_stream_against_batch(tmp_path: Path, tokenizer: str, records: list[dict]) -> None:
    """Every request once, in a window or as a late dead letter; the windows concatenated equal
    the batch job's trace of the requests they hold."""
    letters = [
        json.loads(line)
        for path in (tmp_path / "stream-rejected").rglob("*.jsonl")
        for line in path.read_text().splitlines()
    ]
    assert {letter["error"] for letter in letters} <= {"late"}
    late = {int(letter["message"].split()[2]) for letter in letters}
    windows = sorted(p for p in (tmp_path / "stream").iterdir() if p.is_dir())
    streamed = [
        line
        for window in windows
        for path in sorted(window.glob("trace-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert len(streamed) + len(late) == len(records)
    kept = write_jsonl(tmp_path / "kept.jsonl", [r for r in records if r["timestamp"] not in late])
    assert (
        main(
            [
                "anonymize",
                "--input",
                str(kept),
                "--output",
                str(tmp_path / "batch"),
                "--tokenizer",
                tokenizer,
                "--block-size",
                "4",
                "--salt-file",
                str(tmp_path / "salt"),
            ]
        )
        == 0
    )
    assert streamed == [
        line
        for path in sorted((tmp_path / "batch").glob("trace-*.jsonl"))
        for line in path.read_text().splitlines()
    ]


# The streaming driver under exact watermark control (tests/pipelines/test_anonymize_streaming.py
# and its whole runs, tests/e2e/test_streaming_cli.py).
STREAM_SALT = "a-streaming-test-salt-0123456789abcdef"
MINUTE = 60_000


def stream_chat(ts: int, i: int) -> dict:
    return {
        "timestamp": ts,
        "session_id": f"s{i % 2}",
        "output_length": 3,
        "messages": [
            {"role": "system", "content": "a shared system prompt about caches"},
            {"role": "user", "content": f"question {i} " + "the quick brown fox " * (i % 4)},
        ],
    }


def message(record: dict) -> bytes:
    return json.dumps(record).encode()


def streaming_config(
    tmp_path: Path, tokenizer: str, lateness_ms: int = 0, idle_ms: int = 10_000
) -> StreamingConfig:
    from kvtrace.pipelines.anonymize_config import AnonymizeConfig
    from kvtrace.pipelines.anonymize_streaming import StreamingConfig
    from kvtrace.transforms.encode.salt import SaltSource
    from kvtrace.transforms.encode.tokenize import tokenizer_sha256

    output = tmp_path / "stream"
    output.mkdir()
    (tmp_path / "staging").mkdir()
    job = AnonymizeConfig(
        inputs=(),
        output=str(output),
        staging=str(tmp_path / "staging"),
        tokenizer=tokenizer,
        salt=SaltSource("env", "KVTRACE_SALT"),
        dead_letter=str(tmp_path / "stream-rejected"),
        block_size=4,
        # As the command gives them: the digests the gate checks (the pure
        # tests' "x" names no tokenizer folder).
        tokenizer_sha256=tokenizer_sha256(tokenizer) if Path(tokenizer).is_dir() else {},
    )
    return StreamingConfig(job, "pubsub:projects/p/subscriptions/s", MINUTE, lateness_ms, idle_ms)


def run_stream(config: StreamingConfig, stream: TestStream) -> None:
    """The stream's pipeline on Beam's direct runner (Beam imported here: helpers stay light)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner

    from kvtrace.pipelines.anonymize_streaming import build

    with beam.Pipeline(
        runner=BundleBasedDirectRunner(), options=PipelineOptions(["--streaming"])
    ) as pipeline:
        build(pipeline | stream, config)


def letters(folder: Path) -> list[dict]:
    return [
        json.loads(line)
        for path in sorted(folder.rglob("rejected-*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def check_letters_published_by_the_protocol(config: StreamingConfig) -> set[str]:
    """The dead-letter folder as publish.DeadLetterRun leaves it once every run has settled:
    one owner-only file per run, named by a published window (or by the cumulative.json
    written with lone letters), and the stream's run counts, nothing staged left; the runs'
    names."""
    folder = Path(config.job.dead_letter)
    counts = Path(config.run_counts())
    windows = {p.name for p in Path(config.job.output).iterdir() if p.is_dir()}
    runs = set()
    assert counts.stat().st_mode & 0o077 == 0
    for entry in set(folder.iterdir()) - {counts}:
        named = f"rejected-{config.stream_key()}-"  # named by the stream's output
        assert entry.is_file() and entry.name.startswith(named) and entry.name.endswith(".jsonl"), (
            entry.name
        )  # no staging folder left behind
        assert entry.stat().st_mode & 0o077 == 0  # private, as the batch job's letters
        runs.add(entry.name[len(named) : -len(".jsonl")])
    assert {run for run in runs if not run.startswith("letters-")} <= windows
    return runs


def render_deploy(out: Path, **values: str) -> Path:
    """deploy/render.sh run on a copy of deploy/values.env whose named values are replaced by
    values (the others as shipped); the folder it wrote, out."""
    text = (ROOT / "deploy" / "values.env").read_text()
    for name, value in values.items():
        text, count = re.subn(rf"^{name}=.*$", f"{name}={value}", text, flags=re.M)
        assert count == 1, name
    site = out.parent / f"{out.name}.env"
    site.write_text(text)
    subprocess.run(
        [str(ROOT / "deploy" / "render.sh"), str(site), str(out)], check=True, capture_output=True
    )
    return out


# Thrift's compact protocol, as far as a Parquet footer and page header need it: the red teams
# edit real footers field by field (tests/e2e/test_redteam_gate_round9.py, ...).


def thrift_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def thrift_uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def _thrift_value(data: bytes, at: int, kind: int) -> tuple[object, int]:
    if kind in (1, 2):  # booleans live in the field header
        return kind == 1, at
    if kind == 3:
        return data[at], at + 1
    if kind in (4, 5, 6):
        raw, at = thrift_varint(data, at)
        return (raw >> 1) ^ -(raw & 1), at
    if kind == 7:
        return data[at : at + 8], at + 8
    if kind == 8:
        size, at = thrift_varint(data, at)
        return data[at : at + size], at + size
    if kind == 9:
        head, at = data[at], at + 1
        count, item = head >> 4, head & 15
        if count == 15:
            count, at = thrift_varint(data, at)
        items = []
        for _ in range(count):
            value, at = (data[at] == 1, at + 1) if item in (1, 2) else _thrift_value(data, at, item)
            items.append(value)
        return (item, items), at
    if kind == 12:
        return thrift_decode(data, at)
    raise ValueError(f"thrift type {kind}")


def thrift_decode(data: bytes, at: int = 0) -> tuple[list, int]:
    """A struct as [field id, type, value] triples."""
    fields, last = [], 0
    while data[at]:
        head, at = data[at], at + 1
        kind, delta = head & 15, head >> 4
        if delta:
            number = last + delta
        else:
            raw, at = thrift_varint(data, at)
            number = (raw >> 1) ^ -(raw & 1)
        value, at = _thrift_value(data, at, kind)
        fields.append([number, kind, value])
        last = number
    return fields, at + 1


def _thrift_encoded(kind: int, value: object) -> bytes:
    if kind == 3:
        return bytes([value])
    if kind in (4, 5, 6):
        return thrift_uvarint((value << 1) ^ (value >> 63))
    if kind == 7:
        return value
    if kind == 8:
        return thrift_uvarint(len(value)) + value
    if kind == 9:
        item, items = value
        head = bytes([len(items) << 4 | item]) if len(items) < 15 else bytes([0xF0 | item])
        head += thrift_uvarint(len(items)) if len(items) >= 15 else b""
        return head + b"".join(
            bytes([1 if v else 2]) if item in (1, 2) else _thrift_encoded(item, v) for v in items
        )
    return thrift_encode(value)


def thrift_encode(fields: list) -> bytes:
    out, last = bytearray(), 0
    for number, kind, value in fields:
        wire = (1 if value else 2) if kind in (1, 2) else kind
        delta = number - last
        out += (
            bytes([delta << 4 | wire])
            if 0 < delta <= 15
            else bytes([wire]) + thrift_uvarint(number)
        )
        out += b"" if kind in (1, 2) else _thrift_encoded(kind, value)
        last = number
    return bytes(out + b"\0")


def thrift_field(fields: list, number: int) -> list:
    return next(f for f in fields if f[0] == number)


def parquet_footer(parquet: bytes) -> tuple[list, bytes]:
    """A Parquet file's footer (FileMetaData, decoded) and the bytes before it."""
    size = struct.unpack("<i", parquet[-8:-4])[0]
    return thrift_decode(parquet[-8 - size : -8])[0], parquet[: -8 - size]


def with_parquet_footer(body: bytes, footer: list) -> bytes:
    encoded = thrift_encode(footer)
    return body + encoded + struct.pack("<i", len(encoded)) + b"PAR1"


CLEAN_CHAT_MS = 60_000  # the one chat of the clean log beside an edited Parquet (parquet_night)


def parquet_night(tokenizer: str, tmp_path: Path, footer: list, body: bytes) -> Path:
    """The night of the Parquet file the footer and body make, beside a clean log of one chat
    at CLEAN_CHAT_MS (a night whose only file is refused whole publishes nothing, and so no
    letter to look at); its output folder."""
    source = tmp_path / "log.parquet"
    source.write_bytes(with_parquet_footer(body, footer))
    clean = tmp_path / "clean.jsonl"
    write_jsonl(clean, [chat(6, CLEAN_CHAT_MS)])
    out = tmp_path / "out"
    assert (
        anonymize(tokenizer, [source, clean], out, "--max-rejected-fraction", "1", "--quiet") == 0
    )
    return out


# Engine hash captures (anonymize --capture), each in its writer's shape (docs/CAPTURES.md).
def kvtrace_token_ids(tokenizer: str, records: list[dict]) -> list[list[int]]:
    """Each record's prompt token ids as kvtrace's own encoder renders and tokenizes them."""
    from kvtrace.transforms.encode.encode_requests import EncodeOptions, open_encoder
    from kvtrace.transforms.encode.salt import SaltSource
    from kvtrace.transforms.read.records import parse_record

    encoder = open_encoder(EncodeOptions(tokenizer, SaltSource("random", inline=b"s" * 32)))
    requests = [parse_record(json.dumps(r).encode(), "in.jsonl") for r in records]
    rendered, failed = encoder.render(requests)
    assert not failed
    prompts = encoder.tokenize(rendered)[0]
    return [np.frombuffer(data, "<u4").tolist() for data in prompts]


def dynamo_request_end(
    ts: int, token_ids: list[int], block_size: int, output_tokens: int, session: str | None = None
) -> dict:
    """A request_end record of Dynamo's request trace (lib/llm/src/request_trace/record.rs), its
    hashes the engine's chain over every block, the partial last one included (replay.rs)."""
    from kvtrace.transforms.encode.blocks import token_bytes
    from kvtrace.transforms.encode.schemes import dynamo_sequence_hashes

    record = {
        "schema": "dynamo.request.trace.v1",
        "event_type": "request_end",
        "event_time_unix_ms": ts + 25,
        "request": {
            "request_id": f"req-{ts}",
            "output_tokens": output_tokens,
            "request_received_ms": ts,
            "replay": {
                "trace_block_size": block_size,
                "input_length": len(token_ids),
                "input_sequence_hashes": dynamo_sequence_hashes(token_bytes(token_ids), block_size),
            },
        },
    }
    if session is not None:
        record["agent_context"] = {"session_id": session, "parent_session_id": None}
    return record


def lmcache_builtin_chunk_hashes(token_ids: list[int], chunk_size: int) -> list[int]:
    """LMCache's TokenHasher.compute_chunk_hashes with Python's builtin hash (its fallback when
    no vLLM hash function loads): rolling over full chunks only, from hash((0, (0,), None))."""
    prefix = hash((0, (0,), None))
    hashes = []
    for start in range(0, len(token_ids) - len(token_ids) % chunk_size, chunk_size):
        prefix = hash((prefix, tuple(token_ids[start : start + chunk_size]), None))
        hashes.append(prefix)
    return hashes


def lmcache_lookup(seconds: float, request_id: str, token_ids: list[int], chunk_size: int) -> dict:
    """A line of LMCache's lookup hash log (mp_observability/subscribers/logging/lookup_hash.py):
    hashes written as hex()."""
    return {
        "timestamp": seconds,
        "request_id": request_id,
        "model_name": "tiny",
        "chunk_size": chunk_size,
        "seq_len": len(token_ids),
        "dtypes": ["torch.bfloat16"],
        "shapes": [[2, 4, chunk_size, 8]],
        "chunk_hashes": [hex(h) for h in lmcache_builtin_chunk_hashes(token_ids, chunk_size)],
    }


def records_of(piece, max_record_bytes: int) -> list:
    """read_range's items but a Parquet file's share record (read/sources.RowShare): no record
    nor letter, only tallied."""
    from kvtrace.transforms.read.sources import read_range

    return [
        item for item in read_range(piece, max_record_bytes) if getattr(item, "share", None) is None
    ]


# A kvtrace_child prelude: SIGTERM as the run opens its output's staging folder (after the
# plan, before any work), for tests of what a stopped run leaves.
STOP_AS_THE_OUTPUT_IS_STAGED = """
import os, signal
_open = os.open
def _open_then_stop(path, *args, **kwargs):
    handle = _open(path, *args, **kwargs)
    if ".kvtrace-staging-" in str(path):
        os.kill(os.getpid(), signal.SIGTERM)
    return handle
os.open = _open_then_stop
"""


# A keyed id map kvtrace wrote over a few nights, for the tests that damage one.
MAP_SALT = b"keyed-map-test-salt-of-32-bytes!"
MAP_NIGHT_ZERO_MS = 1_700_000_000_000
MAP_NIGHT_PROMPTS = [
    "the quick brown fox jumps over the lazy dog",
    "What is the capital of France ? The capital of France is Paris .",
    "What is the capital of Finland ? The capital of Finland is Helsinki .",
]


def map_night(folder: Path, day: int) -> Path:
    """Night `day`'s one-request input (its prompt twice, so blocks repeat across nights)."""
    prompt = MAP_NIGHT_PROMPTS[day]
    return write_jsonl(
        folder / f"night{day}.jsonl",
        [
            {
                "timestamp": MAP_NIGHT_ZERO_MS + day * 86_400_000,
                "output_length": 5,
                "messages": [{"role": "user", "content": f"{prompt} {prompt}"}],
            }
        ],
    )


def map_of_nights(tokenizer: str, folder: Path, nights: int) -> list[str]:
    """A keyed map kvtrace wrote over `nights` nights in folder; returns the flags naming it."""
    folder.mkdir(exist_ok=True)
    salt = folder / "salt"
    salt.write_bytes(MAP_SALT)
    common = ["--id-map", str(folder / "map"), "--id-map-marks", str(folder / "marks")]
    common += ["--salt-file", str(salt)]
    for day in range(nights):
        out = folder / f"out{day}"
        assert anonymize_night(tokenizer, [map_night(folder, day)], out, *common) == 0
    return common


# The kernel's POSIX ACL attribute (version 2, then (tag, perm, id) entries): user::rwx,
# user:1000:rwx, group::r-x, mask::rwx, other::r-x, as `setfacl -d -m u:1000:rwx` leaves on a
# team's shared folder (as system.posix_acl_default: every entry made in it takes an access ACL).
_UNDEFINED_ID = 0xFFFFFFFF
DEFAULT_ACL = struct.pack("<I", 2) + b"".join(
    struct.pack("<HHI", *entry)
    for entry in (
        (0x01, 7, _UNDEFINED_ID),
        (0x02, 7, 1000),
        (0x04, 5, _UNDEFINED_ID),
        (0x10, 7, _UNDEFINED_ID),
        (0x20, 5, _UNDEFINED_ID),
    )
)


def qwen3_run(
    tmp_path: Path, records: list[dict], *options: str
) -> tuple[int, list[dict], list[dict]]:
    """(exit code, trace rows, dead letters) of one anonymize run on the records, with the real
    Qwen3 tokenizer (the real-log tests: lengths as the engine's tokenizer gives them)."""
    source = write_jsonl(tmp_path / "in.jsonl", records)
    (tmp_path / "salt").write_text(SALT)
    out, dead = tmp_path / "out", tmp_path / "dead"
    code = anonymize(
        str(shared_path("tokenizers", "qwen3")),
        [source],
        out,
        "--salt-file",
        str(tmp_path / "salt"),
        "--dead-letter",
        str(dead),
        "--quiet",
        *options,
    )
    return code, trace(out) if out.exists() else [], letters(dead) if dead.exists() else []


def staged_record_prelude(damage: str, holding: str = "segments") -> str:
    """A kvtrace_child prelude that damages a Beam night's record (anonymize_night.
    _stage_record) between the job that stages it and the launcher that commits and publishes
    from it: damage, statements on `record` (and `config`), runs on a record holding `holding`."""
    import textwrap

    body = textwrap.indent(textwrap.dedent(damage).strip(), " " * 8)
    return (
        "\nimport kvtrace.pipelines.anonymize_night as night\n_stage = night._stage_record\n"
        f"def _damaged(config, record):\n    if {holding!r} in record:\n{body}\n"
        "    return _stage(config, record)\nnight._stage_record = _damaged\n"
    )
