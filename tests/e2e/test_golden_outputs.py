"""Every job's output bytes on fixed inputs, against the sha256 recorded in golden/outputs.json:
a restructuring must change no byte anyone can observe (trace, Parquet, stats, manifest, dead
letters, id map versions, reports, synthesized and rendered files, exports).

KVTRACE_RECORD_GOLDEN=1 records them instead (only when a change of output is intended).
Jobs run from inside a temporary folder on relative paths, so no path enters an output.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT, TESTS, shared_path, write_jsonl
from kvtrace.cli import main

pytestmark = pytest.mark.slow
GOLDEN = TESTS / "golden" / "outputs.json"
EXAMPLES = ROOT / "examples" / "requests"
SALT = b"golden salt: fixed so ids are fixed" * 2


def digests(folder: Path) -> dict[str, str]:
    """sha256 per file under folder; a dead-letter file by its sorted lines (Beam writes them
    in no set order), named without its run's id."""
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        name = str(path.relative_to(folder))
        if "rejected" in path.parent.name:
            data = b"\n".join(sorted(data.splitlines()))
            name = re.sub(r"^rejected-[0-9a-f]{12}\.jsonl$", "rejected-RUNID.jsonl", name)
        out[name] = hashlib.sha256(data).hexdigest()
    return out


def map_digest(folder: Path) -> dict:
    """An id map's committed state: its versions' file checksums and counters (segment file
    names carry a random run id; their contents, and so their sha256, do not)."""
    versions = {}
    for path in sorted((folder / "versions").glob("*.json")):
        version = json.loads(path.read_text())
        versions[path.name] = {
            "next_id": version["next_id"],
            "files": sorted(
                [name.rsplit("/", 1)[-1], _content_digest(folder / name, check)]
                for name, check in version["checksums"].items()
            ),
        }
    return versions


def _content_digest(path: Path, check: dict) -> str:
    """A file's sha256; an .npz index by its arrays (the zip stamps each entry with a time)."""
    if path.suffix != ".npz":
        return check["sha256"]
    with np.load(path) as arrays:
        return hashlib.sha256(
            b"".join(name.encode() + arrays[name].tobytes() for name in sorted(arrays.files))
        ).hexdigest()


def run(*args: str) -> None:
    assert main(list(args)) == 0, args


@pytest.fixture(scope="module")
def outputs(deepseek_tokenizer, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("golden")
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        return _run_every_job(deepseek_tokenizer, tmp)
    finally:
        os.chdir(cwd)


def _run_every_job(tokenizer: str, tmp: Path) -> dict:
    Path("salt").write_bytes(SALT)
    Path("in").mkdir()
    for example in sorted(EXAMPLES.glob("*.jsonl")):
        (Path("in") / example.name).write_bytes(example.read_bytes())
    Path("trace.jsonl").write_bytes(shared_path("traces", "synthetic_trace.jsonl").read_bytes())
    common = [
        "--input",
        "in/*.jsonl",
        "--tokenizer",
        tokenizer,
        "--block-size",
        "16",
        "--salt-file",
        "salt",
    ]
    results: dict = {}
    run("anonymize", "--output", "local", *common)
    run("anonymize", "--output", "beam", *common, "--engine", "beam")
    run(
        "anonymize",
        "--output",
        "coarse",
        *common,
        "--timestamp-granularity-ms",
        "1000",
        "--length-granularity",
        "8",
    )
    # Output block ids give each output length to within a block: never beside coarse lengths.
    run("anonymize", "--output", "outputs", *common, "--emit-output-hashes")
    for engine in ("local", "beam"):
        # The two maps are one map (same night, same salt): each its own folder of marks.
        run(
            "anonymize",
            "--output",
            f"night-{engine}",
            *common,
            "--engine",
            engine,
            "--id-map",
            f"map-{engine}",
            "--id-map-marks",
            f"marks-{engine}",
        )
    for name in ("local", "beam", "coarse", "outputs", "night-local", "night-beam"):
        results[f"anonymize {name}"] = digests(Path(name)) | digests(Path(f"{name}-rejected"))
    for engine in ("local", "beam"):
        results[f"id map {engine}"] = map_digest(Path(f"map-{engine}"))
    reports = Path("reports")
    reports.mkdir()
    for source in ("local", "trace.jsonl"):
        tag = source.split(".")[0]
        run("analyze", source, "--json", f"reports/analyze-{tag}.json")
        run("analyze", source, "--json", f"reports/analyze-beam-{tag}.json", "--engine", "beam")
        run(
            "reuse",
            source,
            "--output",
            f"reports/reuse-{tag}.png",
            "--json",
            f"reports/reuse-{tag}.json",
        )
        run(
            "simulate",
            source,
            "--capacity",
            "2K,3M",
            "--policy",
            "lru,prefix-lru,fifo",
            "--json",
            f"reports/simulate-{tag}.json",
        )
        run("report", source, "-o", f"reports/report-{tag}.html")
        run("synthesize", source, "-o", f"reports/synth-{tag}", "--seed", "3")
        run("validate", source, "--json", f"reports/validate-{tag}.json")
        for to in (
            "aiperf",
            "aiperf-sessions",
            "guidellm",
            "vllm",
            "sglang",
            "dynamo",
            "dynamo-delta",
            "dynamo-agentic",
            "weka",
            "libcachesim",
        ):
            run("export", source, "--to", to, "-o", f"reports/export-{tag}-{to}.jsonl")
    run("synthesize", "trace.jsonl", "-o", "reports/synth-beam", "--seed", "3", "--engine", "beam")
    run("audit", "local", "--json", "reports/audit.json", "--tokenizer", tokenizer)
    run("render", "local", "--tokenizer", tokenizer, "-o", "reports/render.jsonl")
    write_jsonl(
        Path("bailian.jsonl"),
        [
            {
                "chat_id": 1,
                "parent_chat_id": -1,
                "timestamp": 1.5,
                "input_length": 20,
                "output_length": 3,
                "hash_ids": [7, 8],
                "turn": 1,
                "type": "text",
            },
            {
                "chat_id": 2,
                "parent_chat_id": 1,
                "timestamp": 4.25,
                "input_length": 40,
                "output_length": 5,
                "hash_ids": [7, 8, 9],
                "turn": 2,
                "type": "text",
            },
        ],
    )
    run("convert", "bailian.jsonl", "-o", "converted")
    results["reports"] = digests(reports)
    results["convert"] = digests(Path("converted"))
    return results


def test_every_output_byte_is_what_was_recorded(outputs):
    if os.environ.get("KVTRACE_RECORD_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(outputs, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"recorded {GOLDEN}")
    recorded = json.loads(GOLDEN.read_text())
    changed = [
        f"{job}: {name}"
        for job in sorted(set(recorded) | set(outputs))
        for name in sorted(set(recorded.get(job, {})) | set(outputs.get(job, {})))
        if recorded.get(job, {}).get(name) != outputs.get(job, {}).get(name)
    ]
    assert not changed, f"{len(changed)} outputs changed: {changed[:10]}"


def test_the_engines_agree(outputs):
    assert outputs["anonymize local"] == outputs["anonymize beam"]
    assert outputs["anonymize night-local"] == outputs["anonymize night-beam"]
    assert outputs["id map local"] == outputs["id map beam"]
    synthesized = {  # the folders, manifests included: the same sources, settings and rows
        engine: {k.split("/")[1]: v for k, v in outputs["reports"].items() if k.startswith(engine)}
        for engine in ("synth-trace/", "synth-beam/")
    }
    assert synthesized["synth-trace/"] == synthesized["synth-beam/"] != {}
