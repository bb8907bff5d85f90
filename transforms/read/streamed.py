"""A streamed response condensed before its record is read. A log keeps a streamed chat's
response as its list of chunks, ~80 small objects a record for a few words each, and each
reader of the record (nesting depth, nulls, declared shapes, the generated text, usage, arrival
times) walked all of them: four Python walks, 8x orjson's own parse of the line (issue 36).
One walk here merges each run of chunks that carry generated text and nothing any reader reads
into one chunk holding that text; every other chunk is kept as it is, so the readers walk a
handful of chunks and read them as they would read the whole list.

A text chunk, a null field read as an absent one (as the readers see it: records.without_nulls):
- past the chunk that dates the request (dating_chunk: its `created` is read);
- an object whose fields are in TEXT_CHUNK_FIELDS, each of a type given there (its labels
  any scalar, `choices` a list);
- `choices` one object whose fields are in TEXT_CHOICE_FIELDS, each of a type given there,
  its `index` (if any) 0;
- its `delta` an object whose fields are in TEXT_DELTA_FIELDS, each a string.
So the declared shapes accept a text chunk (each field is of its declared type, none required
is missing), it nests exactly as deep as the chunk merged from it, and it holds no usage,
cached count, arrival time, tool call or output item. What it generated is
chat.message_texts of its delta, the rule the generated text is read by; a run merges into a
chunk per stretch of its texts of one kind (reasoning, content), that stretch joined, in order,
so the generated turn (chat.generated_turn) reads its reasoning and content apart as in the
whole list (a run that generated none leaves an empty delta).

records.request_from_object reads the record with the condensed list first and, should that
be refused, the whole list: a dead letter names what the whole list holds, at its index. The
links (read/links.py: a text chunk's id names its request) are read from the list as logged,
before it is condensed.

A Responses API stream is logged as its events (`response.created` ... `response.completed`),
the response's time, output and usage inside an event's `response` object: final_response reads
such a list as its final response object, so every reader reads it as the response logged
whole. A stream cut short holds no final output: its output items are rebuilt from the events
(each delta into the part of the item it names), so chat.generated_text, the one reader of what
a response generated, reads them as it reads a response logged whole (a reasoning item's
content, else its summary). An Anthropic stream's text is in its content_block_delta events:
the message they built is read after them, through the same table (DELTA_TARGETS), so a stream
cut short before its usage is counted by what it streamed.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import groupby
from operator import itemgetter
from typing import Any

from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.chat import STOP_REASONS, message_texts
from kvtrace.transforms.read.shapes import RESPONSE_OBJECT, Path, spelled, type_name

_SCALARS = frozenset({str, int, float, bool})
# The fields a text chunk may hold and the types of each; any field may be null (absent). A
# chunk's own labels, which no reader reads past the first chunk, may be any scalar: no shape
# declares them, and only a container would count in the nesting depth.
TEXT_CHUNK_FIELDS = dict.fromkeys(
    ("id", "object", "created", "model", "system_fingerprint", "service_tier"), _SCALARS
) | {"choices": frozenset({list})}
TEXT_CHOICE_FIELDS = {
    "index": frozenset({int}),
    "finish_reason": frozenset({str}),
    "delta": frozenset({dict}),
}
TEXT_DELTA_FIELDS = dict.fromkeys(
    ("role", "content", "reasoning", "reasoning_content"), frozenset({str})
)


RESPONSES_EVENT_PREFIX = "response."
# The event a Responses API stream ends in when it fails mid-way (its type has no prefix).
ERROR_EVENT = "error"
# Events a stream sends to hold its connection open, which no reader needs: skipped.
IDLE_EVENTS = frozenset({"keepalive", "ping"})
# The events that tell an Anthropic Messages stream: its message opened, its content blocks.
ANTHROPIC_START_EVENT = "message_start"
ANTHROPIC_BLOCK_START_EVENT = "content_block_start"
ANTHROPIC_DELTA_EVENT = "content_block_delta"
ANTHROPIC_EVENTS = frozenset(
    {ANTHROPIC_START_EVENT, ANTHROPIC_BLOCK_START_EVENT, ANTHROPIC_DELTA_EVENT}
)
# The delta events that carry generated text, and where each goes in the output item it builds:
# (the item's type, its field, the type of the part in that field, None for the field itself).
DELTA_TARGETS = {
    "response.output_text.delta": ("message", "content", "output_text"),
    "response.refusal.delta": ("message", "content", "refusal"),
    "response.reasoning_text.delta": ("reasoning", "content", "reasoning_text"),
    "response.reasoning_summary_text.delta": ("reasoning", "summary", "summary_text"),
    "response.function_call_arguments.delta": ("function_call", "arguments", None),
    # Anthropic's content_block_delta, by its delta's type: the block's type and field.
    "text_delta": ("text", "text", None),
    "thinking_delta": ("thinking", "thinking", None),
    "input_json_delta": ("tool_use", "input", None),
}
# Where an Anthropic delta holds its text, by its type (DELTA_TARGETS names where it goes).
ANTHROPIC_DELTA_TEXT = {
    "text_delta": "text",
    "thinking_delta": "thinking",
    "input_json_delta": "partial_json",
}
# The event that opens an output item: a function call's name is generated there, not in a delta.
ITEM_ADDED_EVENT = "response.output_item.added"


def final_response(response: Any) -> Any:
    """A stream logged as its events (each an object with a string `type`; IDLE_EVENTS
    skipped) as its readers read it. A Responses API stream (an event's type ERROR_EVENT or
    starting with RESPONSES_EVENT_PREFIX) as its final response: the last event's `response`
    object, held to the response's shape, its output the items the events built (_built_output)
    when no such object holds any; an error event's code and message as its `error` (a failed
    call, as a chat stream's error chunk is: records._check_outcome). An Anthropic Messages
    stream (an event in ANTHROPIC_EVENTS) as its events and, last, the message its content
    blocks built (_anthropic_message), so what it generated is read as a whole message's is,
    its usage as before. Any other response as it is."""
    if type(response) is not list or not response or not all(map(_is_event, response)):
        return response
    kinds = {event["type"] for event in response}
    if not ANTHROPIC_EVENTS.isdisjoint(kinds):
        return [*response, _anthropic_message(response, (None, "response"))]
    if not any(kind == ERROR_EVENT or kind.startswith(RESPONSES_EVENT_PREFIX) for kind in kinds):
        return response
    return _responses_final([event for event in response if event["type"] not in IDLE_EVENTS])


def _responses_final(response: list[dict[str, Any]]) -> dict[str, Any]:
    path: Path = (None, "response")
    final: dict[str, Any] = {}
    for index in range(len(response) - 1, -1, -1):
        held = response[index].get("response")
        if held is not None:
            RESPONSE_OBJECT.check(held, ((path, index), "response"))
            final = held
            break
    errors = [event for event in response if event["type"] == ERROR_EVENT]
    if errors:
        error = errors[-1]
        return {**final, "error": {"code": error.get("code"), "message": error.get("message")}}
    if final.get("output"):
        return final
    output = _built_output(response, path)
    return {**final, "output": output} if output else final


def _is_event(event: Any) -> bool:
    return type(event) is dict and type(event.get("type")) is str


def _anthropic_message(events: list[dict[str, Any]], path: Path) -> dict[str, Any]:
    """The message an Anthropic stream's events built, as a message logged whole holds it: each
    content block opened (content_block_start: its type, a tool's name) or named by a delta (its
    `index`), in index order, each delta's text joined into the block's field DELTA_TARGETS
    gives (a tool's input as the JSON text it streamed)."""
    blocks: dict[Any, dict[str, Any]] = {}
    pieces: dict[tuple[Any, str], list[str]] = defaultdict(list)
    for index, event in enumerate(events):
        kind, where = event["type"], (path, index)
        at = event.get("index")
        at = at if type(at) is int else None  # Anthropic numbers its blocks
        if kind == ANTHROPIC_BLOCK_START_EVENT:
            block = event.get("content_block")
            if type(block) is dict and type(block.get("type")) is str:
                opened = blocks.setdefault(at, {"type": block["type"]})
                if block["type"] == "tool_use":
                    opened["name"] = _text(block.get("name"), (where, "content_block"), "name")
        elif kind == ANTHROPIC_DELTA_EVENT:
            delta = event.get("delta")
            delta_type = delta.get("type") if type(delta) is dict else None
            if type(delta_type) is not str or delta_type not in ANTHROPIC_DELTA_TEXT:
                continue  # a signature: nothing generated
            block_type, field, _ = DELTA_TARGETS[delta_type]
            text = _text(delta.get(ANTHROPIC_DELTA_TEXT[delta_type]), (where, "delta"), "text")
            blocks.setdefault(at, {"type": block_type})
            pieces[at, field].append(text)
    for (block, field), texts in pieces.items():
        blocks[block][field] = "".join(texts)
    ordered = sorted(blocks.items(), key=lambda item: (item[0] is None, item[0] or 0))
    return {"type": "message", "content": [block for _, block in ordered]}


def _built_output(events: list[dict[str, Any]], path: Path) -> list[dict[str, Any]]:
    """The output items a stream's events built, as a final response holds them, in the order
    they opened: each text delta's text joined into the part it names (DELTA_TARGETS; its
    content_index or summary_index, 0 if none) of the item it names (its output_index, else
    its item_id, else the one item of its type that names neither), a function call's name
    from the event that opened it; none when no event generated anything."""
    items: dict[tuple[Any, str], dict[str, Any]] = {}
    # (item, field) -> part key -> pieces; a function call's arguments under the key None
    pieces: dict[tuple[tuple[Any, str], str], dict[Any, list[str]]] = defaultdict(dict)
    indexes: dict[str, int] = {}  # an item_id's output_index, where an event gave both
    for index, event in enumerate(events):
        kind, where = event["type"], (path, index)
        if kind == ITEM_ADDED_EVENT:
            item = event.get("item")
            if type(item) is not dict or item.get("type") != "function_call":
                continue
            name = _text(item.get("name"), (where, "item"), "name")
            _item(items, _key(event, item.get("id"), indexes), "function_call")["name"] = name
        elif kind.startswith(RESPONSES_EVENT_PREFIX) and (target := DELTA_TARGETS.get(kind)):
            text = _text(event.get("delta"), where, "delta")
            item_type, field, part_type = target
            key = (_key(event, event.get("item_id"), indexes), item_type)
            _item(items, key[0], item_type)
            part = event.get("summary_index" if field == "summary" else "content_index")
            part_key = None if part_type is None else (part if type(part) is int else 0, part_type)
            pieces[key, field].setdefault(part_key, []).append(text)
    for (key, field), parts in pieces.items():
        if field == "arguments":
            items[key][field] = "".join(parts[None])
            continue
        items[key][field] = [
            {"type": part_type, "refusal" if part_type == "refusal" else "text": "".join(texts)}
            for (_, part_type), texts in parts.items()
        ]
    return list(items.values())


def _key(event: dict[str, Any], item_id: Any, indexes: dict[str, int]) -> Any:
    """Which output item an event names: its output_index, else its item's id (the index an
    earlier event gave that id, if any), else None."""
    index = event.get("output_index")
    if type(index) is int:
        if type(item_id) is str:
            indexes[item_id] = index
        return index
    return indexes.get(item_id, item_id) if type(item_id) is str else None


def _item(items: dict[tuple[Any, str], dict[str, Any]], key: Any, kind: str) -> dict[str, Any]:
    return items.setdefault((key, kind), {"type": kind})


def _text(value: Any, path: Path, name: str) -> str:
    if type(value) is not str:
        raise Rejected("wrong_type", f"{spelled((path, name))} is {type_name(value)}, not a string")
    return value


def dating_chunk(chunks: list[Any]) -> int:
    """The index of the chunk that dates a stream: the first that is the completion's (a
    non-empty `choices` list or a non-empty `id`), so no chunk sent before the completion's
    own (Azure's content-filter chunk: `created` 0, `id` "", `choices` []) dates it;
    len(chunks) when none is."""
    for index, chunk in enumerate(chunks):
        if type(chunk) is dict and (chunk.get("choices") or chunk.get("id")):
            return index
    return len(chunks)


def condensed(chunks: list[Any]) -> list[Any] | None:
    """The chunks with each run of text chunks merged into one, or None when none merge; the
    chunk that dates the stream and those before it kept as they are."""
    first = dating_chunk(chunks) + 1
    kept: list[Any] = chunks[:first]
    run: list[tuple[str, str | None]] = []  # what the current run of text chunks generated
    ended = None  # the last of its finish reasons chat.ended_at_stop reads
    for chunk in chunks[first:]:
        texts = chunk_texts(chunk)
        if texts is not None:
            run += zip(TEXT_KINDS, texts)
            reason = chunk["choices"][0].get("finish_reason")
            ended = reason if reason in STOP_REASONS else ended
            continue
        if run:
            kept += _merged(run, ended)
            run, ended = [], None
        kept.append(chunk)
    if run:
        kept += _merged(run, ended)
    return kept if len(kept) < len(chunks) else None


def chunk_texts(chunk: Any) -> tuple[str | None, str | None] | None:
    """What a text chunk generated (chat.message_texts of its delta); None when the chunk is
    not a text chunk."""
    if type(chunk) is not dict or not _holds_only(chunk, TEXT_CHUNK_FIELDS):
        return None
    choices = chunk.get("choices")
    if choices is None or len(choices) != 1:
        return None
    choice = choices[0]
    if type(choice) is not dict or not _holds_only(choice, TEXT_CHOICE_FIELDS):
        return None
    if choice.get("index"):  # another sequence's (an int, its type says): generated_text skips it
        return None
    delta = choice.get("delta")
    if delta is None or not _holds_only(delta, TEXT_DELTA_FIELDS):
        return None
    if None in delta.values():  # read as absent, as the readers see it
        delta = {name: value for name, value in delta.items() if value is not None}
    return message_texts(delta)


def _holds_only(value: dict[str, Any], fields: dict[str, Any]) -> bool:
    """Whether every field of value is null or one of fields, of a type given for it."""
    for name, item in value.items():
        if item is not None and type(item) not in fields.get(name, ()):
            return False
    return True


# The delta fields a merged chunk holds each kind of text in, in chat.message_texts' order.
TEXT_KINDS = ("reasoning_content", "content")


def _merged(texts: list[tuple[str, str | None]], ended: str | None) -> list[dict[str, Any]]:
    """The chunks a run merges into, one per stretch of texts of one kind (a stretch of content
    joins the reasoning before it), each holding its stretch joined (an empty delta if the run
    generated nothing, not even an empty text), the
    last with the run's finish reason: kept, as the first sequence's chunks they are, so the
    response's sequences are counted as its whole list counts them."""
    pieces = [(kind, text) for kind, text in texts if text is not None]
    deltas: list[dict[str, str]] = []
    for kind, stretch in groupby(pieces, key=itemgetter(0)):
        text = "".join(text for _, text in stretch)
        if deltas and kind not in deltas[-1] and kind == TEXT_KINDS[-1]:
            deltas[-1][kind] = text  # content after reasoning: read after it in one delta
        else:
            deltas.append({kind: text})
    choices: list[dict[str, Any]] = [{"delta": delta} for delta in deltas or [{}]]
    if ended is not None:
        choices[-1]["finish_reason"] = ended
    return [{"choices": [choice]} for choice in choices]
