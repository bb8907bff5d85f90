"""Red team round 10, hostile input: reproducers of the holes found past the round-1..9 fixes
(test_redteam_input*.py). Each asserts the promised behaviour (bad input: a one-line error or
a dead letter saying why, never a value read wrong, a traceback or a run that differs by the
worker's environment) and fails today (2026-11-27)."""

from __future__ import annotations

import datetime as dt
import json
import shutil

import pytest

from helpers import KVTRACE, kvtrace_child, peak_rss_mb, read_jsonl, trace, write_jsonl

pytestmark = pytest.mark.slow


def _anonymize(inputs: list, out, tokenizer: str, *extra: str, env: dict | None = None):
    args = ["anonymize", "--output", str(out), "--tokenizer", tokenizer, "--quiet", *extra]
    for path in inputs:
        args += ["--input", str(path)]
    return kvtrace_child(*args, timeout=120, env=env)


def _letters(out) -> list[dict]:
    folder = out.parent / f"{out.name}-rejected"
    return [row for path in sorted(folder.glob("rejected-*.jsonl")) for row in read_jsonl(path)]


def _outcome(out) -> tuple[list[int], list[str]]:
    """What a run made of the records: its rows' input lengths and its letters' reasons."""
    return [row["input_length"] for row in trace(out)], sorted(
        letter["error"] for letter in _letters(out)
    )


def _odd_template(tiny_tokenizer: str, tmp_path, odd: str):
    """A copy of the tiny tokenizer whose chat template runs `odd` for a record saying "odd"
    and renders every record's text, and a log of two records: "hi", then "odd". So the run
    publishes "hi" whatever becomes of "odd" (exported, or a dead letter once fixed)."""
    folder = tmp_path / "tokenizer"
    shutil.copytree(tiny_tokenizer, folder)
    (folder / "chat_template.jinja").write_text(
        '{% if messages[0].content == "odd" %}' + odd + "{% endif %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    log = write_jsonl(
        tmp_path / "logs.jsonl",
        [
            {"timestamp": 1_735_689_600_000 + i, "messages": [{"role": "user", "content": text}]}
            for i, text in enumerate(["hi", "odd"])
        ],
    )
    return folder, log


def _peak_of_run(folder, log, out) -> tuple[int, int, str]:
    """(exit code, peak RSS in MB, stderr) of anonymizing log with the tokenizer in folder."""
    return peak_rss_mb(
        [
            *KVTRACE,
            "anonymize",
            "--input",
            str(log),
            "--output",
            str(out),
            "--tokenizer",
            str(folder),
            "--quiet",
            "--processes",
            "1",
            "--max-rejected-fraction",
            "1",
        ]
    )


def test_an_int96_timestamp_past_what_nanoseconds_hold_is_not_read_as_another_time(
    tiny_tokenizer, tmp_path
):
    """paths.without_views promises Parquet times "read from their storage ... as UTC
    microseconds", but an INT96 timestamp column (Spark's and Hive's legacy form, which
    parquet-mr still writes) is turned into Arrow nanoseconds by Arrow's reader before kvtrace
    sees it (pq.ParquetFile's default coerce_int96_timestamp_unit): a moment past 2262 wraps
    modulo 2^64 ns. A row stamped 2609-07-22 (as the same record in JSONL, an
    implausible_timestamp dead letter) is published as 2025-01-01 00:00:00.999, beside the
    night's real rows: a record read as another time, no letter, nothing said."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    wrap = dt.timedelta(microseconds=2**64 // 1000)  # 2^64 ns in whole microseconds
    stamps = [dt.datetime(2025, 1, 1), dt.datetime(2025, 1, 1, 0, 0, 1) + wrap]
    messages = [[{"role": "user", "content": "hi there"}]] * 2
    table = pa.table(
        {"timestamp": pa.array(stamps, pa.timestamp("us")), "messages": pa.array(messages)}
    )
    log = tmp_path / "logs.parquet"
    pq.write_table(table, log, use_deprecated_int96_timestamps=True)
    out = tmp_path / "out"
    done = _anonymize([log], out, tiny_tokenizer, "--max-rejected-fraction", "1")
    assert done.returncode == 0, done.stderr
    assert len(trace(out)) == 1, trace(out)
    assert [letter["error"] for letter in _letters(out)] == ["implausible_timestamp"]


def test_strftime_now_renders_alike_in_every_worker_zone(tiny_tokenizer, tmp_path):
    """template_names.py: "A render must give the same text for the same request on any
    worker, day or zone", so strftime_now reads the request's time in UTC. But it formats with
    datetime.strftime, which hands `%s` to the C library, and glibc's `%s` is mktime() of the
    fields read as the worker's local time: the same request renders 1735689600 under TZ=UTC
    and 1735657200 under TZ=Asia/Tokyo. A template whose text depends on it (here: repeats a
    phrase by its last digits) publishes another trace (input_length 1201 vs 401) from the
    same input, salt and tokenizer, by the worker's zone alone."""
    folder, log = _odd_template(
        tiny_tokenizer, tmp_path, '{{ "the fox " * (strftime_now("%s") | int % 1000) }}'
    )
    runs = {}
    for zone in ("UTC", "Asia/Tokyo"):
        out = tmp_path / f"out-{zone.replace('/', '-')}"
        done = _anonymize([log], out, str(folder), "--max-rejected-fraction", "1", env={"TZ": zone})
        assert done.returncode == 0, done.stderr
        runs[zone] = _outcome(out)
    assert runs["UTC"] == runs["Asia/Tokyo"]


