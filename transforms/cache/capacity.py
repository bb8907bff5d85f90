"""Cache capacities as people write them and as kvtrace prints them, and what a token of KV
cache costs in bytes: the one parser and the one printer of sizes and shares for reuse,
simulate and report.

A capacity is tokens (3000000, 3M, 500k: as vLLM logs its KV cache) or bytes (a unit ending in
B: 40GB and 1.5TB decimal, 10^9 and 10^12 as GPU spec sheets and disks count; 40GiB binary,
2^30, as nvidia-smi counts), which need the bytes one token's KV cache takes: given directly, or
from a model preset (layers, heads, head size and dtype; kvtrace/presets.py finds them). A bare
G or T (40G) is refused: bytes or tokens is the question a typo must not answer. Bad values
raise ValueError with a message for the user.

A size in bytes alone (parse_bytes: --max-record-bytes, --segment-cache-mb, --kv-bytes-per-token
and their preset keys) takes the same byte units; a bare whole number stays in the option's own
unit (bytes, or --segment-cache-mb's MiB), so a preset written before units read the same.

Printed, a capacity is GiB where the bytes per token are known, else tokens; a share is a
percent with one decimal, everywhere (capacity_text, percent).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

_TOKEN_UNITS = {"": 1, "k": 10**3, "m": 10**6}
_AMBIGUOUS_UNITS = ("g", "t")  # 40G: forty billion tokens, or bytes without the B?
_BYTE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
SIZE_HELP = (
    "tokens (3000000, 3M, 500k) or bytes (40GB = 40*10^9, 40GiB = 40*2^30; needs "
    "--kv-bytes-per-token or --model)"
)
# The largest size a capacity may be, tokens or bytes: past what any trace's prompts hold (2^50
# tokens: 30 years at a million tokens a second), and far inside the int64 every count is kept
# in. A size past it is a typo, refused before any work.
MAX_CAPACITY_TOKENS = 1 << 50
MAX_CAPACITY_BYTES = 1 << 60  # an exbibyte
QUOTED_CHARS = 60  # of a flag's text in its error line
_CAPACITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
DTYPE_BYTES = {
    "fp32": 4,
    "float32": 4,
    "bf16": 2,
    "fp16": 2,
    "float16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "int8": 1,
}


@dataclass(frozen=True)
class Capacity:
    tokens: int
    bytes: int | None  # when given in bytes, or when bytes per token are known


# The comma separates capacities, and people also write it inside one number: 3,000,000 (digit
# groups) and 1,5GB (a decimal comma). A list reads as such a number when it opens with a bare
# 1-3 digit number continued by three digits or by digits with a unit; any item of digits after
# a leading zero (000, 05M) is a digit group too, as no one writes a capacity so.
_SEPARATED_NUMBER = re.compile(r"\s*\d{1,3}\s*,\s*(\d{3}\s*(,|$)|\d+(\.\d+)?\s*[a-zA-Z]+\s*$)")
_LEADING_ZERO = re.compile(r"\s*0\d")


def parse_capacities(text: str, kv_bytes_per_token: int | None, flag: str) -> list[Capacity]:
    """Comma-separated capacities, in the order given; a usage error (ValueError) names the
    flag and its whole value."""
    parts = [part for part in text.split(",") if part.strip()]
    if _SEPARATED_NUMBER.match(text) or any(_LEADING_ZERO.match(part) for part in parts):
        raise ValueError(
            f"{flag} {_quoted(text)}: one size written with separators, or a list? "
            f"write a size without them (3000000, 3M, 1.5GB) and a list with units (3M,50M)"
        )
    if not parts:
        raise ValueError(f"{flag}: give at least one capacity, e.g. 3M,50M or 40GB")
    try:
        return [parse_capacity(part, kv_bytes_per_token) for part in parts]
    except ValueError as err:
        raise ValueError(f"{flag}: {err}") from None


def parse_capacity(text: str, kv_bytes_per_token: int | None) -> Capacity:
    match = _CAPACITY.match(text)
    unit = match[2].lower() if match else None
    if unit in _AMBIGUOUS_UNITS:
        raise ValueError(
            f"capacity {_quoted(text)}: bytes or tokens? write {match[1]}{match[2]}B (decimal "
            f"bytes), {match[1]}{match[2]}iB (binary bytes) or tokens (3M, 500k)"
        )
    if match is None or (unit not in _TOKEN_UNITS and unit not in _BYTE_UNITS):
        raise ValueError(
            f"capacity {_quoted(text)}: write tokens (3000000, 3M, 500k) or bytes (40GB, 1.5TiB)"
        )
    value = Decimal(match[1])  # exact: a float of 400 digits is inf
    if unit in _TOKEN_UNITS:
        tokens = int(_within(text, value * _TOKEN_UNITS[unit], MAX_CAPACITY_TOKENS, "tokens"))
        return Capacity(tokens, tokens * kv_bytes_per_token if kv_bytes_per_token else None)
    if not kv_bytes_per_token:
        raise ValueError(
            f"capacity {_quoted(text)} is in bytes: give --kv-bytes-per-token or "
            f"--model so it can be turned into tokens"
        )
    size = int(_within(text, value * _BYTE_UNITS[unit], MAX_CAPACITY_BYTES, "bytes"))
    return Capacity(size // kv_bytes_per_token, size)


MAX_SIZE_TEXT = 64  # longer is no size anyone writes; refused before its digits are read


def _quoted(text: str) -> str:
    """text as an error line shows it: its repr, cut to a line's share (escapes make one
    character up to ten)."""
    shown = repr(text.strip())
    return shown if len(shown) <= QUOTED_CHARS else shown[:QUOTED_CHARS] + "..."


def parse_bytes(text: str, bare_unit: int) -> int:
    """A size in bytes: a byte unit as capacities take them (1MB = 10^6, 1.5GiB = 1.5 * 2^30),
    or a bare whole number of bare_unit bytes. K, M, G or T without the B is refused (1MB or
    1MiB?), as is anything else; ValueError with a message for the user."""
    match = _CAPACITY.match(text) if len(text) <= MAX_SIZE_TEXT else None
    unit = match[2].lower() if match else None
    if match and unit == "" and "." not in match[1]:
        return int(match[1]) * bare_unit
    if match is None or unit not in _BYTE_UNITS:
        raise ValueError(
            f"size {_quoted(text)}: write bytes as 1MB (10^6), 1MiB (2^20), 1.5GB, or a "
            f"whole number"
        )
    # Decimal: 4.35MB is 4,350,000 bytes, where a float would give one byte fewer.
    return int(Decimal(match[1]) * _BYTE_UNITS[unit])


def _within(text: str, size: Decimal, most: int, unit: str) -> Decimal:
    """The size, refused (ValueError) past the most a capacity may be."""
    if size > most:
        raise ValueError(
            f"capacity {_quoted(text)} is over the most a capacity may be, 2^"
            f"{most.bit_length() - 1} {unit}: more than any trace holds (a typo?)"
        )
    return size


GIB = 2**30
# The GPU KV cache the report describes when none is given: one 80 GB H100 under vLLM's default
# gpu_memory_utilization of 0.9 (72 GB), less an 8B model's bf16 weights (16 GB) and activations,
# leaves about 50 GiB; at Llama-3.1-8B's 128 KiB per token (configs/models/llama-3.1-8b.yaml)
# when no model is given, 409,600 tokens.
DEFAULT_GPU_KV_CACHE_BYTES = 50 * GIB
DEFAULT_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2


def default_gpu_kv_cache(kv_bytes_per_token: int | None) -> Capacity:
    """The report's GPU KV cache when none is given (DEFAULT_GPU_KV_CACHE_BYTES)."""
    per_token = kv_bytes_per_token or DEFAULT_KV_BYTES_PER_TOKEN
    tokens = DEFAULT_GPU_KV_CACHE_BYTES // per_token
    return Capacity(tokens, tokens * kv_bytes_per_token if kv_bytes_per_token else None)


