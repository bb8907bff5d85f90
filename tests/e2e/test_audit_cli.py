"""kvtrace audit: a real output folder is publishable; doctored ones are flagged; the
granularity options coarsen what is published."""

from __future__ import annotations

import json
import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import anonymize, chat, read_jsonl, trace, write_jsonl
from kvtrace.cli import main
from kvtrace.transforms.trace_format import canonical_json
from kvtrace.transforms.write.coarsen import coarse_input_lengths

pytestmark = pytest.mark.smoke  # in the fast set: one whole run per command (conftest)


@pytest.fixture(scope="module")
def output(tiny_tokenizer, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("audit")
    rows = [chat(i, 1000 * i + i * i, session=f"user-{i % 3}", rotate=i % 2) for i in range(12)]
    src = write_jsonl(tmp / "in.jsonl", rows)
    assert anonymize(tiny_tokenizer, [src], tmp / "out", "--block-size", "4") == 0
    return tmp / "out"


TOKENIZER: list[str] = []


@pytest.fixture(scope="session", autouse=True)  # before the module's outputs
def the_tokenizer(tiny_tokenizer):
    TOKENIZER[:] = [tiny_tokenizer]


def audit(folder, capsys) -> tuple[int, dict]:
    code = main(
        [
            "audit",
            str(folder),
            "--json",
            str(folder.parent / "audit.json"),
            "--tokenizer",
            TOKENIZER[0],
        ]
    )
    capsys.readouterr()
    return code, json.loads((folder.parent / "audit.json").read_text())


def copy_of(folder, tmp_path):
    target = tmp_path / "copy"
    target.mkdir()
    for path in folder.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


def test_a_kvtrace_output_is_publishable(output, capsys):
    code, report = audit(output, capsys)
    assert code == 0 and report["publishable"] and not report["flags"]
    assert set(report["fields"]) <= {
        "timestamp",
        "input_length",
        "output_length",
        "hash_ids",
        "session",
    }
    assert report["hash_ids"]["dense"] and report["sessions"]["sessions"] == 3
    assert report["timestamps"]["granularity_ms"] == 1  # relative ms, unrounded
    assert report["timestamps"]["median_gap_ms"] > 1  # the spacing, beside the precision
    assert report["fields"]["timestamp"] == report["rows"] == 12  # twins counted once
    assert 0 < report["singled_out"]["unique_id_sequence"] <= 1


@pytest.mark.parametrize(
    "doctor,flag",
    [
        (lambda row, i: row.update(prompt="What is the capital of France ?"), "fields beyond"),
        (lambda row, i: row.update(session=f"user-{i}"), "string values"),
        (
            lambda row, i: row.update(hash_ids=[100_000 + 7 * i + j for j in range(3)]),
            "for the rows of its JSONL twin",
        ),
        (lambda row, i: row.update(hash_ids=[2**62 + i]), "outside [0, 2^40)"),
        (lambda row, i: row.update(timestamp=row["timestamp"] + 0.25), "not whole"),
    ],
)
def test_a_doctored_jsonl_is_flagged(output, tmp_path, capsys, doctor, flag):
    folder = copy_of(output, tmp_path)
    for path in folder.glob("trace-*.jsonl"):
        rows = read_jsonl(path)
        for i, row in enumerate(rows):
            doctor(row, i)
        write_jsonl(path, rows)
    code, report = audit(folder, capsys)
    assert code == 1 and any(flag in f for f in report["flags"])


def test_a_doctored_parquet_twin_is_flagged(output, tmp_path, capsys):
    folder = copy_of(output, tmp_path)
    for path in folder.glob("trace-*.parquet"):
        table = pq.read_table(path)
        pq.write_table(table.append_column("token_ids", pa.array([[1, 2]] * len(table))), path)
    code, report = audit(folder, capsys)
    assert code == 1 and any(f.startswith(f"{path.name}: not the bytes") for f in report["flags"])


def test_a_folder_without_rows_is_not_publishable(tmp_path, capsys):
    folder = tmp_path / "empty"
    folder.mkdir()
    (folder / "trace-00000-of-00001.jsonl").write_text("")
    code, report = audit(folder, capsys)
    assert code == 1 and any("missing: trace-00000-of-00001.parquet" in f for f in report["flags"])


def test_private_hash_files_beside_the_trace_are_flagged(output, tmp_path, capsys):
    folder = copy_of(output, tmp_path)
    (folder / "block-hashes-00000-of-00001.parquet").write_bytes(b"PAR1")
    code, report = audit(folder, capsys)
    assert code == 1 and any("does not publish: block-hashes" in f for f in report["flags"])


def test_granularity_options_coarsen_timestamps_and_output_lengths(
    tiny_tokenizer, tmp_path, capsys
):
    rows = [chat(i, 1234 * i + 7) for i in range(6)]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    plain, coarse = tmp_path / "plain", tmp_path / "coarse"
    assert anonymize(tiny_tokenizer, [src], plain, "--block-size", "8") == 0
    assert (
        anonymize(
            tiny_tokenizer,
            [src],
            coarse,
            "--block-size",
            "8",
            "--timestamp-granularity-ms",
            "1000",
            "--length-granularity",
            "8",
        )
        == 0
    )
    before, after = trace(plain), trace(coarse)
    assert [r["timestamp"] for r in after] == [
        (r["timestamp"] + 500) // 1000 * 1000 for r in before
    ]
    assert all(
        a["output_length"] % 8 == 0 and (a["output_length"] > 0) == (b["output_length"] > 0)
        for a, b in zip(after, before)
    )
    assert any(b["output_length"] % 8 for b in before)  # something was rounded
    # input lengths too (a next turn's prompt holds the reply), within their last block
    assert [r["input_length"] for r in after] == coarse_input_lengths(
        np.array([r["input_length"] for r in before]), 8, 8
    ).tolist()
    assert [r["hash_ids"] for r in after] == [r["hash_ids"] for r in before]
    assert audit(coarse, capsys)[1]["timestamps"]["granularity_ms"] % 1000 == 0
    # the published sum is of the published lengths: an exact sum would undo the rounding
    stats = json.loads((coarse / "stats.json").read_text())
    assert stats["output_tokens"] == sum(r["output_length"] for r in after)
    assert stats["input_tokens"] == sum(r["input_length"] for r in after)


def test_output_ids_beside_coarse_lengths_are_refused(tiny_tokenizer, tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(3)])
    assert (
        anonymize(
            tiny_tokenizer,
            [src],
            tmp_path / "out",
            "--length-granularity",
            "8",
            "--emit-output-hashes",
        )
        == 2
    )
    assert "choose one" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_coarse_lengths_take_timestamps_at_least_as_coarse(
    tiny_tokenizer, tmp_path, capsys, caplog
):
    """--length-granularity N needs timestamps of N x SLOWEST_TOKEN_MS at least (a session's
    next arrival follows the reply's decode): a finer one is refused before the run, none
    given takes that floor (recorded in the manifest, passed by the audit unprompted), and a
    manifest that says coarse lengths over fine timestamps is not publishable."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(3)])
    options = ("--block-size", "8", "--length-granularity", "8")
    caplog.set_level(logging.INFO, logger="kvtrace")
    refused = anonymize(
        tiny_tokenizer, [src], tmp_path / "fine", *options, "--timestamp-granularity-ms", "100"
    )
    err = capsys.readouterr().err
    assert refused == 2 and "800 ms" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "fine").exists()
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, [src], out, *options) == 0
    assert "timestamps rounded to 800 ms" in caplog.text  # the run's log line says so
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["granularity"] == {"timestamp_ms": 800, "output_length": 8}
    code, report = audit(out, capsys)
    assert (code, report["flags"]) == (0, [])
    manifest["granularity"]["timestamp_ms"] = 1
    doctored = copy_of(out, tmp_path)
    (doctored / "manifest.json").write_bytes(canonical_json(manifest))
    code, report = audit(doctored, capsys)
    assert code == 1
    assert any("coarse lengths over fine timestamps" in flag for flag in report["flags"])


def test_lengths_coarser_than_a_block_are_refused_and_flagged(tiny_tokenizer, tmp_path, capsys):
    """--length-granularity N above --block-size hides nothing the next turn's full blocks do not
    give back (coarsen.granularity_problem): the run refuses it in one line before the work, and
    the audit flags a manifest that says so."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(3)])
    refused = anonymize(
        tiny_tokenizer, [src], tmp_path / "coarse", "--block-size", "4", "--length-granularity", "8"
    )
    err = capsys.readouterr().err
    assert refused == 2 and "at most 4" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "coarse").exists()
    out = tmp_path / "out"
    assert (
        anonymize(tiny_tokenizer, [src], out, "--block-size", "4", "--length-granularity", "4") == 0
    )
    assert audit(out, capsys)[0] == 0
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["block_size"] = 2
    doctored = copy_of(out, tmp_path)
    (doctored / "manifest.json").write_bytes(canonical_json(manifest))
    code, report = audit(doctored, capsys)
    assert code == 1
    assert any("length granularity above the block size" in flag for flag in report["flags"])


