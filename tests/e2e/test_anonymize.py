"""`kvtrace anonymize` end to end on the tiny tokenizer: outputs, bad input, determinism."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import (
    FINLAND,
    FRANCE,
    SALT,
    anonymize,
    chat,
    published_letters,
    read_jsonl,
    trace,
    write_jsonl,
)
from kvtrace.cli import main

pytestmark = pytest.mark.smoke  # in the fast set: one whole run per command (conftest)


def test_france_and_finland_share_only_their_first_block(tiny_tokenizer, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [FRANCE, FINLAND])
    assert anonymize(tiny_tokenizer, [src], tmp_path / "out", "--block-size", "4") == 0
    france, finland = trace(tmp_path / "out")
    assert france["hash_ids"][0] == finland["hash_ids"][0] == 0
    assert not set(france["hash_ids"][1:]) & set(finland["hash_ids"][1:])
    assert france["input_length"] == finland["input_length"] == 12
    assert (france["timestamp"], finland["timestamp"]) == (0, 300)
    assert france["output_length"] == 7


def test_outputs_jsonl_parquet_stats_manifest_agree(tiny_tokenizer, tmp_path):
    records = [chat(i, 1000 + 10 * i, session=f"user-{i % 3}") for i in range(20)]
    src = write_jsonl(tmp_path / "in.jsonl", records)
    assert anonymize(tiny_tokenizer, [src], tmp_path / "out", "--block-size", "4") == 0
    out = tmp_path / "out"
    rows = trace(out)
    assert [r["timestamp"] for r in rows] == [10 * i for i in range(20)]
    assert pq.read_table(out / "trace-00000-of-00001.parquet").to_pylist() == rows
    assert [r["session"] for r in rows[:4]] == [0, 1, 2, 0]
    ids = [i for r in rows for i in r["hash_ids"]]
    assert sorted(set(ids)) == list(range(len(set(ids))))  # dense from 0
    stats = json.loads((out / "stats.json").read_text())
    assert stats["requests"] == 20 and stats["blocks"] == len(ids)
    assert stats["unique_blocks"] == len(set(ids))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["records"] == {"exported": 20}  # only what the rows prove
    assert manifest["block_size"] == 4 and manifest["tokenizer"] == {"name": None, "sha256": {}}


BAD_LINES = [
    b"not json",
    b"[1, 2, 3]",
    b'{"prompt": "caf\xe9"}',
    b"[" * 5000 + b"]" * 5000,
    json.dumps({"timestamp": 1, "messages": []}).encode(),
    json.dumps({"timestamp": 1}).encode(),
    json.dumps({"timestamp": "not a time", "prompt": "x"}).encode(),
    json.dumps({"timestamp": 1, "prompt": 42}).encode(),
    json.dumps({"timestamp": 1, "input_ids": [1, "two"]}).encode(),
    json.dumps({"timestamp": 1, "messages": [{"role": "user", "content": {"a": 1}}]}).encode(),
    # The tiny template raises on developer messages, as real templates raise on what they cannot render.
    json.dumps({"timestamp": 1, "messages": [{"role": "developer", "content": "x"}]}).encode(),
    b'{"timestamp": 1, "prompt": "lone \\ud800 surrogate"}',
    b'{"timestamp": 1, "prompt": "x", "session_id": "\\udfff"}',
    b'{"timestamp": 1, "prompt": "x", "output_length": 123456789012345678901234567890}',
    b'{"timestamp": 1e308, "prompt": "x"}',
    b'{"timestamp": -1, "prompt": "x"}',
    b'{"prompt": "no timestamp"}',
]


def test_bad_input_is_dead_lettered_and_no_good_record_is_lost(tiny_tokenizer, tmp_path):
    good = [chat(i, 5 * i) for i in range(6)]
    mixed = [line for pair in zip(BAD_LINES, good) for line in pair] + BAD_LINES[len(good) :]
    src = write_jsonl(tmp_path / "in.jsonl", mixed + [b"", b"   "])
    assert anonymize(tiny_tokenizer, [src], tmp_path / "out", "--max-rejected-fraction", "1") == 0
    assert len(trace(tmp_path / "out")) == len(good)
    rejected = [r for p in (tmp_path / "out-rejected").glob("*.jsonl") for r in read_jsonl(p)]
    assert len(rejected) == len(BAD_LINES)
    assert {r["source"] for r in rejected} == {str(src)}
    assert {r["error"] for r in rejected} >= {
        "invalid_json",
        "not_an_object",
        "invalid_utf8",
        "too_deep",
        "invalid_request",
        "no_input",
        "bad_timestamp",
        "wrong_type",
        "template_error",
        "invalid_unicode",
        "out_of_range",
        "negative_timestamp",
        "missing_timestamp",
    }
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())["records"]
    assert manifest["exported"] + len(rejected) == len(mixed)


@pytest.mark.parametrize("engine", ["local", pytest.param("beam", marks=pytest.mark.beam)])
def test_max_rejected_fraction_fails_without_writing_a_trace(
    tiny_tokenizer, tmp_path, capsys, engine
):
    """On Beam the gate's refusal is a verdict its job finishes with, raised by the launcher:
    the same one line."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0), b"bad", b"bad"])
    code = anonymize(
        tiny_tokenizer,
        [src],
        tmp_path / "out",
        "--max-rejected-fraction",
        "0.5",
        "--engine",
        engine,
    )
    assert code == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("error: too much input rejected: 2 of 3 records")
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_gateways_cache_hits_are_counted_but_not_held_against_the_bound(tiny_tokenizer, tmp_path):
    """The engine never served them: no input lost (dead_letters.NEVER_SERVED). Two of three
    records rejected pass a bound of 0.5, the third's damage is one of the two served."""
    hits = [{**chat(i, i), "cache_hit": True} for i in (1, 2)]
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0), *hits])
    assert anonymize(tiny_tokenizer, [src], tmp_path / "out", "--max-rejected-fraction", "0.5") == 0
    letters = read_jsonl(published_letters(tmp_path / "out-rejected"))
    assert [letter["error"] for letter in letters] == ["gateway_cache_hit"] * 2
    damaged = write_jsonl(tmp_path / "damaged.jsonl", [chat(0, 0), *hits, b"bad"])
    assert (
        anonymize(tiny_tokenizer, [damaged], tmp_path / "no", "--max-rejected-fraction", "0.4") == 1
    )