def _batch_pair(custom_id: str, i: int) -> tuple[dict, dict]:
    """An OpenAI Batch input line and the output line answering it."""
    body = {"model": "m", "messages": [{"role": "user", "content": "the fox"}]}
    answer = {
        "created": 1_763_703_600 + i,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "the fox"}}],
        "usage": {"completion_tokens": 3},
    }
    return (
        {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body},
        {"custom_id": custom_id, "response": {"status_code": 200, "body": answer}, "error": None},
    )


@pytest.mark.beam
def test_a_batch_custom_id_holding_a_lone_surrogate_is_a_letter_on_beam_too(
    tiny_tokenizer, tmp_path
):
    """A custom_id written `"\\ud800"` (valid JSON, a lone surrogate once parsed) pairs and is
    refused as invalid_unicode on the local engine (its sort keys the custom_id as escaped
    ASCII: batch_join.spill_line). On Beam, SetAsideHalves keys the GroupByKey by the str
    itself, whose UTF-8 coder cannot encode it: the whole night fails, exit 2, with "error:
    'utf-8 [while running 'JoinBatch/SetAsideHalves/ParDo(SetAsideHalves)']' codec can't
    encode character '\\ud800' ...": one hostile line in a Batch file denies the night on Beam,
    and the engines read the same input differently."""
    good, odd = _batch_pair("a", 0), _batch_pair("\ud800", 1)
    inputs = [
        write_jsonl(tmp_path / "input.jsonl", [good[0], odd[0]]),
        write_jsonl(tmp_path / "answers.jsonl", [good[1], odd[1]]),
    ]
    reasons = {}
    for engine in ("local", "beam"):
        out = tmp_path / f"out-{engine}"
        done = _anonymize(
            inputs, out, tiny_tokenizer, "--engine", engine, "--max-rejected-fraction", "1"
        )
        assert done.returncode == 0, done.stderr
        assert len(trace(out)) == 1
        reasons[engine] = sorted(letter["error"] for letter in _letters(out))
    # Fixed as: a line whose custom_id UTF-8 cannot encode is no Batch half on any engine
    # (batch_join.batch_half), so each of the two is read alone, a letter each.
    assert reasons["beam"] == reasons["local"] == ["invalid_unicode", "invalid_unicode"]


