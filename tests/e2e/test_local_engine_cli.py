"""The local engine (no Beam) against the Beam pipeline: byte-identical output for the same input
and config, and the engine chosen as the flags say."""

from __future__ import annotations

import gzip
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, SALT, anonymize, assert_same_output, chat, published_letters, write_jsonl
from kvtrace.cli import main
from kvtrace.pipelines import local_workers

pytestmark = pytest.mark.smoke  # in the fast set: one whole run per command (conftest)

BAD = [
    b"{not json",
    {"messages": []},
    {"timestamp": -5, "prompt": "x"},
    {"prompt": "no time"},
    {"timestamp": 1, "messages": [{"role": "developer", "content": "raises"}]},
]


def mixed_inputs(folder: Path) -> list[Path]:
    """Chats with sessions, prompts (some with their response times), token ids and bad records
    over files of each kind."""
    folder.mkdir()
    first = [
        chat(i, 5_000 + 70_000 * (i % 4) + i, session=f"s{i % 3}", rotate=i % 5) for i in range(40)
    ] + BAD
    second = [
        {
            "timestamp": 9_000 + i,
            "prompt": "the quick brown fox " * (1 + i % 6),
            "output": "the lazy dog",
        }
        | ({"latency_ms": 100 + i} if i % 3 else {})
        for i in range(15)
    ]
    second += [{"timestamp": 9_500 + i, "input_ids": list(range(i, i + 9))} for i in range(10)]
    with gzip.open(folder / "c.jsonl.gz", "wb") as f:
        f.write(b"".join(json.dumps(r).encode() + b"\n" for r in second[::2]))
    return [
        write_jsonl(folder / "a.jsonl", first),
        write_jsonl(folder / "b.jsonl", second[1::2]),
        folder / "c.jsonl.gz",
    ]


@pytest.mark.parametrize("block_size, beam", [("2", []), ("16", []), ("16", ["--route-sessions"])])
@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_local_and_beam_engines_write_the_same_bytes(tiny_tokenizer, tmp_path, block_size, beam):
    """Also with each session's requests routed to one Beam worker (two of them)."""
    inputs = mixed_inputs(tmp_path / "in")
    flags = ["--block-size", block_size, "--salt-file", str(write_salt(tmp_path))]
    if beam:
        beam = [*beam, "--direct_num_workers", "2", "--direct_running_mode", "multi_threading"]
    assert anonymize(tiny_tokenizer, inputs, tmp_path / "local", *flags) == 0
    assert (
        anonymize(tiny_tokenizer, inputs, tmp_path / "beam", *flags, "--engine", "beam", *beam) == 0
    )
    assert_same_output(tmp_path / "local", tmp_path / "beam")
    letters = [
        line
        for p in (tmp_path / "local-rejected").glob("*.jsonl")
        for line in p.read_bytes().splitlines()
    ]
    assert len(letters) == len(BAD)