def test_same_records_split_and_ordered_differently_give_identical_bytes(tiny_tokenizer, tmp_path):
    records = [chat(i, 7 * (i // 3), session=f"s{i % 4}") for i in range(40)]  # equal timestamps
    one = write_jsonl(tmp_path / "all.jsonl", records)
    shuffled = records[:]
    random.Random(1).shuffle(shuffled)
    parts = [write_jsonl(tmp_path / f"part{k}.jsonl", shuffled[k::3]) for k in range(3)]
    assert anonymize(tiny_tokenizer, [one], tmp_path / "a", "--block-size", "4") == 0
    assert (
        anonymize(
            tiny_tokenizer,
            parts,
            tmp_path / "b",
            "--block-size",
            "4",
            "--salt-file",
            str(_salt(tmp_path)),
            "--hash-shards",
            "5",
        )
        == 0
    )
    for name in ("trace-00000-of-00001.jsonl", "trace-00000-of-00001.parquet", "stats.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


@pytest.mark.slow  # over a second: .ci/run runs the slow set
@pytest.mark.beam
def test_two_workers_give_identical_bytes(tiny_tokenizer, tmp_path):
    records = [chat(i, 3 * (i // 2)) for i in range(30)]
    src = write_jsonl(tmp_path / "in.jsonl", records)
    assert anonymize(tiny_tokenizer, [src], tmp_path / "a") == 0
    assert (
        anonymize(
            tiny_tokenizer,
            [src],
            tmp_path / "b",
            "--direct_num_workers",
            "2",
            "--direct_running_mode",
            "multi_threading",
        )
        == 0
    )
    for name in ("trace-00000-of-00001.jsonl", "trace-00000-of-00001.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_nothing_published_carries_text_token_ids_or_identifiers(tiny_tokenizer, tmp_path):
    secret_session = "alice@example.com"
    records = [dict(chat(i, i), session_id=secret_session) for i in range(5)]
    records.append({"timestamp": 9, "input_ids": [31337, 27182, 16180], "output_length": 1})
    src = write_jsonl(tmp_path / "in.jsonl", records)
    assert (
        anonymize(tiny_tokenizer, [src], tmp_path / "out", "--salt-file", str(_salt(tmp_path))) == 0
    )
    published = b"".join(p.read_bytes() for p in (tmp_path / "out").iterdir())
    for secret in (
        b"alice",
        b"quick",
        b"caching",
        b"31337",
        b"27182",
        b"16180",
        SALT.encode(),
        str(src).encode(),
    ):
        assert secret not in published, secret
    assert {p.name for p in (tmp_path / "out").iterdir()} == {
        "trace-00000-of-00001.jsonl",
        "trace-00000-of-00001.parquet",
        "stats.json",
        "manifest.json",
    }


def test_parquet_gzip_and_zstd_inputs_read_like_jsonl(tiny_tokenizer, tmp_path):
    import gzip

    import pyarrow as pa
    import zstandard

    records = [chat(i, 10 * i) for i in range(9)]
    plain = write_jsonl(tmp_path / "plain.jsonl", records)
    lines = [json.dumps(r).encode() + b"\n" for r in records]
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(b"".join(lines[:3])))
    (tmp_path / "b.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(b"".join(lines[3:6]))
    )
    pq.write_table(pa.Table.from_pylist(records[6:]), tmp_path / "c.parquet")
    assert anonymize(tiny_tokenizer, [plain], tmp_path / "one") == 0
    assert (
        anonymize(
            tiny_tokenizer,
            [tmp_path / "a.jsonl.gz", tmp_path / "*.zst", tmp_path / "c.parquet"],
            tmp_path / "many",
        )
        == 0
    )
    assert trace(tmp_path / "one") == trace(tmp_path / "many")


def test_clear_errors_for_missing_inputs_and_flags(tiny_tokenizer, tmp_path, capsys):
    assert anonymize(tiny_tokenizer, [tmp_path / "nothing-*.jsonl"], tmp_path / "out") == 2
    assert "matches no file" in capsys.readouterr().err
    assert main(["anonymize", "--output", str(tmp_path)]) == 2
    assert "missing --input, --tokenizer" in capsys.readouterr().err


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["anonymize", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--input",
        "--output",
        "--tokenizer",
        "--block-size",
        "--input-format",
        "--dead-letter",
        "--salt-file",
        "--config",
        "--max-rejected-fraction",
    ):
        assert flag in text
    assert "Beam options pass through" in text


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_config_presets_merge_under_flags(tiny_tokenizer, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [FRANCE, FINLAND])
    preset = tmp_path / "preset.yaml"
    preset.write_text(
        f"tokenizer: {tiny_tokenizer}\nblock-size: 2\ninput: [{src}]\n"
        "beam:\n  direct_num_workers: 1\n"
    )
    assert (
        main(
            [
                "anonymize",
                "--config",
                str(preset),
                "--output",
                str(tmp_path / "o"),
                "--block-size",
                "4",
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["block_size"] == 4


def _salt(tmp_path: Path) -> Path:
    path = tmp_path / "salt"
    path.write_text(SALT)
    return path


@pytest.fixture(autouse=True)
def _no_env_salt(monkeypatch):
    monkeypatch.delenv("KVTRACE_SALT", raising=False)


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_a_request_longer_than_an_id_batch_is_exported(tiny_tokenizer, tmp_path):
    # 260k blocks of ids within the tiny tokenizer's vocabulary (38: ids past it are letters)
    long = {"timestamp": 1, "input_ids": list(range(20)) * 13_000, "output_length": 1}
    src = write_jsonl(tmp_path / "in.jsonl", [long, {**long, "timestamp": 2}, chat(0, 3)])
    assert anonymize(tiny_tokenizer, [src], tmp_path / "out", "--block-size", "1") == 0
    rows = trace(tmp_path / "out")
    assert [len(r["hash_ids"]) for r in rows[:2]] == [260_000, 260_000]
    assert rows[0]["hash_ids"] == rows[1]["hash_ids"]


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_a_truncated_gzip_file_is_counted_and_its_readable_records_exported(
    tiny_tokenizer, tmp_path
):
    import gzip

    records = [chat(i, 10 * i) | {"pad": "z" * (200 + i * 7919 % 500)} for i in range(6000)]
    data = gzip.compress(b"".join(json.dumps(r).encode() + b"\n" for r in records))
    src = tmp_path / "in.jsonl.gz"
    src.write_bytes(data[: len(data) * 3 // 4])
    assert anonymize(tiny_tokenizer, [src], tmp_path / "out") == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())["records"]
    letters = [r for p in (tmp_path / "out-rejected").glob("*.jsonl") for r in read_jsonl(p)]
    assert [r["error"] for r in letters].count("damaged_file") == 1
    assert 0 < manifest["exported"] < len(records)
    assert (
        anonymize(tiny_tokenizer, [src], tmp_path / "strict", "--max-rejected-fraction", "0") == 1
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--blocksize", "16"], "--blocksize (did you mean --block-size?)"),
        pytest.param(  # not "--processes is for...": Beam's own options parser reads -v
            ["--processes", "1", "-v"], "unknown option(s): -v", marks=pytest.mark.beam
        ),
        (["--max-rejected-fraction", "nan"], "--max-rejected-fraction must be a number in [0, 1]"),
        (["--max-rejected-fraction", "-1"], "--max-rejected-fraction must be a number in [0, 1]"),
        (["--block-size", "99999999999"], "--block-size must be a whole number"),
        (["--chat-template-kwargs", "[1]"], "must be a JSON object"),
        (["--dead-letter", "{out}/rejected"], "overlap"),
        (["--dead-letter", "{out}"], "overlap"),
    ],
)
def test_options_are_checked_before_any_work(tiny_tokenizer, tmp_path, capsys, flags, message):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0)])
    flags = [f.format(out=tmp_path / "out") for f in flags]
    assert anonymize(tiny_tokenizer, [src], tmp_path / "out", *flags) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_output_in_the_input_folder_is_refused(tiny_tokenizer, tmp_path, capsys):
    write_jsonl(tmp_path / "in.jsonl", [chat(0, 0)])
    assert anonymize(tiny_tokenizer, [tmp_path / "*.jsonl"], tmp_path) == 2
    assert "lies inside --output" in capsys.readouterr().err
    assert (
        anonymize(
            tiny_tokenizer, [tmp_path / "*.jsonl"], tmp_path / "out", "--dead-letter", str(tmp_path)
        )
        == 2
    )
    assert "overlap" in capsys.readouterr().err
    (tmp_path / "logs").mkdir()
    write_jsonl(tmp_path / "logs" / "a.jsonl", [chat(0, 0)])
    assert (
        anonymize(
            tiny_tokenizer,
            [tmp_path / "logs" / "*.jsonl"],
            tmp_path / "out",
            "--dead-letter",
            str(tmp_path / "logs"),
        )
        == 2
    )
    assert "lies inside --dead-letter" in capsys.readouterr().err


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("kvtrace ")


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=12,
)
FIELDS = [
    "timestamp",
    "messages",
    "prompt",
    "input_ids",
    "output",
    "output_length",
    "session_id",
    "request",
    "response",
    "created",
    "input",
    "system",
    "tools",
]


@st.composite
def hostile_record(draw) -> bytes:
    """A valid chat, prompt or token record with one field replaced by arbitrary JSON, or
    arbitrary JSON, or arbitrary bytes."""
    kind = draw(st.sampled_from(["mutated", "mutated", "json", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(min_size=1, max_size=40)).replace(b"\n", b" ")
    if kind == "json":
        return json.dumps(draw(JSON_VALUES)).encode()
    record = dict(
        draw(
            st.sampled_from(
                [
                    chat(3, 100),
                    {"timestamp": 5, "prompt": "the quick fox"},
                    {"timestamp": 7, "input_ids": [1, 2, 3, 4, 5], "output_length": 2},
                ]
            )
        )
    )
    record[draw(st.sampled_from(FIELDS))] = draw(
        JSON_VALUES | st.sampled_from(["\ud800", 2**64, -(2**70), 1e308, float("nan"), [], {}, ""])
    )
    return json.dumps(record).encode("utf-8", errors="surrogatepass")


# Four whole runs, the fast set's costliest e2e test (2% of its test time; CI runs it): every
# record parsed or a dead letter, never a crash, is checked fast in
# tests/transforms/read/test_records.py (test_arbitrary_json_is_parsed_or_rejected_never_crashes,
# test_mutated_valid_records_are_parsed_or_rejected_never_crash), every line read once in
# tests/transforms/read/test_sources.py (test_every_line_is_read_once_however_the_file_is_split).
@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(hostile_record(), min_size=5, max_size=25))
def test_hostile_logs_every_record_exported_or_dead_lettered(
    tiny_tokenizer, tmp_path_factory, lines
):
    tmp = tmp_path_factory.mktemp("hostile")
    good = [chat(i, 10 * i) for i in range(3)]
    src = write_jsonl(tmp / "in.jsonl", good + lines)
    assert (
        anonymize(
            tiny_tokenizer, [src], tmp / "out", "--block-size", "2", "--max-rejected-fraction", "1"
        )
        == 0
    )
    manifest = json.loads((tmp / "out" / "manifest.json").read_text())["records"]
    records = [line for line in good + lines if not isinstance(line, bytes) or line.strip()]
    assert len(trace(tmp / "out")) == manifest["exported"] >= len(good)
    rejected = [r for p in (tmp / "out-rejected").glob("*.jsonl") for r in read_jsonl(p)]
    assert len(records) == manifest["exported"] + len(rejected)


def test_an_output_folder_holding_other_files_is_refused_untouched(
    tiny_tokenizer, tmp_path, capsys
):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 10 * i) for i in range(4)])
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert anonymize(tiny_tokenizer, [src], out) == 2
    assert "holds files kvtrace did not write (notes.txt)" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_rerun_replaces_an_earlier_output_whole(tiny_tokenizer, tmp_path):
    many = write_jsonl(tmp_path / "many.jsonl", [chat(i, 10 * i) for i in range(6)])
    few = write_jsonl(tmp_path / "few.jsonl", [chat(0, 0)])
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, [many], out) == 0
    assert anonymize(tiny_tokenizer, [few], out) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == sorted(manifest["files"] + ["manifest.json"])
    assert len(trace(out)) == 1
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]


@pytest.mark.parametrize("engine", ["local", "beam"])
@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_private_files_are_owner_only_and_the_output_is_readable(tiny_tokenizer, tmp_path, engine):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0), b"{broken"])
    out = tmp_path / "out"
    salt = tmp_path / "salt"
    salt.write_text(SALT)
    (tmp_path / "out-rejected").mkdir(mode=0o755)  # an existing folder: its files are private
    assert (
        anonymize(
            tiny_tokenizer,
            [src],
            out,
            "--id-map",
            str(tmp_path / "map"),
            "--salt-file",
            str(salt),
            "--hash-scheme",
            "dynamo",
            "--emit-block-hashes",
            "--engine",
            engine,
        )
        == 0
    )
    for private in (tmp_path / "map", tmp_path / "out-block-hashes"):
        for path in [private, *private.rglob("*")]:
            assert path.stat().st_mode & 0o077 == 0, path
    for path in (tmp_path / "out-rejected").iterdir():
        assert path.stat().st_mode & 0o077 == 0, path
    for path in [out, *out.iterdir()]:
        assert path.stat().st_mode & 0o044 == 0o044, path


