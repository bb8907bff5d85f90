"""The engine's cached-token counts through `kvtrace anonymize`: aggregated in stats.json (which
the gate accepts as it is written, and nothing else), per row only in the run's private
measured file beside its dead letters, the same on both engines; and calibrate reads it."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from helpers import SALT, anonymize, write_jsonl
from kvtrace.cli import main
from kvtrace.transforms.trace_format import MIN_MEASURED_REQUESTS

pytestmark = pytest.mark.smoke  # in the fast set: one whole run per command (conftest)

USER = {"role": "user", "content": "the quick brown fox jumps over the lazy dog " * 4}
CHATS = 30  # of which 4 in 5 carry a count: with two more, past MIN_MEASURED_REQUESTS


def logs(folder: Path) -> Path:
    """Requests in each shape that carries a count, some without one, one dead letter."""
    usage = [
        {"usage": {"prompt_tokens_details": {"cached_tokens": 8}}},
        {"usage": {"input_tokens_details": {"cached_tokens": 4}}},
        {"type": "message", "content": [], "usage": {"cache_read_input_tokens": 12}},
        {"num_cached_tokens": 0},
        {"choices": []},  # no count
    ]
    records = [
        {"timestamp": 1_000 * i, "messages": [USER], "output_length": 3, "response": usage[i % 5]}
        for i in range(CHATS)
    ]
    records.append({"timestamp": 20_000, "input_ids": list(range(20)), "num_cached_tokens": 16})
    # more than its prompt: the whole prompt (no engine caches more)
    records.append({"timestamp": 20_500, "input_ids": list(range(6)), "num_cached_tokens": 99})
    records.append({"timestamp": 21_000, "prompt": "x", "num_cached_tokens": "16"})  # wrong type
    folder.mkdir()
    return write_jsonl(folder / "logs.jsonl", records)


def run(tokenizer: str, tmp_path: Path, name: str, *extra: str) -> tuple[Path, Path]:
    (tmp_path / "salt").write_text(SALT)
    out = tmp_path / name
    flags = ["--block-size", "4", "--salt-file", str(tmp_path / "salt"), *extra]
    assert anonymize(tokenizer, [tmp_path / "in" / "logs.jsonl"], out, *flags) == 0
    (measured,) = Path(f"{out}-rejected").glob("measured-*.jsonl")
    return out, measured


def test_counts_aggregate_in_stats_and_stay_private_per_row(tiny_tokenizer, tmp_path, capsys):
    logs(tmp_path / "in")
    out, measured = run(tiny_tokenizer, tmp_path, "out")
    stats = json.loads((out / "stats.json").read_text())
    chats = [8, 4, 12, 0] * (CHATS // 5)
    counts = sorted(chats + [16, 6])  # 99 is the whole prompt's 6
    assert len(counts) >= MIN_MEASURED_REQUESTS
    measured_stats = stats["measured"]
    assert measured_stats["requests"] == len(counts)
    assert measured_stats["cached_tokens"] == sum(counts)
    assert "measured" in stats["definitions"]
    assert re.fullmatch(r"measured-[0-9a-f]{12}\.jsonl", measured.name)
    assert measured.stat().st_mode & 0o077 == 0
    header, *rows = [json.loads(line) for line in measured.read_text().splitlines()]
    manifest = hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
    assert header == {"manifest_sha256": manifest}  # the output its rows are of
    assert sorted(r["cached_tokens"] for r in rows) == counts
    for published in out.iterdir():  # no per-row count in any published file
        assert b"cached" not in published.read_bytes() or published.name == "stats.json"
    (letters,) = Path(f"{out}-rejected").glob("rejected-*.jsonl")
    assert "num_cached_tokens is a string" in json.loads(letters.read_text())["message"]
    capsys.readouterr()
    assert main(["audit", str(out), "--tokenizer", tiny_tokenizer]) == 0
    calibrated = tmp_path / "fit.json"
    assert (
        main(["calibrate", str(out), "--measured", str(measured), "--json", str(calibrated)]) == 0
    )
    fitted = json.loads(calibrated.read_text())["measured"]
    assert fitted["requests"] == len(counts) and "note" not in fitted  # as many as published
    assert calibrated.stat().st_mode & 0o077 == 0  # of the private file: private like it
    # analyze and the report put it beside the trace's ceiling and simulated rates
    capsys.readouterr()
    assert main(["analyze", str(out), "--measured", str(measured)]) == 0
    said = capsys.readouterr().out
    assert "measured by the engine:" in said and "infinite cache:" in said
    page = tmp_path / "report.html"
    assert main(["report", str(out), "--measured", str(measured), "-o", str(page)]) == 0
    assert "Measured against simulated" in page.read_text()
    assert page.stat().st_mode & 0o077 == 0


@pytest.fixture(scope="module")
def published(tiny_tokenizer, tmp_path_factory) -> Path:
    """One run's output, for the tests that alter a copy of it."""
    tmp = tmp_path_factory.mktemp("measured")
    logs(tmp / "in")
    return run(tiny_tokenizer, tmp, "out")[0]