def test_one_trace_file_is_measured_but_only_a_folder_is_publishable(output, tmp_path, capsys):
    (path,) = output.glob("trace-*.jsonl")
    code = main(["audit", str(path), "--json", str(tmp_path / "a.json")])
    capsys.readouterr()
    report = json.loads((tmp_path / "a.json").read_text())
    assert code == 1 and report["rows"] == 12
    assert report["flags"] == [
        "a trace file alone: only a whole output folder (with its manifest.json) is published"
    ]


def test_a_missing_folder_is_could_not_run_not_flagged(tmp_path, capsys):
    assert main(["audit", str(tmp_path / "nowhere")]) == 2
    assert "no such folder" in capsys.readouterr().err


def _gzip(path):
    import gzip

    return gzip.compress(path.read_bytes())


STRAYS = [  # (what is added to a real output, what the gate must say)
    (
        lambda f: (f / "rejected-00000-of-00001.jsonl").write_text(
            '{"source": "a.jsonl", "error": "invalid_json", "line": "my secret prompt"}\n'
        ),
        "does not publish: rejected",
    ),
    (
        lambda f: (f / "logs.jsonl.gz").write_bytes(_gzip(next(f.glob("trace-*.jsonl")))),
        "does not publish: logs.jsonl.gz",
    ),
    (lambda f: (f / ".notes").write_text("internal"), "(hidden)"),
    (lambda f: (f / "extra").mkdir(), "a subfolder: extra"),
    (
        lambda f: (f / "README.txt").write_text("prompts are in s3://bucket"),
        "does not publish: README",
    ),
    (
        lambda f: (f / "trace-00001-of-00002.jsonl").write_text(
            '{"timestamp": 1, "input_length": 3, "output_length": 1, "hash_ids": [0]}\n'
        ),
        "manifest.json lists",
    ),
    (
        lambda f: (f / "stats.json").write_text(
            json.dumps(json.loads((f / "stats.json").read_text()) | {"note": "customer acme"})
        ),
        "stats.json holds",
    ),
]