@pytest.mark.slow  # over a second: .ci/run runs the slow set
@pytest.mark.parametrize("start", ["fork", "forkserver"])
def test_worker_processes_change_no_byte(tiny_tokenizer, tmp_path, monkeypatch, start):
    """Workers forked from the loaded process (a fresh CLI process) or started clean (where a
    fork is unsafe) write what one process writes."""
    monkeypatch.setattr(local_workers, "can_fork", lambda: False)
    inputs = mixed_inputs(tmp_path / "in")
    salt = ["--salt-file", str(write_salt(tmp_path))]
    assert anonymize(tiny_tokenizer, inputs, tmp_path / "one", *salt) == 0
    flags = [
        *salt,
        "--processes",
        "3",
        "--output",
        str(tmp_path / "three"),
        "--tokenizer",
        tiny_tokenizer,
        *(f"--input={path}" for path in inputs),
    ]
    if start == "forkserver":
        assert main(["anonymize", *flags]) == 0
    else:
        run = subprocess.run(
            [sys.executable, "-m", "kvtrace.cli", "anonymize", *flags],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        assert "worker processes forked from this one" in run.stderr
        assert "huggingface/tokenizers" not in run.stderr  # told at fork, not left to warn
    assert_same_output(tmp_path / "one", tmp_path / "three")
    assert (
        published_letters(tmp_path / "one-rejected").read_bytes()
        == published_letters(tmp_path / "three-rejected").read_bytes()
    )


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_engines_agree_on_real_chat_logs(deepseek_tokenizer, tmp_path):
    examples = sorted(ROOT.joinpath("examples", "requests").glob("*.jsonl"))
    flags = ["--block-size", "16", "--salt-file", str(write_salt(tmp_path))]
    assert anonymize(deepseek_tokenizer, examples, tmp_path / "local", *flags) == 0
    assert (
        anonymize(deepseek_tokenizer, examples, tmp_path / "beam", *flags, "--engine", "beam") == 0
    )
    assert_same_output(tmp_path / "local", tmp_path / "beam")


def test_local_engine_refuses_too_many_rejected_before_writing(tiny_tokenizer, tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0)] + BAD)
    assert anonymize(tiny_tokenizer, [src], tmp_path / "out", "--max-rejected-fraction", "0.5") == 1
    assert "too much input rejected" in capsys.readouterr().err
    assert not list((tmp_path / "out").glob("trace-*"))


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_only_rejected_records_publish_nothing_on_either_engine(tiny_tokenizer, tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", BAD)
    for engine in ("local", "beam"):  # whatever the bound: there is nothing to publish
        assert (
            anonymize(
                tiny_tokenizer,
                [src],
                tmp_path / engine,
                "--engine",
                engine,
                "--max-rejected-fraction",
                "1",
            )
            == 1
        )
        assert "every record rejected: nothing to publish" in capsys.readouterr().err
        assert not (tmp_path / engine / "manifest.json").exists()


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--engine", "local", "--direct_num_workers", "2"],
            "unknown options for the local engine",
        ),
        pytest.param(  # Beam's own options are parsed (by Beam) before the refusal
            ["--engine", "beam", "--processes", "2"],
            "--processes is for the local engine",
            marks=pytest.mark.beam,
        ),
        (["--route-sessions"], "--route-sessions is for --engine beam"),
    ],
)
def test_local_engine_refuses_what_only_beam_does(tiny_tokenizer, tmp_path, capsys, flags, message):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0)])
    assert (
        main(
            [
                "anonymize",
                "--input",
                str(src),
                "--output",
                str(tmp_path / "o"),
                "--tokenizer",
                tiny_tokenizer,
                *flags,
            ]
        )
        == 2
    )
    assert message in capsys.readouterr().err


def write_salt(folder: Path) -> Path:
    (folder / "salt").write_text(SALT)
    return folder / "salt"


def map_rows(directory: Path) -> tuple[dict, list]:
    """A map's published state without run ids: next ids, origin, and every (kind, hi, lo, id)."""
    import pyarrow.parquet as pq

    version = json.loads((directory / "CURRENT").read_text())["version"]
    metadata = json.loads((directory / "versions" / f"{version:06d}.json").read_text())
    rows = sorted(
        (kind, *row.values())
        for kind, files in metadata["files"].items()
        for name in files
        for row in pq.read_table(directory / name).to_pylist()
    )
    return {k: metadata[k] for k in ("next_id", "timestamp_origin_ms", "version")}, rows


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_engines_extend_an_id_map_alike_night_after_night(tiny_tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr("kvtrace.transforms.ids.id_map.MAX_SEGMENTS", 2)  # night 3 compacts
    day = 86_400_000
    nights = [
        write_jsonl(
            tmp_path / f"n{k}.jsonl",
            [chat(i, k * day + 50 * i, f"u{i % 4 + k}", rotate=k % 3) for i in range(25)],
        )
        for k in range(3)
    ]
    salt = str(write_salt(tmp_path))
    for engine in ("local", "beam"):
        for k, night in enumerate(nights):
            assert (
                anonymize(
                    tiny_tokenizer,
                    [night],
                    tmp_path / f"{engine}{k}",
                    "--engine",
                    engine,
                    "--id-map",
                    str(tmp_path / f"map-{engine}"),
                    "--salt-file",
                    salt,
                    # the two maps are one map (same nights, same salt): marks apart
                    "--id-map-marks",
                    str(tmp_path / f"marks-{engine}"),
                    "--block-size",
                    "4",
                )
                == 0
            )
    for k in range(3):
        assert_same_output(tmp_path / f"local{k}", tmp_path / f"beam{k}")
    local, beam = map_rows(tmp_path / "map-local"), map_rows(tmp_path / "map-beam")
    assert local == beam and local[0]["version"] == 3


def test_a_small_input_is_encoded_by_one_worker_process(tiny_tokenizer, tmp_path, caplog):
    """The default --processes gives a small input one worker, not this process (forked, or
    started clean in a test process that ran Beam)."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0), chat(1, 1)])
    with caplog.at_level(logging.INFO, logger="kvtrace"):
        assert anonymize(tiny_tokenizer, [src], tmp_path / "out") == 0
    assert any(
        message.startswith("encoding 1 file ranges in 1 worker process ")
        for message in caplog.messages
    )