def test_the_manifest_names_no_local_path_and_no_free_text(tiny_tokenizer, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0)])
    out, salt = tmp_path / "out", tmp_path / "salt"
    salt.write_text(SALT)
    assert (
        anonymize(
            tiny_tokenizer,
            [src],
            out,
            "--salt-file",
            str(salt),
            "--chat-template-kwargs",
            '{"enable_thinking": false, "system_note": "for ACME only"}',
        )
        == 0
    )
    text = (out / "manifest.json").read_text()
    manifest = json.loads(text)
    assert manifest["tokenizer"]["name"] is None and tiny_tokenizer not in text
    kwargs = manifest["chat_template_kwargs"]
    assert kwargs.pop("enable_thinking") is False  # a name kvtrace knows, a boolean
    # an operator's own variable: its name and its text hashed alike
    ((name, value),) = kwargs.items()
    assert name.startswith("hmac-sha256:") and value.startswith("hmac-sha256:")
    assert "ACME" not in text and "system_note" not in text
    assert main(["audit", str(out)]) == 1  # the digests need the tokenizer to be checked
    # and the kwargs' digests the run's kwargs under its salt
    assert main(["audit", str(out), "--tokenizer", tiny_tokenizer]) == 1
    assert (
        main(
            [
                "audit",
                str(out),
                "--tokenizer",
                tiny_tokenizer,
                "--salt-file",
                str(salt),
                "--chat-template-kwargs",
                '{"enable_thinking": false, "system_note": "for ACME only"}',
            ]
        )
        == 0
    )