@pytest.mark.parametrize(
    "change, publishable",
    [
        (lambda m: None, True),  # as written: the control
        (lambda m: m.update(hit_rate=0.5), False),
        (lambda m: m.update(requests=10**6), False),
        (lambda m: m.update(note="x"), False),
        (lambda m: m.update(cached_tokens=m["input_tokens"] + 1), False),
        (lambda m: m.update(requests=1.0), False),
        # fewer requests than the writer publishes an aggregate over: refused at the gate too
        (lambda m: m.update(requests=MIN_MEASURED_REQUESTS - 1), False),
    ],
)
def test_the_gate_passes_only_the_measured_aggregate_kvtrace_writes(
    tiny_tokenizer, published, tmp_path, change, publishable
):
    """stats.json rewritten as kvtrace writes JSON, the manifest's digest of it updated: only
    the aggregate the writer's own function rebuilds from its three counts passes."""
    from kvtrace.transforms.stats import audit as gate
    from kvtrace.transforms.trace_format import canonical_json
    from kvtrace.transforms.write.manifest import set_content_times
    from kvtrace.transforms.write.publish import sha256_of

    out = tmp_path / "out"
    shutil.copytree(published, out)
    stats = json.loads((out / "stats.json").read_text())
    change(stats["measured"])
    (out / "stats.json").write_bytes(canonical_json(stats))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["sha256"]["stats.json"] = sha256_of((out / "stats.json").read_bytes())
    (out / "manifest.json").write_bytes(canonical_json(manifest))
    set_content_times(str(out))
    report = gate.audit(str(out), tiny_tokenizer)
    assert report["publishable"] == publishable, report["flags"]
    if not publishable:
        assert any("stats.json holds more, or other" in flag for flag in report["flags"])


@pytest.mark.slow  # Beam: .ci/run runs the slow set
@pytest.mark.beam
def test_both_engines_write_the_same_measured_file(tiny_tokenizer, tmp_path):
    logs(tmp_path / "in")
    local, local_measured = run(tiny_tokenizer, tmp_path, "local")
    beam, beam_measured = run(tiny_tokenizer, tmp_path, "beam", "--engine", "beam")
    assert local_measured.read_bytes() == beam_measured.read_bytes()
    assert (local / "stats.json").read_bytes() == (beam / "stats.json").read_bytes()


def test_requests_alike_in_all_they_publish_keep_one_order_of_their_counts(
    tiny_tokenizer, tmp_path
):
    same = {"timestamp": 0, "messages": [USER], "output_length": 3}
    records = [{**same, "num_cached_tokens": n} for n in (8, 0, 4)]
    written = []
    for name, order in (("a", records), ("b", records[::-1])):
        folder = tmp_path / name
        folder.mkdir()
        write_jsonl(folder / "logs.jsonl", order)
        (tmp_path / "salt").write_text(SALT)
        out = tmp_path / f"out-{name}"
        flags = ["--block-size", "4", "--salt-file", str(tmp_path / "salt")]
        assert anonymize(tiny_tokenizer, [folder / "logs.jsonl"], out, *flags) == 0
        (measured,) = Path(f"{out}-rejected").glob("measured-*.jsonl")
        written.append(measured.read_bytes())
    assert written[0] == written[1]


def test_calibrate_refuses_the_measured_file_of_another_night_in_one_line(
    tiny_tokenizer, tmp_path, capsys
):
    """Two nights alike in every published row, shard and row count, their engines' counts
    apart (so their stats.json, and manifests, differ): each measured file names its night's
    manifest, and calibrate takes only its own night's."""
    logs(tmp_path / "in")
    first, first_measured = run(tiny_tokenizer, tmp_path, "first")
    logged = (tmp_path / "in" / "logs.jsonl").read_text()
    (tmp_path / "in" / "logs.jsonl").write_text(
        logged.replace('"cached_tokens": 8', '"cached_tokens": 6')
    )
    second, second_measured = run(tiny_tokenizer, tmp_path, "second")
    assert sorted(first.glob("trace-*")) and all(
        (second / p.name).read_bytes() == p.read_bytes() for p in first.glob("trace-*")
    )
    capsys.readouterr()
    assert main(["calibrate", str(first), "--measured", str(second_measured)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --measured") and "\n" not in err and "another output" in err
    assert main(["calibrate", str(second), "--measured", str(second_measured)]) == 0


def test_calibrate_refuses_a_measured_file_cut_short_in_one_line(tiny_tokenizer, tmp_path, capsys):
    """A copy cut at a line's end reads line by line; its totals are not the aggregate its
    output published, so every reader of it (calibrate, analyze, report) refuses it."""
    logs(tmp_path / "in")
    out, measured = run(tiny_tokenizer, tmp_path, "out")
    lines = measured.read_bytes().splitlines(keepends=True)
    measured.write_bytes(b"".join(lines[:-1]))
    capsys.readouterr()
    for command in (["calibrate"], ["analyze"]):
        assert main([*command, str(out), "--measured", str(measured)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: --measured") and "\n" not in err and "cut short" in err


def test_too_few_counts_publish_no_aggregate_and_the_summary_says_where_they_are(
    tiny_tokenizer, tmp_path, capsys
):
    """One request short of MIN_MEASURED_REQUESTS carrying a count: stats.json has no
    `measured` (it would be their counts), the gate passes the folder, the private file still
    holds each count, and the summary says why none was published and where they are."""
    records = [
        {"timestamp": 1_000 * i, "messages": [USER], "output_length": 3, "num_cached_tokens": 4}
        for i in range(MIN_MEASURED_REQUESTS - 1)
    ]
    (tmp_path / "in").mkdir()
    write_jsonl(tmp_path / "in" / "logs.jsonl", records)
    out, measured = run(tiny_tokenizer, tmp_path, "out")
    assert "measured" not in json.loads((out / "stats.json").read_text())
    _, *rows = measured.read_text().splitlines()  # its header, then a line per count
    assert len(rows) == MIN_MEASURED_REQUESTS - 1
    said = capsys.readouterr().out
    assert f"fewer than {MIN_MEASURED_REQUESTS} requests" in said and measured.name in said
    assert main(["audit", str(out), "--tokenizer", tiny_tokenizer]) == 0