def capacity_text(tokens: int, kv_bytes_per_token: int | None) -> str:
    """A capacity as kvtrace prints it: GiB when a token's bytes are known, else tokens."""
    if not kv_bytes_per_token:
        return f"{tokens:,} tokens"
    gib = tokens * kv_bytes_per_token / GIB
    # Two significant digits below 1 GiB: a small cache must not print as 0.0.
    return f"{gib:,.1f} GiB" if gib >= 1 else f"{gib:.2g} GiB"


def percent(share: float) -> str:
    """A share (hit rate, part of prompt tokens) as kvtrace prints it: percent, one decimal."""
    return f"{share:.1%}"


def kv_bytes_per_token(preset: dict) -> int:
    """K and V per KV head and layer (gqa/mha), or one latent vector per layer (mla)."""
    try:
        dtype = DTYPE_BYTES[str(preset.get("dtype", "bf16")).lower()]
        if preset.get("attention", "gqa") == "mla":
            return (
                int(preset["layers"])
                * (int(preset["kv_lora_rank"]) + int(preset["qk_rope_head_dim"]))
                * dtype
            )
        return 2 * int(preset["layers"]) * int(preset["kv_heads"]) * int(preset["head_dim"]) * dtype
    except KeyError as err:
        raise ValueError(
            f"model preset {preset.get('name', '?')}: missing {err.args[0]} "
            f"(or unknown dtype; known: {', '.join(DTYPE_BYTES)})"
        ) from None
