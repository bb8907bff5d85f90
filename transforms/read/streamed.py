"""A streamed response condensed before its record is read. A log keeps a streamed chat's
response as its list of chunks, ~80 small objects a record for a few words each, and each
reader of the record (nesting depth, nulls, declared shapes, the generated text, usage, arrival
times) walked all of them: four Python walks, 8x orjson's own parse of the line (issue 36).
One walk here merges each run of chunks that carry generated text and nothing any reader reads
into one chunk holding that text; every other chunk is kept as it is, so the readers walk a
handful of chunks and read them as they would read the whole list.

A text chunk, a null field read as an absent one (as the readers see it: records.without_nulls):
- not the first chunk (its `created` may date the request);
- an object whose fields are in TEXT_CHUNK_FIELDS, each of a type given there (its labels
  any scalar, `choices` a list);
- `choices` one object whose fields are in TEXT_CHOICE_FIELDS, each of a type given there,
  its `index` (if any) 0;
- its `delta` an object whose fields are in TEXT_DELTA_FIELDS, each a string.
So the declared shapes accept a text chunk (each field is of its declared type, none required
is missing), it nests exactly as deep as the chunk merged from it, and it holds no usage,
cached count, arrival time, tool call or output item. What it generated is
chat.message_texts of its delta, the rule the generated text is read by; a merged chunk's
delta holds the run's texts joined in order (a run that generated none leaves no chunk).

records.request_from_object reads the record with the condensed list first and, should that
be refused, the whole list: a dead letter names what the whole list holds, at its index. The
links (read/links.py: a text chunk's id names its request) are read from the list as logged,
before it is condensed.

A Responses API stream is logged as its events (`response.created` ... `response.completed`),
the response's time, output and usage inside an event's `response` object: final_response reads
such a list as its final response object, so every reader reads it as the response logged
whole.
"""

from __future__ import annotations

from typing import Any

from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.chat import message_texts
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
# The delta events that carry generated text, each counted as a Chat Completions chunk's delta of
# the same text is (chat.message_pieces: reasoning, content, tool-call arguments).
TEXT_DELTA_EVENTS = frozenset(
    f"response.{kind}.delta"
    for kind in (
        "output_text",
        "reasoning_text",
        "reasoning_summary_text",
        "refusal",
        "function_call_arguments",
    )
)
# The event that opens an output item: a function call's name is generated there, not in a delta.
ITEM_ADDED_EVENT = "response.output_item.added"


def final_response(response: Any) -> Any:
    """A Responses API stream logged as its events (each an object whose `type` is ERROR_EVENT
    or starts with RESPONSES_EVENT_PREFIX) as its final response: the last event's `response`
    object, held to the response's shape, its output what the events generated, merged, when no
    such object holds any; an error event's code and message as its `error` (a failed call, as
    a chat stream's error chunk is: records._check_outcome); any other response as it is."""
    if type(response) is not list or not response or not all(map(_is_event, response)):
        return response
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
    texts = [
        text
        for index, event in enumerate(response)
        if (text := _generated(event, (path, index))) is not None
    ]
    if not texts:
        return final
    item = {"type": "message", "content": [{"type": "output_text", "text": "".join(texts)}]}
    return {**final, "output": [item]}


def _is_event(event: Any) -> bool:
    kind = event.get("type") if type(event) is dict else None
    return type(kind) is str and (kind == ERROR_EVENT or kind.startswith(RESPONSES_EVENT_PREFIX))


def _generated(event: dict[str, Any], path: Path) -> str | None:
    """The text an event generated: a text delta's, a function call's name as its item opens;
    None from any other event."""
    kind = event["type"]
    if kind == ITEM_ADDED_EVENT:
        item = event.get("item")
        if type(item) is not dict or item.get("type") != "function_call":
            return None
        path, name, value = (path, "item"), "name", item.get("name")
    elif kind in TEXT_DELTA_EVENTS:
        name, value = "delta", event.get("delta")
    else:
        return None
    if type(value) is not str:
        raise Rejected("wrong_type", f"{spelled((path, name))} is {type_name(value)}, not a string")
    return value


def condensed(chunks: list[Any]) -> list[Any] | None:
    """The chunks with each run of text chunks merged into one, or None when none merge."""
    kept: list[Any] = chunks[:1]
    run: list[str | None] = []  # what the current run of text chunks generated
    for chunk in chunks[1:]:
        texts = chunk_texts(chunk)
        if texts is not None:
            run += texts
            continue
        if run:
            kept += _merged(run)
            run = []
        kept.append(chunk)
    if run:
        kept += _merged(run)
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


def _merged(texts: list[str | None]) -> list[dict[str, Any]]:
    """The chunk a run merges into, holding what it generated joined; none if it generated
    nothing (not even an empty text)."""
    pieces = [text for text in texts if text is not None]
    return [{"choices": [{"delta": {"content": "".join(pieces)}}]}] if pieces else []
