"""Cache capacities as people write them, and what a token of KV cache costs in bytes.

A capacity is tokens (3000000, 3M, 500k) or bytes (40GB, 1.5TiB: a unit ending in B), which
need the bytes one token's KV cache takes: given directly, or from a model preset (layers,
heads, head size and dtype; kvtrace/presets.py finds them). Bad values raise ValueError with
a message for the user.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}
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


def parse_capacities(text: str, kv_bytes_per_token: int | None) -> list[Capacity]:
    """Comma-separated capacities, in the order given."""
    capacities = [
        parse_capacity(part, kv_bytes_per_token) for part in text.split(",") if part.strip()
    ]
    if not capacities:
        raise ValueError("give at least one capacity, e.g. --capacity 3M,50M or 40GB")
    return capacities


def parse_capacity(text: str, kv_bytes_per_token: int | None) -> Capacity:
    match = _CAPACITY.match(text)
    unit = match[2].lower() if match else None
    if match is None or (unit not in _TOKEN_UNITS and unit not in _BYTE_UNITS):
        raise ValueError(
            f"capacity {text.strip()!r}: write tokens (3000000, 3M, 500k) or bytes (40GB, 1.5TiB)"
        )
    value = float(match[1])
    if unit in _TOKEN_UNITS:
        tokens = int(value * _TOKEN_UNITS[unit])
        return Capacity(tokens, tokens * kv_bytes_per_token if kv_bytes_per_token else None)
    if not kv_bytes_per_token:
        raise ValueError(
            f"capacity {text.strip()!r} is in bytes: give --kv-bytes-per-token or "
            f"--model so it can be turned into tokens"
        )
    size = int(value * _BYTE_UNITS[unit])
    return Capacity(size // kv_bytes_per_token, size)


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