@pytest.mark.parametrize(
    "value",
    ["2025-02-30", "9" * 5000],
    ids=["a-date-past-its-month", "an-integer-past-python-s-digits"],
)
def test_a_config_value_yaml_cannot_construct_is_named_by_its_file(tmp_path, value):
    """config.load_bounded_yaml turns every YAMLError into "--config PATH: not valid YAML
    (...)", but YAML's safe constructor raises plain ValueError for a plain scalar it resolves
    and cannot build: an unquoted 2025-02-30 (a timestamp to YAML: "day is out of range for
    month") or an integer past Python's 4,300 digits. The CLI then prints only "error: day is
    out of range for month", naming neither --config, the file nor the key; an operator with
    a few presets has nothing to look for."""
    config = tmp_path / "night.yaml"
    config.write_text(f"date: {value}\n")
    done = kvtrace_child(
        "anonymize",
        "--config",
        str(config),
        "--input",
        str(tmp_path / "logs.jsonl"),
        "--output",
        str(tmp_path / "out"),
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "--config" in done.stderr and str(config) in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_xmlattr_prints_no_object_s_address_into_the_render(tiny_tokenizer, tmp_path):
    """bounded_sandbox.py: a value printed as text is measured by walking what it holds, and "a
    type whose text its size does not tell is refused, never printed" (`{{ cycler(1) }}`,
    `|string`, `~`, `|tojson`, `|pprint`, `|urlencode` are all ValueTooLarge). Jinja's
    `xmlattr` filter (on the allow-list) str()s a mapping's values without that check: `{"a":
    cycler(1)} | xmlattr` renders ` a="&lt;jinja2.utils.Cycler object at 0x7f...&gt;"`, an
    address that differs in every process. A template that spells text from it (here: repeats
    a phrase by the address's page bits) publishes another trace on every run of the same
    input, salt and tokenizer (input_length 163109, then 32579)."""
    folder, log = _odd_template(
        tiny_tokenizer,
        tmp_path,
        '{% set shown = {"a": cycler(1)} | xmlattr %}'
        '{{ "the fox " * ((shown.split(" at ")[1][:14] | int(base=16)) // 4096 % 100000) }}',
    )
    runs = []
    for run in range(2):
        out = tmp_path / f"out-{run}"
        done = _anonymize([log], out, str(folder), "--max-rejected-fraction", "1")
        assert done.returncode == 0, done.stderr
        runs.append(_outcome(out))
    assert runs[0] == runs[1]


def test_raise_exception_of_an_object_gives_the_same_letter_on_every_run(tiny_tokenizer, tmp_path):
    """The same hole as xmlattr's, in the dead letters: transformers' raise_exception (on the
    allow-list) str()s its message unchecked, so `raise_exception(cycler(1))` refuses the
    record with "TemplateError: <jinja2.utils.Cycler object at 0x7f2fba0e2b90>", another
    address on every run: the same input and config give other dead-letter bytes (and another
    letters file name, a hash of them) each time."""
    folder, log = _odd_template(tiny_tokenizer, tmp_path, "{{ raise_exception(cycler(1)) }}")
    letters = []
    for run in range(2):
        out = tmp_path / f"out-{run}"
        done = _anonymize([log], out, str(folder), "--max-rejected-fraction", "1")
        assert done.returncode == 0, done.stderr
        letters.append(_letters(out))
    assert len(letters[0]) == 1
    assert letters[0] == letters[1]


def test_a_timestamp_past_what_microseconds_hold_is_not_read_as_another_time(
    tiny_tokenizer, tmp_path
):
    """_python_rows casts every row to without_views' types with safe=False, so that
    nanoseconds floor to microseconds; but the same cast turns a timestamp[ms] (Parquet's
    TIMESTAMP(MILLIS), what most writers keep) into microseconds by multiplying with no
    overflow check (a timestamp[s] in the file's Arrow schema alike). A value of 2^61 +
    1735689600001 ms (a moment some 73 million years on, which "a value Python cannot hold ...
    fails its row alone" means to refuse) wraps modulo 2^64 to 2025-01-01T00:00:00.001 and is
    published beside the night's real rows, no letter, nothing said."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    wrap = 2**61  # x 1000 microseconds a millisecond: 125 x 2^64, nothing modulo 2^64
    real = 1_735_689_600_000
    stamps = pa.array([real, real + 1 + wrap], pa.timestamp("ms"))
    messages = pa.array([[{"role": "user", "content": "hi there"}]] * 2)
    log = tmp_path / "logs.parquet"
    pq.write_table(pa.table({"timestamp": stamps, "messages": messages}), log)
    out = tmp_path / "out"
    done = _anonymize([log], out, tiny_tokenizer, "--max-rejected-fraction", "1")
    assert done.returncode == 0, done.stderr
    assert len(trace(out)) == 1, trace(out)
    assert len(_letters(out)) == 1


def test_a_deeply_nested_batch_line_is_a_letter_not_the_end_of_the_night(tiny_tokenizer, tmp_path):
    """A Batch input line nested 1,000 lists deep passes batch_half (orjson reads up to 1,024
    levels, and the container count is far within --max-record-bytes' bound), so it is set
    aside and paired. batch_join.joined_line then writes the pair with json.dumps, whose C
    encoder stops at Python's recursion limit, and nothing catches it: on the local engine the
    run dies with "error: the job failed: RecursionError: maximum recursion depth exceeded
    while encoding a JSON object", exit 1, nothing published for the other lines. The same
    record as a plain log line, or the same pair on Beam, is a too_deep dead letter."""
    request, answer = _batch_pair("deep", 0)
    line = json.dumps(request)[:-1] + ', "extra": ' + "[" * 1000 + "]" * 1000 + "}"
    good = _batch_pair("good", 1)
    inputs = [
        write_jsonl(tmp_path / "input.jsonl", [good[0], line]),
        write_jsonl(tmp_path / "answers.jsonl", [good[1], answer]),
    ]
    out = tmp_path / "out"
    done = _anonymize(inputs, out, tiny_tokenizer, "--max-rejected-fraction", "1")
    assert done.returncode == 0, done.stderr
    assert len(trace(out)) == 1
    assert [letter["error"] for letter in _letters(out)] == ["too_deep"]


def test_a_set_made_of_dict_keys_renders_alike_in_every_process(tiny_tokenizer, tmp_path):
    """The sandbox intercepts `-` to size it, then lets Python compute it: `d.keys() - []` on a
    dict's keys view (or items view) is a set, whose order is that of str hashes, seeded anew
    in every process (PYTHONHASHSEED; each run, each clean worker, each Beam worker). So `(d.
    keys() - []) | list` lists the same keys in another order per process, and a template
    spelling text from that order renders the same request differently: here input_length 59,
    117 and 119 under hash seeds 1, 2 and 3, from the same input, salt and tokenizer. The
    promise (template_names.py): "the same text for the same request on any worker"."""
    folder, log = _odd_template(
        tiny_tokenizer,
        tmp_path,
        "{% set order = (dict(a=1, b=2, c=3, d=4, e=5, f=6, g=7, h=8).keys() - []) | list %}"
        '{{ "the fox " * (order.index("a") * 8 + order.index("b") + 1) }}',
    )
    runs = []
    for seed in ("1", "2"):
        out = tmp_path / f"out-{seed}"
        done = _anonymize(
            [log], out, str(folder), "--max-rejected-fraction", "1", env={"PYTHONHASHSEED": seed}
        )
        assert done.returncode == 0, done.stderr
        runs.append(_outcome(out))
    assert runs[0] == runs[1]


def test_strftime_now_cannot_take_a_render_past_its_memory_budget(tiny_tokenizer, tmp_path):
    """render_budget.py bounds a render's growth to RENDER_MEMORY_BYTES (1 GiB), checked
    between the template's Python steps, so bounded_sandbox.py sizes every value a single C call
    could build before the call. strftime_now (template_names.py) is not sized: one call of
    `strftime_now("%c" * 16_000_000)` (a 32 MB format, within MAX_VALUE_LENGTH, built by a
    100-byte template) expands each `%c` to 24 characters in C (wcsftime's buffer at 4 bytes a
    character, doubled until it fits): ~2 GB in one step no tick can stop, and a string of
    384 M characters, past MAX_VALUE_LENGTH (256 Mi: "no text ... may exceed" it, BOUNDS.md),
    which nothing measures: the render succeeds, its record exported. At 256 MB of format,
    ~16 GB: the OOM killer."""
    folder, log = _odd_template(
        tiny_tokenizer, tmp_path, '{{ strftime_now("%c" * 16000000) | length }}'
    )
    out = tmp_path / "out"
    code, peak, stderr = _peak_of_run(folder, log, out)
    assert code == 0, stderr
    assert peak < 1536, peak  # a one-record run is ~100 MB; the budget is 1 GiB over it
    assert len(_letters(out)) == 1


def test_indent_counts_the_lines_it_lists_before_it_lists_them(tiny_tokenizer, tmp_path):
    """bounded_sandbox.py: "A call that lists a value (`|list` of a string, a split) makes a new
    object per item, so what one step may list is counted first too" (MAX_ITEMS, 1 Mi items;
    `split`, `|list`, `|wordcount`, `|title`, `|striptags` and `|urlize` are refused so).
    _filter_indent sizes the result's length only, but Jinja's indent runs `s.splitlines()`,
    one C call: `("ab\\n" * 40000000) | indent(1)` (a 120 MB string, within
    MAX_VALUE_LENGTH) lists 40 M new strings at ~51 bytes each before any tick can stop it:
    the run peaks at ~3.1 GB, three times the render's 1 GiB budget, before the watchdog
    refuses the record (at MAX_VALUE_LENGTH, ~5 GB)."""
    folder, log = _odd_template(
        tiny_tokenizer, tmp_path, '{{ ("ab\\n" * 40000000) | indent(1) | length }}'
    )
    out = tmp_path / "out"
    code, peak, stderr = _peak_of_run(folder, log, out)
    assert code == 0, stderr
    assert peak < 1536, peak  # a one-record run is ~100 MB; the budget 1 GiB over it
    assert len(_letters(out)) == 1


def test_xmlattr_sizes_a_value_before_it_prints_it(tiny_tokenizer, tmp_path):
    """The memory side of xmlattr's unchecked str(): a list literal holding one 100 M-character
    string ten times (a literal is not `*`, so it is not walked when built) is printed by
    `{"a": [s, s, ...]} | xmlattr` in one C call, a billion characters, then escaped, before
    the result is measured and refused: the run peaks past 2 GB, twice the render's budget,
    where `{{ [s, s, ...] }}` is refused by the walk before anything is printed. Ten times
    more references, ten times the memory: no bound."""
    folder, log = _odd_template(
        tiny_tokenizer,
        tmp_path,
        '{% set s = "x" * 100000000 %}'
        '{{ {"a": [s, s, s, s, s, s, s, s, s, s]} | xmlattr | length }}',
    )
    out = tmp_path / "out"
    code, peak, stderr = _peak_of_run(folder, log, out)
    assert code == 0, stderr
    assert peak < 1536, peak  # a one-record run is ~100 MB; the budget 1 GiB over it
    assert len(_letters(out)) == 1
