"""Red team round 9, determinism: reproducers of byte-identical output broken by the form, split,
order or engine of the same input. Each test asserts a promise and fails today."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from helpers import (
    SALT,
    WORDS,
    anonymize,
    chat,
    kvtrace_child,
    published_letters,
    read_jsonl,
    shared_path,
    trace,
    write_jsonl,
)

pytestmark = pytest.mark.slow

DAY0 = 1_700_000_000_000


def _salt(tmp_path: Path) -> Path:
    salt = tmp_path / "salt"
    salt.write_text(SALT)
    return salt


def test_a_nanosecond_parquet_timestamp_reads_as_its_jsonl_nanoseconds(tiny_tokenizer, tmp_path):
    """Promise (docs/ANONYMIZE.md, Input; round 8's fix for Arrow timestamps): the same records
    read alike as JSONL and as Parquet. A JSONL time in ns (an integer from 1e17) is floored to
    its ms and published. The same instants as a Parquet timestamp[ns] column (pandas' and
    Spark's datetime64[ns]) are refused when a value has digits below the microsecond:
    paths.python_values calls to_pylist, which without pandas installed raises 'Nanosecond
    resolution temporal type ... is not safely convertible', and each such row becomes a
    malformed_record letter (the summary says 'expected one JSON object per line', of a
    Parquet file). pyarrow returns pandas Timestamps instead
    where pandas is installed: whether the rows publish depends on the worker's packages."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    nanos = [(DAY0 + 700 * i) * 1_000_000 + 123_457 for i in range(6)]
    records = [chat(i, 0, f"u{i % 2}") for i in range(6)]
    as_jsonl = write_jsonl(
        tmp_path / "log.jsonl", [{**r, "timestamp": ns} for r, ns in zip(records, nanos)]
    )
    table = pa.Table.from_pylist(records)
    column = pa.array(nanos, type=pa.timestamp("ns"))
    table = table.set_column(table.schema.get_field_index("timestamp"), "timestamp", column)
    as_parquet = tmp_path / "log.parquet"
    pq.write_table(table, as_parquet)
    salt = _salt(tmp_path)
    runs = {}
    for name, log in (("jsonl", as_jsonl), ("parquet", as_parquet)):
        out = tmp_path / name
        code = anonymize(tiny_tokenizer, [log], out, "--block-size", "4", "--salt-file", str(salt))
        runs[name] = (code, trace(out))
    assert runs["jsonl"][0] == 0 and len(runs["jsonl"][1]) == 6
    assert runs["parquet"] == runs["jsonl"]


def test_a_parquet_timestamp_reads_whatever_zone_database_the_worker_has(tiny_tokenizer, tmp_path):
    """Promise (docs/ANONYMIZE.md, Input; transforms/read/timestamps.py: 'read by its own unit
    and zone ... so a run never depends on the worker's'): an Arrow timestamp column stores UTC
    instants; its zone is a label for display and does not change a value's ms. The reader
    turns each value into a zoned Python datetime (to_pylist), which looks the label up in
    whatever zone database the worker has (pytz, else zoneinfo and the system's tzdata). A zone
    that database lacks, here 'US/Pacific-New' (in tzdata until 2020b, in files written then),
    fails every value of the column: every row a malformed_record letter, the run refused,
    where the same instants as JSONL numbers publish. Which labels pass depends on the
    worker's pytz/tzdata release, so the same file publishes on one machine and not another."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    millis = [DAY0 + 700 * i for i in range(6)]
    records = [chat(i, 0, f"u{i % 2}") for i in range(6)]
    as_jsonl = write_jsonl(
        tmp_path / "log.jsonl", [{**r, "timestamp": ms} for r, ms in zip(records, millis)]
    )
    table = pa.Table.from_pylist(records)
    column = pa.array([ms * 1000 for ms in millis], type=pa.timestamp("us", tz="US/Pacific-New"))
    table = table.set_column(table.schema.get_field_index("timestamp"), "timestamp", column)
    as_parquet = tmp_path / "log.parquet"
    pq.write_table(table, as_parquet)
    salt = _salt(tmp_path)
    runs = {}
    for name, log in (("jsonl", as_jsonl), ("parquet", as_parquet)):
        out = tmp_path / name
        code = anonymize(tiny_tokenizer, [log], out, "--block-size", "4", "--salt-file", str(salt))
        runs[name] = (code, trace(out))
    assert runs["jsonl"][0] == 0 and len(runs["jsonl"][1]) == 6
    assert runs["parquet"] == runs["jsonl"]


def test_a_parquet_duration_column_reads_as_its_jsonl_seconds(tiny_tokenizer, tmp_path):
    """Promise (docs/ANONYMIZE.md, Input: JSONL 'and Parquet with the same fields'; round 8 read
    Parquet's own type for a time, the Arrow timestamp, as its JSONL number): a response time
    logged as `latency` reads alike in both forms. In JSONL it is a number of seconds; Parquet's
    own type for it is an Arrow duration (what pandas writes for a timedelta column, its unit in
    the type). response_end._duration_ms refuses the datetime.timedelta python_values hands it:
    every row a wrong_type letter, the run refused, where the JSONL of the same latencies
    publishes every row with its response_ms."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    latency_ms = [250 * (i + 1) for i in range(6)]
    records = [chat(i, DAY0 + 700 * i, f"u{i % 2}") for i in range(6)]
    as_jsonl = write_jsonl(
        tmp_path / "log.jsonl", [{**r, "latency": ms / 1000} for r, ms in zip(records, latency_ms)]
    )
    table = pa.Table.from_pylist(records).append_column(
        "latency", pa.array(latency_ms, type=pa.duration("ms"))
    )
    as_parquet = tmp_path / "log.parquet"
    pq.write_table(table, as_parquet)
    salt = _salt(tmp_path)
    runs = {}
    for name, log in (("jsonl", as_jsonl), ("parquet", as_parquet)):
        out = tmp_path / name
        code = anonymize(tiny_tokenizer, [log], out, "--block-size", "4", "--salt-file", str(salt))
        runs[name] = (code, trace(out))
    assert runs["jsonl"][0] == 0 and [r["response_ms"] for r in runs["jsonl"][1]] == latency_ms
    assert runs["parquet"] == runs["jsonl"]


TOKENIZER_SETTINGS = {
    "truncation": {"direction": "Right", "max_length": 24, "strategy": "LongestFirst", "stride": 0},
    "padding": {
        "strategy": "BatchLongest",
        "direction": "Right",
        "pad_to_multiple_of": None,
        "pad_id": 0,
        "pad_type_id": 0,
        "pad_token": "<unk>",
    },
}


@pytest.mark.parametrize("setting", sorted(TOKENIZER_SETTINGS))
def test_a_tokenizer_files_truncation_or_padding_never_decides_the_bytes(
    tiny_tokenizer, tmp_path, setting
):
    """Promise: the same input and configuration give byte-identical output whatever the record
    order, and the lengths are the prompts' own. Many tokenizer.json files on the hub carry a
    `truncation` or `padding` section from their export; fast_tokenizer.FastTokenizer.from_files
    loads the file as it is (only the fastokens gate looks at these sections), so `tokenizers`
    applies them to every encode_batch_fast. Padding pads each text to the longest of its batch,
    so a row's input_length and ids depend on which records share its batch; truncation cuts
    each segment_cache piece on its own (not the whole prompt), and the cache's check of one cut
    text in 128 turns the cache off from wherever a worker meets a mismatch: which rows were cut
    depends on the order. The same 300 chats in two orders publish different rows."""
    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(tiny_tokenizer, tokenizer)
    config = json.loads((tokenizer / "tokenizer.json").read_text())
    config[setting] = TOKENIZER_SETTINGS[setting]
    (tokenizer / "tokenizer.json").write_text(json.dumps(config))
    rng = random.Random(11)

    def words() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))

    records = []
    for i in range(300):
        record = chat(rng.randint(0, 9), DAY0 + 1000 * i, f"u{i % 50}", rotate=rng.randint(0, 9))
        record["messages"] += [
            {"role": "assistant", "content": words()},
            {"role": "user", "content": words()},
        ]
        records.append(record)
    shuffled = records[:]
    rng.shuffle(shuffled)
    salt = _salt(tmp_path)
    runs = []
    for name, rows in (("given", records), ("shuffled", shuffled)):
        log = write_jsonl(tmp_path / f"{name}.jsonl", rows)
        out = tmp_path / name
        code = anonymize(str(tokenizer), [log], out, "--block-size", "4", "--salt-file", str(salt))
        runs.append((code, trace(out)))
    assert runs[0] == runs[1]
    if runs[0][0] == 0:  # used, not refused: the prompts' own lengths
        plain = tmp_path / "plain"
        given = tmp_path / "given.jsonl"
        args = ("--block-size", "4", "--salt-file", str(salt))
        assert anonymize(tiny_tokenizer, [given], plain, *args) == 0
        assert runs[0][1] == trace(plain)


def test_a_tokenizer_files_bpe_dropout_never_decides_the_bytes(tmp_path):
    """Promise: the same input and configuration give byte-identical output. A BPE
    tokenizer.json may carry `model.dropout` (a training-time setting: each merge skipped at
    random); FastTokenizer.from_files loads it as it is (only the fastokens gate refuses it), so
    `tokenizers` drops merges at random in every encode: the same log anonymized twice with the
    same tokenizer folder publishes different lengths and ids (Qwen3's tokenizer.json with
    dropout 0.2 here; the examples gave another trace on every run)."""
    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(shared_path("tokenizers", "qwen3"), tokenizer)
    config = json.loads((tokenizer / "tokenizer.json").read_text())
    config["model"]["dropout"] = 0.2
    (tokenizer / "tokenizer.json").write_text(json.dumps(config))
    text = "Summarize the following paragraph about caching transformer attention keys. " * 8
    log = write_jsonl(
        tmp_path / "log.jsonl",
        [
            {"timestamp": DAY0 + 1000 * i, "prompt": f"{i} {text}", "output_length": 3}
            for i in range(8)
        ],
    )
    salt = _salt(tmp_path)
    runs = []
    for name in ("first", "second"):
        out = tmp_path / name
        args = ("--block-size", "16", "--salt-file", str(salt))
        runs.append((anonymize(str(tokenizer), [log], out, *args), trace(out)))
    assert runs[0][0] == 0
    assert runs[0] == runs[1]


def test_a_chat_template_reading_the_clock_never_decides_the_bytes(tiny_tokenizer, tmp_path):
    """Promise: the same input and configuration give byte-identical output on any worker, day
    or time zone. transformers' renderer gives every template `strftime_now`, the worker's
    local wall clock, and real templates call it (Llama 3.2 and 3.3 put
    `strftime_now("%d %b %Y")` in every system prompt); template_renderer leaves it in the
    sandbox, so a prompt's tokens depend on when and where it is anonymized, not on the
    request: its length changes with the date's spelling, and a night rerun another day (or
    on a Beam worker in another zone, or across midnight) hashes other blocks. Here a template
    repeats a word once per hour of strftime_now("%H"): the same log under TZ=UTC and
    TZ=Pacific/Kiritimati (14 hours apart, so never the same hour) publishes other lengths."""
    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(tiny_tokenizer, tokenizer)
    template = tokenizer / "chat_template.jinja"
    clock = '<|im_start|>system\n{{ "the " * (strftime_now("%H") | int) }}<|im_end|>\n'
    template.write_text(clock + template.read_text())
    log = write_jsonl(tmp_path / "log.jsonl", [chat(i, DAY0 + 1000 * i) for i in range(4)])
    salt = _salt(tmp_path)
    runs = []
    for zone in ("UTC", "Pacific/Kiritimati"):
        out = tmp_path / zone.replace("/", "-")
        args = ["anonymize", "--input", str(log), "--output", str(out), "--tokenizer"]
        args += [str(tokenizer), "--block-size", "4", "--salt-file", str(salt)]
        done = kvtrace_child(*args, env={"TZ": zone})
        runs.append((done.returncode, trace(out)))
    assert runs[0][0] == 0
    assert runs[0] == runs[1]


@pytest.mark.parametrize(
    "draw",
    ['{{ "the " * (range(40) | random) }}', "{{ lipsum(1, html=False, min=5, max=40) }}"],
    ids=["random", "lipsum"],
)
def test_a_chat_template_drawing_at_random_never_decides_the_bytes(tiny_tokenizer, tmp_path, draw):
    """Promise: the same input and configuration give byte-identical output. The template
    sandbox (bounded_sandbox.BoundedSandbox, Jinja's defaults) keeps Jinja's `random` filter and
    `lipsum` global, both drawn from Python's unseeded random module at each render: a template
    using either renders other text, so other lengths and ids, on every run of the same log.
    (Fixed: the sandbox keeps only pure names, so such a template renders no request, the same
    template_error letter for each on every run; the prompts here publish alone.)"""
    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(tiny_tokenizer, tokenizer)
    template = tokenizer / "chat_template.jinja"
    template.write_text(f"<|im_start|>system\n{draw}<|im_end|>\n" + template.read_text())
    prompts = [
        {"timestamp": DAY0 + 1000 * i, "prompt": " ".join(WORDS[i:]), "output_length": 1}
        for i in range(8)
    ]
    chats = [chat(i, DAY0 + 1000 * i) for i in range(8, 15)]
    log = write_jsonl(tmp_path / "log.jsonl", prompts + chats)
    salt = _salt(tmp_path)
    runs = []
    for name in ("first", "second"):
        out = tmp_path / name
        # the chats' letters are most of the input's bytes: the letters are the subject here
        args = ("--block-size", "4", "--salt-file", str(salt), "--max-rejected-fraction", "1")
        code = anonymize(str(tokenizer), [log], out, *args)
        letters = [
            (letter["error"], letter["message"])
            for letter in read_jsonl(published_letters(Path(f"{out}-rejected")))
        ]
        runs.append((code, trace(out), letters))
    assert runs[0][0] == 0 and len(runs[0][1]) == 8
    assert [reason for reason, _ in runs[0][2]] == ["template_error"] * 7
    assert runs[0] == runs[1]