@pytest.mark.parametrize("stray, flag", STRAYS)
def test_anything_kvtrace_does_not_publish_is_flagged(output, tmp_path, capsys, stray, flag):
    folder = copy_of(output, tmp_path)
    stray(folder)
    code, report = audit(folder, capsys)
    assert code == 1 and any(flag in f for f in report["flags"]), report["flags"]


@pytest.mark.parametrize(
    "change, flag",
    [
        (lambda m: m["tokenizer"].update(name="/home/alice/models/secret-model"), "tokenizer"),
        (
            lambda m: m["chat_template_kwargs"].update(system_note="call 555-0100"),
            "chat_template_kwargs",
        ),
        (lambda m: m.update(operator="alice"), "'operator' was unexpected"),
        (lambda m: m["records"].update(note=1.5), "records"),
    ],
)
def test_a_manifest_holding_free_text_is_flagged(output, tmp_path, capsys, change, flag):
    folder = copy_of(output, tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    change(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    code, report = audit(folder, capsys)
    assert code == 1 and any(flag in f for f in report["flags"]), report["flags"]


def test_a_trace_that_is_not_the_one_the_manifest_lists_is_flagged(output, tmp_path, capsys):
    folder = copy_of(output, tmp_path)
    (path,) = folder.glob("trace-*.jsonl")
    rows = read_jsonl(path)
    write_jsonl(path, rows[:-1])
    code, report = audit(folder, capsys)
    assert code == 1 and any("sha256 differs" in f for f in report["flags"])
    assert any("for the rows of its JSONL twin" in f for f in report["flags"])


def test_a_parquet_with_a_prompt_column_is_flagged(output, tmp_path, capsys):
    folder = copy_of(output, tmp_path)
    (path,) = folder.glob("trace-*.parquet")
    table = pq.read_table(path)
    pq.write_table(table.append_column("prompt", pa.array(["hello"] * len(table))), path)
    code, report = audit(folder, capsys)  # never decoded: not kvtrace's bytes for its rows
    assert code == 1 and any(f.startswith(f"{path.name}: not the bytes") for f in report["flags"])


def test_a_deeply_nested_line_is_flagged_not_a_crash(output, tmp_path, capsys):
    folder = copy_of(output, tmp_path)
    (path,) = folder.glob("trace-*.jsonl")
    path.write_text(path.read_text() + "[" * 100_000 + "]" * 100_000 + "\n")
    code, report = audit(folder, capsys)
    assert code == 1 and any("not JSON" in f for f in report["flags"])


def _flags(folder, *options) -> tuple[int, list[str]]:
    code = main(["audit", str(folder), "--json", str(folder.parent / "flags.json"), *options])
    return code, json.loads((folder.parent / "flags.json").read_text())["flags"]


def test_tokenizer_digests_are_checked_against_the_tokenizer(output, tmp_path, capsys):
    """A local tokenizer's name is never published, nor are its files' digests (they would
    confirm guesses of a private template): nothing to check, with --tokenizer or without, and
    digests beside a null name are refused. A named tokenizer's are checked against its files:
    tests/e2e/test_redteam_privacy_round5.py, tests/transforms/stats/test_gate_round5.py."""
    from tiny_tokenizer import build_tiny_tokenizer

    assert json.loads((output / "manifest.json").read_text())["tokenizer"] == {
        "name": None,
        "sha256": {},
    }
    assert _flags(output) == (0, [])
    other = build_tiny_tokenizer(tmp_path / "other")
    assert _flags(output, "--tokenizer", str(other)) == (0, [])
    assert _flags(output, "--tokenizer", TOKENIZER[0]) == (0, [])


def test_a_vllm_scheme_suffix_is_checked_against_the_engines_none_hash(
    tiny_tokenizer, tmp_path, capsys
):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(3)])
    out = tmp_path / "out"
    assert (
        anonymize(
            tiny_tokenizer,
            [src],
            out,
            "--block-size",
            "4",
            "--hash-scheme",
            "vllm-sha256-cbor",
            "--vllm-hash-seed",
            "0",
        )
        == 0
    )
    code, flags = _flags(out, "--tokenizer", tiny_tokenizer)
    assert code == 1 and "pass --vllm-hash-seed or --vllm-none-hash" in flags[0]
    assert _flags(out, "--tokenizer", tiny_tokenizer, "--vllm-hash-seed", "0") == (0, [])
    code, flags = _flags(out, "--tokenizer", tiny_tokenizer, "--vllm-hash-seed", "1")
    assert code == 1 and flags[0].startswith("manifest.json: hash_scheme is not vllm-sha256-cbor")


