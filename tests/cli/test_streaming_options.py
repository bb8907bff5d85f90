"""`anonymize --streaming`'s options: refused at once, in one line, before anything starts."""

from __future__ import annotations

import pytest

from kvtrace.cli import main
from kvtrace.options import parse_duration_ms
from kvtrace.transforms.errors import ConfigError


@pytest.mark.parametrize(
    "text, ms",
    [
        ("500ms", 500),
        ("30s", 30_000),
        ("10m", 600_000),
        ("1h", 3_600_000),
        ("2d", 172_800_000),
        (" 1H ", 3_600_000),
    ],
)
def test_durations(text, ms):
    assert parse_duration_ms(text, "--window") == ms


@pytest.mark.parametrize("text", ["", "h", "1.5h", "-1h", "10", "1 h", "1w"])
def test_durations_refused(text):
    with pytest.raises(ConfigError, match="--window takes a duration"):
        parse_duration_ms(text, "--window")


@pytest.mark.beam  # the streaming command's checks read Beam's options
@pytest.mark.parametrize(
    "extra, message",
    [
        (["--input", "pubsub:projects/p"], "reads pubsub:projects/P/subscriptions/S"),
        (["--input", "a.jsonl"], "reads pubsub:projects/P/subscriptions/S"),
        (["--input", "pubsub:projects/p/subscriptions/s", "--input", "b"], "reads one --input"),
        (["--input", "kafka://broker/topic"], "or kafka://HOST:PORT/TOPIC, not"),
        (["--input", "kafka://127.0.0.1:9092/requests"], "needs $KVTRACE_KAFKA_EXPANSION"),
        (
            ["--input", "pubsub:projects/p/subscriptions/s", "--id-map", "m"],
            "--id-map is for batch",
        ),
        (
            ["--input", "pubsub:projects/p/subscriptions/s", "--engine", "local"],
            "not --engine local",
        ),
        (["--input", "pubsub:projects/p/subscriptions/s", "--route-sessions"], "is for batch jobs"),
        (["--input", "pubsub:projects/p/subscriptions/s", "--window", "0s"], "longer than 0"),
        (["--input", "pubsub:projects/p/subscriptions/s", "--window", "32d"], "at most 31d"),
        (
            ["--input", "pubsub:projects/p/subscriptions/s", "--allowed-lateness", "40d"],
            "at most 31d",
        ),
        (
            ["--input", "pubsub:projects/p/subscriptions/s", "--allowed-lateness", "soon"],
            "--allowed-lateness takes a duration",
        ),
        (
            ["--input", "pubsub:projects/p/subscriptions/s", "--id-shards", "0"],
            "--id-shards must be from 1 to 4096, not 0",
        ),
        (
            ["--input", "pubsub:projects/p/subscriptions/s", "--id-shards", "4097"],
            "--id-shards must be from 1 to 4096, not 4097",
        ),
    ],
)
def test_streaming_options_refused(tmp_path, capsys, monkeypatch, extra, message):
    monkeypatch.delenv("KVTRACE_KAFKA_EXPANSION", raising=False)
    assert (
        main(
            [
                "anonymize",
                "--streaming",
                "--output",
                str(tmp_path / "out"),
                "--tokenizer",
                "x",
                *extra,
            ]
        )
        == 2
    )
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1


def test_window_needs_streaming(tmp_path, capsys):
    assert (
        main(
            [
                "anonymize",
                "--input",
                "a.jsonl",
                "--output",
                str(tmp_path / "out"),
                "--tokenizer",
                "x",
                "--window",
                "1h",
            ]
        )
        == 2
    )
    assert "--window is for --streaming" in capsys.readouterr().err


def test_id_shards_need_streaming(tmp_path, capsys):
    arguments = ["anonymize", "--input", "a.jsonl", "--output", str(tmp_path / "out")]
    assert main([*arguments, "--tokenizer", "x", "--id-shards", "8"]) == 2
    assert "--id-shards is for --streaming" in capsys.readouterr().err
