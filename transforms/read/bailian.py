"""Alibaba's Bailian usage traces (alibaba-edu/qwen-bailian-usagetraces-anon) as Mooncake rows.

A Bailian row: {"chat_id", "parent_chat_id" (-1 for a conversation's first request),
"timestamp" (seconds, float), "input_length", "output_length", "hash_ids" (16-token blocks),
"type", "turn"}. Every row is a whole request (a follow-up's input_length and hash_ids cover
its history), so a row becomes one Mooncake row as it is; turns are linked into a session by
following parent_chat_id to the conversation's root. A parent missing from the file (a subset)
roots its children's session itself, so siblings still share one. `type` and `turn` are
dropped.

Rows come out in an order of their content alone (_content_key: time, then every field), and
sessions are numbered 0, 1, ... by first appearance in it, as kvtrace publishes them: the same
rows in any order convert to the same bytes. A chat_id on several rows is one chat (one
session) when its rows name one parent; rows naming different parents leave its conversation
unknown, so each is skipped as malformed, whatever their order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from kvtrace.transforms.read.json_tree import containers_over
from kvtrace.transforms.read.trace_io import MAX_READ_TIMESTAMP_MS
from kvtrace.transforms.trace_format import (
    MAX_PUBLISHED_INT,
    MAX_ROW_IDS,
    NO_RESPONSE_MS,
    TraceColumns,
    jsonl_bytes,
)

BAILIAN_BLOCK_SIZE = 16
NO_PARENT = -1
MAX_EXAMPLES = 5
REQUIRED = ("chat_id", "timestamp", "input_length", "output_length", "hash_ids")
KEPT = (*REQUIRED, "parent_chat_id")  # a record's fields conversion reads; the rest is dropped
# A row's JSON containers: its object and hash_ids (every other field of the format a number or
# a name). A line of more is malformed, found before it is parsed (json_tree.containers_over).
MAX_ROW_CONTAINERS = 1 + len(("hash_ids",))


@dataclass
class Converted:
    rows: list[dict] = field(default_factory=list)  # Mooncake rows, time order
    malformed: int = 0
    examples: list[str] = field(default_factory=list)  # "line N: what was wrong"

    def reject(self, line: int, why: str) -> None:
        self.malformed += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(f"line {line}: {why}")


def convert(lines: Iterable[bytes]) -> Converted:
    out = Converted()
    records: list[tuple[int, dict]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record, why = _parsed(line)
        if why:
            out.reject(number, why)
        else:
            records.append((number, record))
    parent = _parents(records)
    roots = _roots(parent)
    rows = []
    for number, record in records:
        chat = record["chat_id"]
        if chat not in parent:
            out.reject(number, f"chat_id {chat!r} is on rows that name different parent_chat_id")
            continue
        if roots[chat] is None:
            out.reject(number, "parent_chat_id links form a cycle")
            continue
        rows.append(
            (
                _content_key(record, parent[chat]),
                {
                    "timestamp": round(record["timestamp"] * 1000),
                    "input_length": record["input_length"],
                    "output_length": record["output_length"],
                    "hash_ids": record["hash_ids"],
                    "session": roots[chat],
                },
            )
        )
    rows.sort(key=lambda r: r[0])
    numbered: dict = {}
    for _, row in rows:
        row["session"] = numbered.setdefault(row["session"], len(numbered))
        out.rows.append(row)
    return out


def _content_key(record: dict, parent: int | str) -> tuple:
    """A row's place among the converted rows, from its content alone: its published time and
    lengths first (the order of ids/row_order.py), then its ids, then every other field read,
    so rows tie only when they are the same request."""
    return (
        round(record["timestamp"] * 1000),
        record["input_length"],
        record["output_length"],
        record["hash_ids"],
        record["timestamp"],
        _id_key(record["chat_id"]),
        _id_key(parent),
    )


def _id_key(chat: int | str) -> tuple[bool, int | str]:
    """A chat id, comparable to any other: integers before names (1 and "1" are two chats)."""
    return isinstance(chat, str), chat


def _parents(records: list[tuple[int, dict]]) -> dict:
    """Each chat's parent (NO_PARENT for a conversation's first), for chats whose rows all name
    the same one: a chat named with different parents is left out (its rows are malformed)."""
    named: dict = {}
    for _, record in records:
        up = record.get("parent_chat_id", NO_PARENT)
        named.setdefault(record["chat_id"], set()).add(NO_PARENT if up in (None, "-1") else up)
    return {chat: ups.pop() for chat, ups in named.items() if len(ups) == 1}


def trace_jsonl(rows: list[dict]) -> bytes:
    """Converted rows as the one trace writer writes them (trace_format.jsonl_bytes): each
    within the line a trace reader reads, since _parsed bounds a row's ids as kvtrace's own."""

    def column(name: str) -> np.ndarray:
        return np.array([row[name] for row in rows], dtype=np.int64)

    counts = np.array([len(row["hash_ids"]) for row in rows], dtype=np.int64)
    ids = np.fromiter((i for row in rows for i in row["hash_ids"]), np.int64, int(counts.sum()))
    return jsonl_bytes(
        TraceColumns(
            column("timestamp"),
            column("input_length"),
            column("output_length"),
            counts,
            ids,
            column("session"),
            np.full(len(rows), NO_RESPONSE_MS, dtype=np.int64),
        )
    )


def _parsed(line: bytes) -> tuple[dict, str]:
    containers = containers_over(line, MAX_ROW_CONTAINERS)
    if containers is not None:
        return {}, (
            f"{containers} JSON objects and lists, over the {MAX_ROW_CONTAINERS} a Bailian row "
            f"holds (the row and its hash_ids): not parsed"
        )
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as err:
        return {}, f"not JSON ({str(err)[:200]})"
    if not isinstance(record, dict):
        return {}, "not a JSON object"
    missing = [name for name in REQUIRED if name not in record]
    if missing:
        return {}, f"missing {', '.join(missing)}"
    counts = ("input_length", "output_length")
    if any(not _is_int(record[name]) or record[name] < 0 for name in counts):
        return {}, "input_length and output_length must be non-negative integers"
    ts = record["timestamp"]
    if (
        isinstance(ts, bool)
        or not isinstance(ts, (int, float))
        or not 0 <= ts * 1000 <= MAX_READ_TIMESTAMP_MS
    ):
        return {}, (
            f"timestamp must be a non-negative number of seconds, at most "
            f"{MAX_READ_TIMESTAMP_MS // 1000} (what a trace reader accepts)"
        )
    ids = record["hash_ids"]
    if not isinstance(ids, list) or not all(_is_int(i) and 0 <= i < MAX_PUBLISHED_INT for i in ids):
        return {}, f"hash_ids must be a list of non-negative integers below {MAX_PUBLISHED_INT}"
    if len(ids) > MAX_ROW_IDS:  # its row would be longer than a trace reader's line
        return {}, f"{len(ids)} hash_ids, over the {MAX_ROW_IDS} a trace row holds"
    if not _is_int(record["chat_id"]) and not isinstance(record["chat_id"], str):
        return {}, "chat_id must be an integer or a string"
    up = record.get("parent_chat_id", NO_PARENT)
    if up is not None and not _is_int(up) and not isinstance(up, str):
        return {}, "parent_chat_id must be an integer or a string"
    # only what conversion reads: a record may carry any other field (a number or a name) of
    # any size, and is freed here, before the next line is parsed
    return {name: record[name] for name in KEPT if name in record}, ""


def _is_int(value: object) -> bool:
    """An integer that fits the int64 columns traces are read into."""
    return isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < 1 << 63


def _roots(parent: dict) -> dict:
    """Each chat's conversation root: the first chat, following parents while they are in the
    file (a missing parent names the session); None for chats on or behind a cycle. Each chat
    is walked once (the walk stops at a chat whose root is known), so a chain of n turns costs
    n steps, not n^2."""
    roots: dict = {}
    for start in parent:
        path, on_path = [], set()
        chat = start
        while chat not in roots:
            up = parent[chat]
            path.append(chat)
            on_path.add(chat)
            if up == NO_PARENT:
                root = chat
                break
            if up not in parent:
                root = up
                break
            if up in on_path:
                root = None
                break
            chat = up
        else:
            root = roots[chat]
        for chat in path:
            roots[chat] = root
    return roots
