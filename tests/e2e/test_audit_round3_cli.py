"""kvtrace audit, round 3's mechanisms from the operator's side: a stream's folder audited whole
(each window's start checked against the window the audit passed before it), the run's
settings and template kwargs given as the run was, SELinux labels by their shape."""

from __future__ import annotations

import json
import shutil

import pytest

from helpers import anonymize, chat, write_jsonl
from kvtrace.cli import main
from kvtrace.transforms.stats import audit as gate
from kvtrace.transforms.trace_format import canonical_json
from kvtrace.transforms.write.manifest import set_content_times


@pytest.fixture(scope="module")
def night(tiny_tokenizer, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("audit3")
    rows = [chat(i, 1000 * i, session=f"user-{i % 2}") for i in range(6)]
    assert (
        anonymize(
            tiny_tokenizer, [write_jsonl(tmp / "in.jsonl", rows)], tmp / "out", "--block-size", "4"
        )
        == 0
    )
    return tmp / "out"


def test_a_stream_window_is_checked_against_the_audited_window_before(
    night, tiny_tokenizer, tmp_path
):
    """A night numbered as a stream's first window (id_map {0, 0, 0}) passes; the same night
    of its own as the second window numbers from 0 where the first ended past 0: refused, as
    the second."""
    stream = tmp_path / "stream"
    first = shutil.copytree(night, stream / "window-000000")
    manifest = json.loads((first / "manifest.json").read_text())
    manifest["id_map"] = {"block_ids_from": 0, "sessions_from": 0, "time_from_ms": 0}
    (first / "manifest.json").write_bytes(canonical_json(manifest))
    set_content_times(str(first))
    blocks = json.loads((night / "stats.json").read_text())["unique_blocks"]
    (stream / "cumulative.json").write_bytes(
        canonical_json(  # as the stream writes it
            {
                "windows": 1,
                "rows": 6,
                "unique_blocks": blocks,
                "sessions": 2,
                "window_ms": 60_000,
                "published_until_ms": 60_000,
            }
        )
    )
    set_content_times(str(stream))
    report = gate.audit(str(stream), tiny_tokenizer)
    assert report["publishable"] and list(report["windows"]) == ["window-000000"], report["flags"]
    shutil.copytree(night, stream / "window-000001")
    report = gate.audit(str(stream), tiny_tokenizer)
    assert report["windows"]["window-000000"]["publishable"]
    # a stream's window always says where it begins: its closed schema holds no null id_map
    refused = "window-000001: manifest.json: id_map: None is not of type 'object'"
    assert refused in report["flags"]
    assert "stream verdict: NOT publishable" in gate.report_text(report, str(stream))


@pytest.mark.parametrize(
    "names",
    [
        ["window-000001"],
        ["window-000000", "window-000002"],
        ["window-~000000"],
        ["window-000000", "notes"],
    ],
)
def test_a_stream_folder_holds_its_windows_numbered_from_0_and_nothing_else(
    night, tiny_tokenizer, tmp_path, names
):
    stream = tmp_path / "stream"
    for name in names:
        shutil.copytree(night, stream / name)
    assert not gate.audit(str(stream), tiny_tokenizer)["publishable"]


def test_run_settings_are_checked_as_given(night, tiny_tokenizer, capsys):
    base = ["audit", str(night), "--tokenizer", tiny_tokenizer]
    assert main(base + ["--block-size", "4", "--timestamp-granularity-ms", "1"]) == 0
    assert main(base + ["--block-size", "8"]) == 1
    assert "block_size is 4, the run was given --block-size 8" in capsys.readouterr().out


def test_template_kwargs_that_are_no_json_object_are_a_one_line_error(
    night, tiny_tokenizer, tmp_path, capsys
):
    salt = tmp_path / "salt"
    salt.write_bytes(b"s" * 32)
    code = main(
        [
            "audit",
            str(night),
            "--tokenizer",
            tiny_tokenizer,
            "--salt-file",
            str(salt),
            "--chat-template-kwargs",
            "[1]",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "a JSON object" in err and "Traceback" not in err


def test_template_kwargs_without_the_salt_are_refused_before_the_audit(night, capsys, monkeypatch):
    monkeypatch.delenv("KVTRACE_SALT", raising=False)
    assert (
        main(
            [
                "audit",
                str(night),
                "--chat-template-kwargs",
                json.dumps({"reasoning_effort": "high"}),
            ]
        )
        == 2
    )
    assert "need the salt" in capsys.readouterr().err
