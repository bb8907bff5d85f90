"""Red team round 6: what a published folder (or another command's published output) gives away
past the fixes of round 5. Each test asserts the promised behaviour, so each fails today."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT, chat, write_jsonl

pytestmark = pytest.mark.slow
ROUND6 = "red team round 6"


def _cli(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvtrace.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(ROOT),
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("audited", ["with --tokenizer", "by the manifest's name"])
def test_a_private_template_under_a_published_tokenizer_name_is_published_as_a_digest(
    tiny_tokenizer, tmp_path, audited
):
    """Round 5's fix: a tokenizer "kvtrace does not declare" publishes no digests, because a
    plain sha256 of a private template (a default system prompt naming a ward, a patient)
    confirms a guess of it. But whether the files are private is judged by the NAME alone
    (public_tokenizer_name/public_tokenizer_sha256): run with --tokenizer Qwen/Qwen3-8B whose
    hub cache snapshot holds the operator's edited template (the usual way to give a model a
    default system prompt), the manifest names Qwen/Qwen3-8B and publishes the plain sha256 of
    the edited template, and the gate checks the digests only against the same local files
    (_tokenizer_here), so it calls the folder publishable. Anyone hashes "the public template
    plus one guessed line" and compares. Nothing pins a declared name's digests to its
    public files."""
    revision = "0" * 40
    cache = tmp_path / "hub"
    snapshot = cache / "models--Qwen--Qwen3-8B" / "snapshots" / revision
    (cache / "models--Qwen--Qwen3-8B" / "refs").mkdir(parents=True)
    (cache / "models--Qwen--Qwen3-8B" / "refs" / "main").write_text(revision)
    shutil.copytree(tiny_tokenizer, snapshot)
    template = snapshot / "chat_template.jinja"
    secret = (
        "{% if messages[0].role != 'system' %}<|im_start|>system\nyou are the triage "
        "assistant of acme ward 7 for patient jane doe<|im_end|>\n{% endif %}"
    )
    template.write_text(secret + template.read_text())
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    log = write_jsonl(tmp_path / "night.jsonl", [chat(i, 997 * i) for i in range(4)])
    out = tmp_path / "out"
    run = _cli(
        [
            "anonymize",
            "--input",
            str(log),
            "--output",
            str(out),
            "--tokenizer",
            "Qwen/Qwen3-8B",
            "--block-size",
            "4",
        ],
        env,
    )
    assert run.returncode == 0, run.stderr[-400:]
    given = ["--tokenizer", "Qwen/Qwen3-8B"] if audited == "with --tokenizer" else []
    audited = _cli(["audit", str(out), *given], env)  # without: the name, from the hub cache
    manifest = json.loads((out / "manifest.json").read_text())
    guess = hashlib.sha256(template.read_bytes()).hexdigest()  # what an outsider computes
    assert audited.returncode != 0 or guess not in manifest["tokenizer"]["sha256"].values(), (
        "the gate passes the plain digest of the operator's private template: "
        + audited.stdout[-300:]
    )


def test_length_granularity_is_undone_by_the_exact_response_time(tiny_tokenizer, tmp_path):
    """--length-granularity N publishes output lengths as multiples of N, and since round 5 the
    input lengths within their last block, so that a reply's length is known only to within N
    ("To blur lengths", audit's advice). But response_ms, the time from a request's arrival
    to the end of its response, is published to the millisecond beside them (rounded only by
    --timestamp-granularity-ms, 1 by default), and a serving engine decodes one token every
    few tens of ms: response_ms = TTFT + tokens x TPOT, both fitted from the trace itself. Here
    two logs whose replies are 3 and 4 tokens (a 200 ms TTFT, 30 ms a token) publish output
    length 16 for both, and response_ms 290 and 320: the exact length, to the token, from a
    figure that is not coarsened with it. The gate passes both and measures nothing of it."""
    from helpers import anonymize, trace
    from kvtrace.transforms.stats import audit as gate

    outputs = []
    for tokens in (3, 4):
        record = chat(2, 1_700_000_000_000)
        record["output_length"] = tokens
        record["latency_ms"] = 200 + 30 * tokens
        log = write_jsonl(tmp_path / f"{tokens}.jsonl", [record])
        out = tmp_path / f"out{tokens}"
        assert (
            anonymize(
                tiny_tokenizer, [log], out, "--block-size", "16", "--length-granularity", "16"
            )
            == 0
        )
        assert gate.audit(str(out), tiny_tokenizer)["publishable"]
        (row,) = trace(out)
        assert row["output_length"] == 16
        outputs.append(row)
    assert outputs[0] == outputs[1], (
        f"replies of 3 and 4 tokens, both published as 16, told apart by response_ms: {outputs}"
    )


def test_template_kwargs_of_a_yaml_preset_crash_the_closed_shape_check(tiny_tokenizer, tmp_path):
    """Round 5: --chat-template-kwargs are "a closed shape ... checked before any work"
    (anonymize._options: template_kwargs_problems), a refusal being a configuration error
    (exit 2, one line naming the option). A --config preset is YAML, whose loader gives a date
    for an unquoted 2026-01-01 (a value, or a name): public_template_kwargs then json.dumps it
    and raises TypeError, which reaches the CLI's catch-all as "the job failed: TypeError:
    Object of type date is not JSON serializable" (exit 1), where the option's own one-line
    refusal was due."""
    from helpers import main

    (tmp_path / "preset.yaml").write_text("chat_template_kwargs:\n  reasoning_effort: 2026-01-01\n")
    log = write_jsonl(tmp_path / "night.jsonl", [chat(i, 997 * i) for i in range(3)])
    code = main(
        [
            "anonymize",
            "--config",
            str(tmp_path / "preset.yaml"),
            "--input",
            str(log),
            "--output",
            str(tmp_path / "out"),
            "--tokenizer",
            tiny_tokenizer,
            "--block-size",
            "4",
        ]
    )
    assert code == 2 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["export", "synthesize", "render", "report", "analyze-json"])
def test_a_commands_file_output_carries_the_clock_of_its_run(tiny_tokenizer, tmp_path, command):
    """A published folder's files and the folder itself carry content times
    (write/manifest.set_content_times, publish.publish_folder: "the time a copy keeps (rsync
    -t, cp -p, tar) carries nothing but the content"), and a trace publishes no epoch (its
    zero is its first request; a stream "no absolute time leaves"). But the file outputs of
    every other command (export -o, the trace a replayer reads; synthesize -o; render -o;
    report -o; any --json OUT) keep the clock of the run that wrote them, to the nanosecond:
    a nightly job exports each night right after anonymizing it, so the exported trace's
    mtime, kept by tar or cp -p, dates the night the trace hides. One write protocol should
    stamp every published file as it stamps a folder's."""
    import time

    from helpers import anonymize, main
    from kvtrace.transforms.write.manifest import content_time
    from kvtrace.transforms.write.publish import sha256_of

    log = write_jsonl(tmp_path / "night.jsonl", [chat(i, 997 * i) for i in range(4)])
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, [log], out, "--block-size", "4") == 0
    target = tmp_path / ("published.html" if command == "report" else "published.jsonl")
    args = {
        "export": ["export", str(out), "--to", "aiperf", "-o", str(target)],
        "synthesize": ["synthesize", str(out), "-o", str(tmp_path / "published")],
        "render": ["render", str(out), "--tokenizer", tiny_tokenizer, "-o", str(target)],
        "report": ["report", str(out), "-o", str(target)],
        "analyze-json": ["analyze", str(out), "--json", str(target)],
    }[command]
    before = time.time_ns()
    assert main(args) == 0
    if command == "synthesize":  # at block size 4, a derived trace's folder: its trace file
        target = tmp_path / "published" / "trace-00000-of-00001.jsonl"
    written = target.stat().st_mtime_ns
    assert not before - 10**9 <= written <= time.time_ns(), (
        "the file is stamped with the run's clock"
    )
    assert written == content_time(sha256_of(target.read_bytes())) * 10**9


