"""The one parser and printer of sizes and shares that reuse, simulate and report share."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.presets import load_model
from kvtrace.transforms.cache.capacity import (
    DEFAULT_GPU_KV_CACHE_BYTES,
    DEFAULT_KV_BYTES_PER_TOKEN,
    GIB,
    MAX_CAPACITY_BYTES,
    MAX_CAPACITY_TOKENS,
    capacity_text,
    default_gpu_kv_cache,
    kv_bytes_per_token,
    parse_bytes,
    parse_capacities,
    parse_capacity,
    percent,
)


def test_decimal_and_binary_bytes_and_tokens():
    assert parse_capacity("40GB", 1).bytes == 40 * 10**9
    assert parse_capacity("40GiB", 1).bytes == 40 * 2**30
    assert parse_capacity("1.5TB", 1000).tokens == 1_500_000_000
    assert parse_capacity("3M", None) == parse_capacity("3000000", None)
    assert parse_capacity("500k", 2).bytes == 1_000_000  # tokens, with their bytes known


@pytest.mark.parametrize("text", ["40G", "1.5T", "40g"])
def test_a_bare_giga_or_tera_is_refused_as_bytes_or_tokens(text):
    with pytest.raises(ValueError, match=r"bytes or tokens\? write .*B \(decimal bytes\)"):
        parse_capacity(text, 1000)


@given(st.text(max_size=20))
def test_any_text_parses_or_says_why_in_one_line(text):
    try:
        capacity = parse_capacity(text, 147_456)
    except ValueError as err:
        assert "\n" not in str(err) and "capacity" in str(err)
    else:
        assert capacity.tokens >= 0 and capacity.bytes is not None


@pytest.mark.parametrize(
    "text", ["9" * 400, "9" * 400 + "GB", "99999999999999999999999", "1125899906842625"]
)
def test_a_size_past_the_most_a_capacity_may_be_is_refused_not_overflowed(text):
    with pytest.raises(
        ValueError, match=r"over the most a capacity may be, 2\^(50 tokens|60 bytes)"
    ):
        parse_capacity(text, 147_456)


def test_the_most_a_capacity_may_be_is_taken_exactly():
    assert parse_capacity(str(MAX_CAPACITY_TOKENS), None).tokens == MAX_CAPACITY_TOKENS
    assert parse_capacity(f"{MAX_CAPACITY_BYTES}B", 1).bytes == MAX_CAPACITY_BYTES
    assert parse_capacity("1024TiB", 1).bytes == 1 << 50  # a decimal read exactly, no float


@given(st.integers(min_value=0, max_value=MAX_CAPACITY_TOKENS), st.sampled_from(["", "k", "M"]))
def test_every_size_within_the_bound_parses_to_a_count_int64_holds(number, unit):
    try:
        capacity = parse_capacity(f"{number}{unit}", 147_456)
    except ValueError as err:
        assert "over the most" in str(err)
    else:
        assert 0 <= capacity.tokens <= MAX_CAPACITY_TOKENS


@pytest.mark.parametrize(
    "text", ["3,000,000", "1,5GB", "12, 5 GB", "1,500M", "8,640", "05M", "3M,000", "100,200,300"]
)
def test_a_size_written_with_separators_is_refused_naming_the_flag_and_value(text):
    with pytest.raises(ValueError, match="separators") as refused:
        parse_capacities(text, 1000, "--tier2-capacity")
    assert str(refused.value).startswith(f"--tier2-capacity {text!r}")


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("8,64", [8, 64]), ("3000000,50M", [3_000_000, 50_000_000]), ("0", [0]), ("0.5M", [500_000])],
)
def test_lists_and_a_leading_zero_before_the_point_still_read(text, tokens):
    assert [c.tokens for c in parse_capacities(text, None, "--capacity")] == tokens


def test_a_capacity_of_a_list_refused_names_the_flag():
    with pytest.raises(ValueError, match=r"^--capacity: capacity '40G': bytes or tokens"):
        parse_capacities("3M,40G", 1000, "--capacity")


def test_capacities_print_in_gib_where_a_token_has_bytes_else_in_tokens():
    assert capacity_text(3_000_000, None) == "3,000,000 tokens"
    assert capacity_text(3_000_000, 147_456) == "412.0 GiB"
    assert capacity_text(16, 147_456) == "0.0022 GiB"  # small, never 0.0
    assert percent(0.71349) == "71.3%" and percent(1.0) == "100.0%"


def test_the_default_gpu_cache_is_50_gib_at_the_models_bytes_per_token():
    assert DEFAULT_GPU_KV_CACHE_BYTES == 50 * GIB
    assert DEFAULT_KV_BYTES_PER_TOKEN == kv_bytes_per_token(load_model("llama-3.1-8b"))
    assert default_gpu_kv_cache(None).tokens == 409_600  # Llama-3.1-8B's 128 KiB per token
    qwen = default_gpu_kv_cache(147_456)
    assert qwen.tokens == 50 * GIB // 147_456 and capacity_text(qwen.tokens, 147_456) == "50.0 GiB"


def test_sizes_in_bytes_take_the_capacities_byte_units_and_a_bare_unit():
    assert parse_bytes("1MB", 1) == 10**6 and parse_bytes("1MiB", 1) == 2**20
    assert parse_bytes("4.35MB", 1) == 4_350_000  # exact, where a float loses a byte
    assert parse_bytes("256", 2**20) == 256 * 2**20  # --segment-cache-mb 256, as before units
    assert parse_bytes("1GB", 2**20) == 10**9  # a unit given wins over the bare one
    for text in ("1M", "1.5", "-5", "1 G", "9" * 65):  # 1M: MB or MiB? 1.5 of a bare unit?
        with pytest.raises(ValueError, match="write bytes as 1MB"):
            parse_bytes(text, 1)


@given(st.text(max_size=70))
def test_any_size_text_is_whole_bytes_or_a_one_line_reason(text):
    try:
        size = parse_bytes(text, 2**20)
    except ValueError as err:
        assert "\n" not in str(err) and len(str(err)) < 200
    else:
        assert isinstance(size, int) and size >= 0
