"""A trace's structure in the forms agent replayers and cache simulators read (pure, no I/O).

A trace publishes conversations (`session`), where the logs said it each response's end
(`response_ms`) and, run with --emit-parents, the row each request continues (`parent_row`);
from these, each row's predecessor (its parent, else its conversation's previous turn) and the
wait after that predecessor's response ended (forms.linked_turns). Rows joined by those edges
are one play: a conversation and the conversations its requests spawned. Those are the edges
written here:

- agentic Mooncake (Dynamo 1.6.1, `agentic_mooncake`): a header, then one row per request with
  `play_id` (its play), `session_id` (its conversation), `not_before_ms` (its logged arrival)
  and, for a row with a predecessor, one dependency on its completion with the wait as
  `delay_ms`: `sequence` within a conversation, `spawn` into another (a subagent); two rows
  continuing one request are two branches from it;
- WEKA (aiperf 0.13 `weka_trace`, guidellm 0.8.1, Dynamo 1.6.1 `weka`): one object per play, its
  conversation's requests in order, times in seconds, `api_time` where the response's end is
  known and a follow-up's `think_time` then; each conversation it spawned a `subagent` entry
  in its place in time, holding that conversation's requests (on the play's clock);
- libCacheSim's oracleGeneral (libcachesim 0.3.5): every block a request is made of, in arrival
  order, as fixed 24-byte records with each block's next use.

Hash ids are kvtrace's dense ids, global to the trace. Both agent forms declare the scope
`local`, the only one their readers take: Dynamo's agentic reader keeps one namespace for the
file, so blocks shared across conversations stay shared; the WEKA readers (aiperf, guidellm) keep
one per conversation, so such a block replays as one per conversation.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from kvtrace.transforms.read.trace_io import Trace
from kvtrace.transforms.replay.forms import NO_TURN, Turns, json_number
from kvtrace.transforms.trace_format import (
    HASH_IDS_FIELD,
    INPUT_LENGTH_FIELD,
    NO_RESPONSE_MS,
    OUTPUT_LENGTH_FIELD,
)

AGENTIC_SCHEMA, AGENTIC_VERSION = "dynamo.agentic_mooncake", 2
LOCAL_SCOPE = "local"
# oracleGeneral: uint32 time (s), uint64 object id, uint32 size, int64 next access (its
# request index, -1 for none), little-endian and packed (libCacheSim's reader/oracleGeneral)
ORACLE_GENERAL = np.dtype([("time", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")])
NEVER_AGAIN = -1
OBJECT_FIELD_MAX = 2**32 - 1  # a record's time (s) and size (bytes) are unsigned 32-bit


def conversation_names(trace: Trace, chain: Turns, order: np.ndarray) -> list[str]:
    """Each row's conversation: `s` and its session; for a row of none, its predecessor's (a
    Responses chain: each request continues the previous response), else `r` and its place in
    time (a conversation of its own). Rows in time order, predecessors first."""
    names = [""] * len(trace)
    for rank, row in enumerate(order.tolist()):
        session = None if trace.session is None else trace.session[row]
        before = int(chain.previous[row])
        if session is not None:
            names[row] = f"s{session}"
        else:
            names[row] = f"r{rank}" if before == NO_TURN else names[before]
    return names


def play_names(names: list[str], chain: Turns, order: np.ndarray) -> list[str]:
    """Each row's play: its predecessor's, else its own conversation's (rows in time order, so
    a predecessor's play is known before its followers')."""
    plays = list(names)
    for row in order.tolist():
        before = int(chain.previous[row])
        if before != NO_TURN:
            plays[row] = plays[before]
    return plays


def agentic_mooncake(trace: Trace, chain: Turns, block_size: int, model: str) -> bytes:
    order = np.argsort(trace.timestamp, kind="stable")
    request_id = np.empty(len(trace), dtype=np.int64)
    request_id[order] = np.arange(len(trace))
    names = conversation_names(trace, chain, order)
    plays = play_names(names, chain, order)
    lines = []
    for row in order.tolist():
        record = {
            "request_id": f"r{request_id[row]}",
            "play_id": plays[row],
            "session_id": names[row],
            "model": model,
            INPUT_LENGTH_FIELD: int(trace.input_length[row]),
            OUTPUT_LENGTH_FIELD: int(trace.output_length[row]),
            HASH_IDS_FIELD: trace.ids[trace.offsets[row] : trace.offsets[row + 1]].tolist(),
            "not_before_ms": json_number(trace.timestamp[row]),
        }
        before = int(chain.previous[row])
        if before != NO_TURN:
            record["dependencies"] = [
                {
                    "request_id": f"r{request_id[before]}",
                    "trigger": "completion",
                    "delay_ms": int(chain.delay_ms[row]),
                    "relation": "sequence" if names[before] == names[row] else "spawn",
                }
            ]
        lines.append(json.dumps(record) + "\n")
    rows = "".join(lines).encode()
    header = {
        "schema": AGENTIC_SCHEMA,
        "version": AGENTIC_VERSION,
        "block_size": block_size,
        "hash_id_scope": LOCAL_SCOPE,
        # provenance: the rows' own digest, so the same trace always writes the same header
        "source": {"format": "kvtrace", "digest": hashlib.sha256(rows).hexdigest()},
    }
    return (json.dumps(header) + "\n").encode() + rows


def weka(trace: Trace, chain: Turns, block_size: int, model: str) -> bytes:
    """One line per play, in order of its first request; times in seconds from the trace's
    start (readers that count from each conversation's start subtract its first). Within a play,
    its own conversation's requests and, where each other conversation of the play starts, a
    subagent entry holding that one's."""
    order = np.argsort(trace.timestamp, kind="stable")
    names = conversation_names(trace, chain, order)
    plays = play_names(names, chain, order)
    rows: dict[str, dict[str, list[int]]] = {}
    for row in order.tolist():
        rows.setdefault(plays[row], {}).setdefault(names[row], []).append(row)
    response = trace.response_ends()

    def weka_request(row: int) -> dict:
        request = {
            "t": float(trace.timestamp[row]) / 1000,
            "type": "n",
            "model": model,
            "in": int(trace.input_length[row]),
            "out": int(trace.output_length[row]),
            HASH_IDS_FIELD: trace.ids[trace.offsets[row] : trace.offsets[row + 1]].tolist(),
        }
        if response[row] != NO_RESPONSE_MS:
            request["api_time"] = int(response[row]) / 1000
        before = int(chain.previous[row])
        if before != NO_TURN and response[before] != NO_RESPONSE_MS:
            request["think_time"] = int(chain.delay_ms[row]) / 1000
        return request

    lines = []
    for name, conversations in rows.items():
        requests = [weka_request(row) for row in conversations.pop(name)]
        for agent, turns in conversations.items():  # in order of their first requests
            inner = [weka_request(row) for row in turns]
            entry = {
                "t": inner[0]["t"],
                "type": "subagent",
                "agent_id": agent,
                "subagent_type": "agent",
                "status": "completed",
                "models": [model],
                "requests": inner,
            }
            at = next((i for i, r in enumerate(requests) if r["t"] > entry["t"]), len(requests))
            requests.insert(at, entry)
        conversation = {
            "id": name,
            "models": [model],
            "block_size": block_size,
            "hash_id_scope": LOCAL_SCOPE,
            "requests": requests,
        }
        lines.append(json.dumps(conversation) + "\n")
    return "".join(lines).encode()


def oracle_general(trace: Trace, block_size: int) -> memoryview:
    """Every block of every request, requests in arrival order, each block one object of
    block_size bytes (so a cache of C bytes holds C tokens' blocks, as kvtrace simulate pages
    them) at its request's second from the trace's first; the next index at which the same block is requested. The
    records' own memory, not a copy (24 bytes a block)."""
    start = trace.timestamp.min() if len(trace) else 0.0
    span_s = (trace.timestamp.max() - start) // 1000 if len(trace) else 0
    if span_s > OBJECT_FIELD_MAX or block_size > OBJECT_FIELD_MAX:
        raise ValueError(
            f"libCacheSim's records hold seconds and sizes below 2^32: this trace spans "
            f"{span_s:.0f} s at block size {block_size}"
        )
    order = np.argsort(trace.timestamp, kind="stable")
    counts = np.diff(trace.offsets)[order]
    at = np.repeat(trace.offsets[:-1][order] - (np.cumsum(counts) - counts), counts)
    at += np.arange(len(at))
    records = np.zeros(len(at), dtype=ORACLE_GENERAL)
    records["id"] = trace.ids[at]
    del at
    # seconds from the first request: a foreign trace's epoch or negative times would not fit
    # the unsigned 32 bits
    seconds = np.floor((trace.timestamp[order] - start) / 1000).astype(np.int64)
    records["time"] = np.repeat(seconds, counts)
    records["size"] = block_size
    records["next"] = next_uses(records["id"])
    return memoryview(records.view(np.uint8))


def next_uses(ids: np.ndarray) -> np.ndarray:
    """Per position, the next position holding the same id, or NEVER_AGAIN."""
    by_id = np.argsort(ids, kind="stable")  # positions in order within each id
    following = np.full(len(ids), NEVER_AGAIN, dtype=np.int64)
    same = ids[by_id[1:]] == ids[by_id[:-1]]
    following[by_id[:-1][same]] = by_id[1:][same]
    return following
