"""A trace as one replayer reads it: its rows in the consumer's form, as the bytes of its file
(JSONL but for libCacheSim's binary records; pure, no I/O)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from kvtrace.transforms.read.trace_io import Trace
from kvtrace.transforms.replay.agentic import agentic_mooncake, oracle_general, weka
from kvtrace.transforms.replay.forms import (
    NO_TURN,
    Turns,
    deltas,
    json_number,
    linked_turns,
    recut_blocks,
    turns,
)
from kvtrace.transforms.trace_format import (
    HASH_IDS_FIELD,
    INPUT_LENGTH_FIELD,
    NO_RESPONSE_MS,
    OUTPUT_LENGTH_FIELD,
    TIMESTAMP_FIELD,
)
from kvtrace.transforms.write.replayers import (
    AGENTIC,
    BLOCK_REQUESTS,
    CONVERSATIONS,
    DELTAS,
    MODEL,
    RECUT,
    SGLANG_TOKENS_PER_ID,
    TURNS,
    Consumer,
)


@dataclass(frozen=True)
class Exported:
    data: bytes | memoryview  # libCacheSim's records: their own memory
    rows: int
    follow_up_turns: int  # rows sent after a previous turn's response, with a delay
    without_response_end: int  # of those, delays that are arrival gaps (no response end logged)
    # deltas: follow-ups no longer than their previous turn's input plus its logged output
    # length (commonly a completion length above the answer as re-rendered), sent whole
    restarted: int


def export(trace: Trace, consumer: Consumer, block_size: int) -> Exported:
    if consumer.form in (AGENTIC, CONVERSATIONS, BLOCK_REQUESTS):
        return _structure(trace, consumer, block_size)
    order = np.argsort(trace.timestamp, kind="stable")  # replayers read files in order
    offsets, ids = trace.offsets, trace.ids.astype(np.int64)
    input_length = trace.input_length
    chain = turns(trace) if consumer.form in (TURNS, DELTAS) else None
    restarted, starts = 0, None
    if consumer.form == RECUT:
        offsets, ids = recut_blocks(trace, block_size, SGLANG_TOKENS_PER_ID)
    elif consumer.form == DELTAS:
        cut = deltas(trace, chain, block_size)
        offsets, ids, input_length = cut.offsets, cut.ids, cut.input_length
        starts, restarted = cut.starts_conversation, cut.restarted
    waits = _waits(chain, starts) if chain is not None else np.zeros(len(trace), dtype=bool)
    names = (
        _conversation_names(trace, chain, starts)
        if chain is not None and trace.session is not None
        else None
    )
    lines = []
    for row in order.tolist():
        record = {
            TIMESTAMP_FIELD: json_number(trace.timestamp[row]),
            INPUT_LENGTH_FIELD: int(input_length[row]),
            OUTPUT_LENGTH_FIELD: int(trace.output_length[row]),
            HASH_IDS_FIELD: ids[offsets[row] : offsets[row + 1]].tolist(),
        }
        if names is not None and names[row] is not None:
            record["session_id"] = names[row]
        if waits[row]:
            record["delay"] = int(chain.delay_ms[row])
            if not consumer.follow_up_timestamps:
                del record[TIMESTAMP_FIELD]
        lines.append(json.dumps(record) + "\n")
    unknown = (
        int(np.count_nonzero(trace.response_ends()[chain.previous[waits]] == NO_RESPONSE_MS))
        if waits.any()
        else 0
    )
    return Exported(
        "".join(lines).encode(), len(order), int(np.count_nonzero(waits)), unknown, restarted
    )


def _structure(trace: Trace, consumer: Consumer, block_size: int) -> Exported:
    """The agent forms (each row an edge to its parent, else to its conversation's previous
    turn) and libCacheSim's (blocks, no turns)."""
    if consumer.form == BLOCK_REQUESTS:
        return Exported(oracle_general(trace, block_size), len(trace), 0, 0, 0)
    chain = linked_turns(trace)
    form = agentic_mooncake if consumer.form == AGENTIC else weka
    follow = chain.previous[chain.previous != NO_TURN]
    unknown = int(np.count_nonzero(trace.response_ends()[follow] == NO_RESPONSE_MS))
    return Exported(form(trace, chain, block_size, MODEL), len(trace), len(follow), unknown, 0)


def _waits(chain: Turns, starts: np.ndarray | None) -> np.ndarray:
    """Per row: whether it is sent a delay after its conversation's previous turn (a follow-up
    the delta form sends whole opens a conversation instead)."""
    waits = chain.previous != NO_TURN
    return waits if starts is None else waits & ~starts


def _conversation_names(trace: Trace, chain: Turns, starts: np.ndarray | None) -> list[str | None]:
    """Each row's session_id: its conversation, with a suffix after each restart (a follow-up
    sent whole opens a new conversation, as the delta form cannot chain it)."""
    names: list[str | None] = [None] * len(trace)
    restarts = np.zeros(len(trace), dtype=np.int64)
    for row in np.lexsort((np.arange(len(trace)), trace.timestamp)).tolist():
        session = trace.session[row]
        if session is None:
            continue
        before = chain.previous[row]
        restarts[row] = (
            0 if before == NO_TURN else (restarts[before] + int(starts is not None and starts[row]))
        )
        names[row] = str(session) if not restarts[row] else f"{session}~{restarts[row]}"
    return names