def test_two_input_files_are_shown_under_one_name_in_their_letters(tiny_tokenizer, tmp_path):
    """Round 5 shows a name that is not UTF-8 as \\xNN escapes of its bytes
    (dead_letters.shown_name) and calls letters' names injective. But the escape is not
    escaped itself: the file named b"in\\xff.jsonl" and the file named "in\\\\xff.jsonl" (a
    backslash, x, f, f: any UTF-8 name may hold them) are both shown as "in\\\\xff.jsonl", so
    the letters of two different inputs name the same source, and no letter says which file
    its record came from."""
    from helpers import anonymize

    folder = tmp_path / "logs"
    folder.mkdir()
    with open(os.fsencode(folder) + b"/in\xff.jsonl", "wb") as f:
        f.write(b"not json one\n")
    (folder / "in\\xff.jsonl").write_bytes(b"not json two\n")
    write_jsonl(folder / "good.jsonl", [chat(1, 997)])
    code = anonymize(
        tiny_tokenizer,
        [str(folder / "*.jsonl")],
        tmp_path / "out",
        "--block-size",
        "4",
        "--max-rejected-fraction",
        "1",
    )
    assert code == 0
    letters = [
        json.loads(line)
        for path in (tmp_path / "out-rejected").glob("*.jsonl")
        for line in path.read_text().splitlines()
    ]
    sources = {letter["line"]: letter["source"] for letter in letters}
    assert len(sources) == 2 and len(set(sources.values())) == 2, sources


def test_the_gate_flags_response_times_beside_coarse_lengths(tiny_tokenizer, tmp_path):
    """What anonymize no longer writes (write/coarsen.coarse_response_ms), the gate refuses: a
    row's response_ms added back beside --length-granularity 16, digests and times redone."""
    from helpers import anonymize
    from kvtrace.transforms.stats import audit as gate
    from kvtrace.transforms.trace_format import (
        NO_RESPONSE_MS,
        canonical_json,
        columns_of_jsonl,
        jsonl_bytes,
        parquet_bytes,
    )
    from kvtrace.transforms.write.manifest import set_content_times
    from kvtrace.transforms.write.publish import sha256_of

    record = {**chat(2, 1_700_000_000_000), "output_length": 3, "latency_ms": 290}
    log = write_jsonl(tmp_path / "night.jsonl", [record])
    out = tmp_path / "out"
    assert (
        anonymize(tiny_tokenizer, [log], out, "--block-size", "16", "--length-granularity", "16")
        == 0
    )
    (parquet,) = out.glob("trace-*.parquet")
    columns = columns_of_jsonl(parquet.with_suffix(".jsonl").read_bytes())
    assert (columns.response_ms == NO_RESPONSE_MS).all()
    timed = columns.__class__(**{**columns.__dict__, "response_ms": columns.response_ms * 0 + 288})
    parquet.write_bytes(parquet_bytes(timed))  # both twins, with kvtrace's own writers
    parquet.with_suffix(".jsonl").write_bytes(jsonl_bytes(timed))
    manifest = json.loads((out / "manifest.json").read_text())
    for twin in (parquet, parquet.with_suffix(".jsonl")):
        manifest["sha256"][twin.name] = sha256_of(twin.read_bytes())
    (out / "manifest.json").write_bytes(canonical_json(manifest))
    set_content_times(str(out))
    report = gate.audit(str(out), tiny_tokenizer)
    assert not report["publishable"]
    assert any("response_ms beside output lengths of granularity 16" in f for f in report["flags"])