def test_only_the_templates_a_render_can_select_are_published_by_fixed_names(tmp_path):
    """A folder's other named templates render nothing: neither their names nor digests are
    published; nor are any of a tokenizer's digests unless its files are the ones pinned for a
    published name (write/manifest.public_tokenizer)."""
    from helpers import anonymize as run_anonymize
    from kvtrace.transforms.encode.tokenize import tokenizer_sha256
    from kvtrace.transforms.write.manifest import public_tokenizer
    from tiny_tokenizer import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer(tmp_path / "tok")
    (tokenizer / "additional_chat_templates").mkdir()
    for name in ("tool_use", "acme_internal"):
        (tokenizer / "additional_chat_templates" / f"{name}.jinja").write_text(
            (tokenizer / "chat_template.jinja").read_text()
        )
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0)])
    assert run_anonymize(str(tokenizer), [src], tmp_path / "out", "--block-size", "4") == 0
    named = public_tokenizer("Qwen/Qwen3-8B", tokenizer_sha256(str(tokenizer)))
    assert named == {"name": None, "sha256": {}}  # not Qwen3's pinned files: nothing published
    assert "acme_internal" not in (tmp_path / "out" / "manifest.json").read_text()
    assert _flags(tmp_path / "out", "--tokenizer", str(tokenizer)) == (0, [])


@pytest.mark.slow  # two nights: over a second
def test_a_night_extending_an_id_map_is_checked_against_the_map(tiny_tokenizer, tmp_path, capsys):
    (tmp_path / "salt").write_bytes(b"s" * 32)
    mapped = ["--id-map", str(tmp_path / "map"), "--salt-file", str(tmp_path / "salt")]
    for night in range(2):
        src = write_jsonl(
            tmp_path / f"in{night}.jsonl",
            [chat(i + 5 * night, 1000 * i + 10**8 * night) for i in range(4)],
        )
        assert (
            anonymize(tiny_tokenizer, [src], tmp_path / f"out{night}", "--block-size", "4", *mapped)
            == 0
        )
    out = tmp_path / "out1"
    assert json.loads((out / "manifest.json").read_text())["id_map"]["time_from_ms"] == 10**8
    code, flags = _flags(out, "--tokenizer", tiny_tokenizer)
    assert code == 1 and "pass --id-map MAP" in flags[0]
    assert _flags(out, "--tokenizer", tiny_tokenizer, *mapped) == (0, [])
    assert main(["audit", str(out), "--id-map", str(tmp_path / "map")]) == 2  # no salt: refused
