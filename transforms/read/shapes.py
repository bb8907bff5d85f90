"""The accepted shape of every request and response form kvtrace reads, declared once, and the
walk that holds a record to it before any field is used.

The types mirror what vLLM's OpenAI-compatible server validates (its pydantic request models in
vllm/entrypoints/openai/protocol.py and the message TypedDicts of chat_utils, the Anthropic
Messages and Responses API models): a field the engine would refuse is refused here, with the
path of the field, so no length is ever made up from a value the engine would not have served.
Fields not declared are ignored, as the engine ignores them (its models allow extra fields:
sampling parameters, metadata, a log's own annotations); a declared field must have exactly one
of its declared JSON types (an integer is not a boolean, a number is not a string). Which values
a field may hold (a known role, a part type, a non-empty list) is the readers' business
(records.py, chat.py): a shape only says types and which fields the engine's models require
(`required`), and descends into what it knows. A null field is an absent one: each reader
leaves nulls out before a shape is checked (records.without_nulls), as the engine's models
read an Optional field sent as null as unset; but inside a free-form value (FREE_OBJECT), which
no model reads, a null is a value and stays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvtrace.transforms.errors import Rejected

# How a message names the JSON type of a value (the parsers give exactly these Python types).
JSON_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
    list: "a list",
    dict: "an object",
}

# Where a value sits: (the parent's path, its key or index), None at the top; spelled out
# ("request.messages[1].content") only for a message, as building every path costs more than
# the whole walk.
Path = tuple | None
Walk = Callable[[Any, Path], None]
_REFUSED = object()


@dataclass(frozen=True)
class Shape:
    """The JSON types a value may have, each with the walk into a value of that type (None:
    nothing inside to check)."""

    name: str  # for messages: "a string or null"
    accepts: dict[type, Walk | None]
    required: bool = False  # as a field of an object: the engine refuses the object without it
    free_form: bool = False  # of a value the engine hands on as sent (FREE_OBJECT)

    def check(self, value: Any, path: Path) -> None:
        walk = self.accepts.get(type(value), _REFUSED)
        if walk is not None:
            self.walk_or_refuse(walk, value, path)

    def walk_or_refuse(self, walk: Walk | object, value: Any, path: Path) -> None:
        if walk is _REFUSED:
            raise Rejected("wrong_type", f"{spelled(path)} is {type_name(value)}, not {self.name}")
        walk(value, path)  # type: ignore[operator]


def spelled(path: Path) -> str:
    keys = []
    while path is not None:
        path, key = path
        keys.append(key)
    text = ""
    for key in reversed(keys):
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else key)
    return text


def type_name(value: Any) -> str:
    return JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def leaf(name: str, *types: type) -> Shape:
    return Shape(name, dict.fromkeys(types))


STRING = leaf("a string", str)
INTEGER = leaf("an integer", int)
NUMBER = leaf("a number", int, float)
BOOLEAN = leaf("a boolean", bool)
NULL = leaf("null", type(None))
ANY_OBJECT = leaf("an object", dict)
# An object the engine takes whole and hands on as sent, no model of its fields (a tool's JSON
# schema, a tool call's input, template variables): the template writes it out with tojson, so
# a null inside it is a value, not an absent field (records.without_nulls keeps it).
FREE_OBJECT = dataclasses.replace(ANY_OBJECT, free_form=True)
_FREE_FORM: set[str] = set()  # gathered as the shapes are declared (fields_walk)


def one_of(*shapes: Shape) -> Shape:
    """Any of the shapes; each JSON type may belong to only one of them, so the value's type
    alone picks the shape (no backtracking, no ambiguity)."""
    accepts: dict[type, Walk | None] = {}
    for shape in shapes:
        assert not accepts.keys() & shape.accepts.keys(), "one shape per JSON type"
        accepts |= shape.accepts
    free_form = any(shape.free_form for shape in shapes)
    return Shape(" or ".join(shape.name for shape in shapes), accepts, free_form=free_form)


def optional(shape: Shape) -> Shape:
    """The shape or null: OpenAI's clients send null for an Optional field they leave unset."""
    return one_of(shape, NULL)


def required(shape: Shape) -> Shape:
    """A field the engine's request model requires: an object without it (null reads as
    absent) is what the engine answers with a 400, an invalid_request dead letter."""
    return dataclasses.replace(shape, required=True)


def list_of(item: Shape | Callable[[], Shape]) -> Shape:
    """A list whose every element has the item's shape (a callable: a shape declared later,
    for shapes that hold themselves, as a tool result holds content parts)."""

    def walk(values: list, path: Path) -> None:
        shape = item if isinstance(item, Shape) else item()
        accepts = shape.accepts
        for index, value in enumerate(values):
            # Shape.check inlined: leaves (most elements) cost no call.
            walk_into = accepts.get(type(value), _REFUSED)
            if walk_into is not None:
                shape.walk_or_refuse(walk_into, value, (path, index))

    return Shape("a list", {list: walk})


def fields_walk(fields: dict[str, Shape]) -> Walk:
    """The declared fields of an object, each where present; the rest are not the engine's.
    Whichever of the object and the declaration is smaller is the one iterated."""
    declared = dict(fields)
    declared_items = tuple(declared.items())
    _FREE_FORM.update(name for name, shape in declared_items if shape.free_form)
    needed = tuple(name for name, shape in declared_items if shape.required)

    def walk(value: dict, path: Path) -> None:
        for name in needed:
            if name not in value:
                raise Rejected(
                    "invalid_request", f"{spelled((path, name))} is absent: the engine requires it"
                )
        # Shape.check inlined: leaves (most fields) cost no call.
        if len(value) <= len(declared_items):
            for name, child in value.items():
                shape = declared.get(name)
                if shape is not None:
                    walk_into = shape.accepts.get(type(child), _REFUSED)
                    if walk_into is not None:
                        shape.walk_or_refuse(walk_into, child, (path, name))
        else:
            for name, shape in declared_items:
                if name in value:
                    child = value[name]
                    walk_into = shape.accepts.get(type(child), _REFUSED)
                    if walk_into is not None:
                        shape.walk_or_refuse(walk_into, child, (path, name))

    return walk


def obj(**fields: Shape) -> Shape:
    return Shape("an object", {dict: fields_walk(fields)})


def tagged(
    tag: str,
    variants: dict[str, Shape],
    default: str | None = None,
    common: dict[str, Shape] | None = None,
) -> Shape:
    """An object whose `tag` field (a string; `default` when absent) picks its variant's fields,
    on top of the fields `common` to all. An unknown tag is checked for its common fields only:
    whether it is supported is the reader's to say (unsupported_content, with the type)."""
    tag_shape = STRING if default is None else optional(STRING)
    common_walk = fields_walk({tag: tag_shape, **(common or {})})
    walks = {kind: shape.accepts[dict] for kind, shape in variants.items()}

    def walk(value: dict, path: Path) -> None:
        common_walk(value, path)
        kind = value.get(tag, default)
        variant = walks.get(kind)
        if variant is not None:
            variant(value, path)

    return Shape("an object", {dict: walk})


# ---- Content: OpenAI's content parts, Anthropic's content blocks, Responses API parts ----------

TEXT_PART = obj(text=required(STRING))
BLOCK = tagged(
    "type",
    {
        "text": TEXT_PART,
        "input_text": TEXT_PART,
        "output_text": TEXT_PART,
        "image_url": obj(image_url=required(one_of(STRING, obj(url=required(STRING))))),
        # Anthropic's blocks: vLLM's one model of them (AnthropicContentBlock) requires no field.
        "tool_use": obj(id=STRING, name=STRING, input=FREE_OBJECT),
        "tool_result": obj(
            tool_use_id=STRING, content=optional(one_of(STRING, list_of(lambda: PART)))
        ),
        "thinking": obj(thinking=STRING, signature=STRING),
        "redacted_thinking": obj(data=STRING),
        "refusal": obj(refusal=required(STRING)),
    },
)
PART = one_of(STRING, BLOCK)  # in a request, vLLM takes a bare string as a text part
CONTENT = optional(one_of(STRING, list_of(PART)))
# Anthropic's top-level system prompt: a string or text blocks (no bare strings).
SYSTEM = optional(one_of(STRING, list_of(tagged("type", {"text": TEXT_PART}))))

# ---- Requests ----------------------------------------------------------------------------------

# A tool call as the Chat Completions API sends it back in the history: arguments are a JSON text.
TOOL_CALL = obj(
    id=required(STRING),
    type=required(STRING),
    function=required(obj(name=required(STRING), arguments=required(STRING))),
)
MESSAGE = obj(
    role=required(STRING),
    content=CONTENT,
    name=optional(STRING),
    tool_calls=optional(list_of(TOOL_CALL)),
    tool_call_id=optional(STRING),
    reasoning=optional(STRING),
    reasoning_content=optional(STRING),
)
# Chat Completions ({type, function: {...}}), Anthropic ({name, input_schema}) and Responses API
# ({type, name, parameters}) tool definitions: one object types the fields of all three, read
# before the request's API is known; which form each API takes is its tools reader's business
# (records.API_FIELDS: chat.chat_completions_tools, responses_tools, anthropic_tools).
TOOL = obj(
    type=STRING,
    name=STRING,
    description=optional(STRING),
    parameters=optional(FREE_OBJECT),
    input_schema=FREE_OBJECT,
    strict=optional(BOOLEAN),
    function=obj(
        name=required(STRING),
        description=optional(STRING),
        parameters=optional(FREE_OBJECT),
        strict=optional(BOOLEAN),
    ),
)
INPUT_ITEM = tagged(
    "type",
    default="message",
    variants={
        "message": obj(role=required(STRING), content=required(CONTENT)),
        "function_call": obj(
            name=required(STRING), arguments=required(STRING), call_id=required(STRING)
        ),
        "function_call_output": obj(
            call_id=required(STRING), output=required(one_of(STRING, list_of(PART)))
        ),
    },
)
CHAT_BODY = {
    "messages": list_of(MESSAGE),
    "tools": optional(list_of(TOOL)),
    "system": SYSTEM,
    "instructions": optional(STRING),
    "input": optional(one_of(STRING, list_of(INPUT_ITEM))),
    "chat_template_kwargs": optional(FREE_OBJECT),  # read by chat.own_kwargs
}
# The Completions API's prompt: a string, or a list of strings, of token ids or of token-id lists
# (records._prompt_fields reads which one prompt it is, if it is one).
PROMPT_BODY = {
    "prompt": optional(one_of(STRING, list_of(one_of(STRING, INTEGER, list_of(INTEGER)))))
}
TOKENS_BODY = {"input_ids": optional(list_of(INTEGER))}
BODY_FIELDS = {"chat": CHAT_BODY, "prompt": PROMPT_BODY, "tokens": TOKENS_BODY}

# ---- Responses -----------------------------------------------------------------------------------

# The engine's cached prompt tokens ride in usage: OpenAI's chat, completions and Batch under
# prompt_tokens_details, its Responses API under input_tokens_details, Anthropic's as
# cache_read_input_tokens (cache_creation_input_tokens: written to its cache, not read).
CACHED_DETAILS = optional(obj(cached_tokens=optional(INTEGER)))
USAGE = obj(
    **dict.fromkeys(
        (
            "prompt_tokens",
            "completion_tokens",
            "total_tokens",
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        ),
        optional(INTEGER),
    ),
    prompt_tokens_details=CACHED_DETAILS,
    input_tokens_details=CACHED_DETAILS,
)
# A streamed delta's tool call may come in pieces: every field is optional, types are not.
RESPONSE_TOOL_CALL = obj(
    id=optional(STRING),
    type=optional(STRING),
    index=optional(INTEGER),
    function=optional(obj(name=optional(STRING), arguments=optional(STRING))),
)
RESPONSE_MESSAGE = optional(
    obj(
        role=optional(STRING),
        content=optional(STRING),
        reasoning=optional(STRING),
        reasoning_content=optional(STRING),
        tool_calls=optional(list_of(RESPONSE_TOOL_CALL)),
    )
)
CHOICE = obj(
    index=optional(INTEGER),
    message=RESPONSE_MESSAGE,
    delta=RESPONSE_MESSAGE,
    text=optional(STRING),
    finish_reason=optional(STRING),
)
OUTPUT_ITEM = tagged(
    "type",
    {
        "message": obj(role=optional(STRING), content=list_of(BLOCK)),
        "function_call": obj(name=STRING, arguments=STRING, call_id=optional(STRING)),
        "reasoning": obj(
            summary=optional(list_of(TEXT_PART)), content=optional(list_of(TEXT_PART))
        ),
    },
)
# Whether a call was served, in a response or beside it (records._check_outcome): LiteLLM's
# `status` "failure" and `error_str`, a response's `error`, an HTTP status (or `status` number);
# whether a gateway answered from its own cache (LiteLLM's `cache_hit`: true in its logging
# payload, "True" in its spend logs).
OUTCOME = {
    "status": optional(one_of(STRING, INTEGER)),
    "status_code": optional(INTEGER),
    "error": optional(one_of(ANY_OBJECT, STRING)),
    "error_str": optional(STRING),
    "cache_hit": optional(one_of(BOOLEAN, STRING)),
}
# A Chat Completions response or chunk, a Responses API response, an Anthropic message (its
# `type` is "message"; the others have none, or a streaming event's).
RESPONSE_OBJECT = tagged(
    "type",
    {"message": obj(role=optional(STRING), content=list_of(BLOCK))},
    default="",
    common={
        "choices": optional(list_of(CHOICE)),
        "usage": optional(USAGE),
        "output": optional(list_of(OUTPUT_ITEM)),
        "num_cached_tokens": optional(INTEGER),  # vLLM's own count of a request's cached tokens
        **OUTCOME,
        "object": optional(STRING),  # what the endpoint returned: no embedding list is a chat
    },
)
RESPONSE = optional(one_of(RESPONSE_OBJECT, list_of(RESPONSE_OBJECT)))

# ---- The record around them ------------------------------------------------------------------

# Fields a log record may carry beside the request (at its top level or in the request body).
RECORD_FIELDS = {
    "output": STRING,
    "output_length": INTEGER,
    "session_id": optional(one_of(STRING, INTEGER)),
    "conversation_id": optional(one_of(STRING, INTEGER)),
}
# A log's envelope: the request as the server took it ({"request": ...}, LiteLLM spend logs'
# `proxy_server_request`) and its response. LiteLLM's standard logging payload keeps the chat
# at its top level, its tools in `model_parameters`, the generated count in `completion_tokens`.
ENVELOPE = {
    "request": ANY_OBJECT,
    "proxy_server_request": ANY_OBJECT,
    "response": RESPONSE,
    "model_parameters": obj(tools=optional(list_of(TOOL))),
    "completion_tokens": INTEGER,
    "num_cached_tokens": INTEGER,  # vLLM's, logged beside the request
    "call_type": STRING,  # LiteLLM's, which names the kind of request (records.LITELLM_CALL_TYPES)
    **OUTCOME,
}
# A line of an OpenAI Batch file, told by its `custom_id`: the input file's request (method,
# url, body), the output file's response (its body a response object) or error; a line joined
# from both holds both, and may carry a log's generated count as LiteLLM's does.
BATCH_ENVELOPE = {
    "custom_id": STRING,
    "method": STRING,
    "url": STRING,
    "body": ANY_OBJECT,
    "response": optional(obj(status_code=INTEGER, request_id=STRING, body=RESPONSE_OBJECT)),
    "error": optional(ANY_OBJECT),
    "completion_tokens": INTEGER,
}
ENVELOPES = {"log": ENVELOPE, "batch": BATCH_ENVELOPE}
_DECLARED = {name: (*envelope, *RECORD_FIELDS) for name, envelope in ENVELOPES.items()}
_RECORD_WALKS = {
    name: fields_walk({**envelope, **RECORD_FIELDS}) for name, envelope in ENVELOPES.items()
}
_BODY_WALKS = {kind: fields_walk({**RECORD_FIELDS, **body}) for kind, body in BODY_FIELDS.items()}
_FULL_RECORD_WALKS = {
    (name, kind): fields_walk({**envelope, **RECORD_FIELDS, **body})
    for name, envelope in ENVELOPES.items()
    for kind, body in BODY_FIELDS.items()
}
# The names of the fields any shape declares free-form: records.without_nulls leaves what they
# hold as it is.
FREE_FORM_FIELDS = frozenset(_FREE_FORM)


def check_record(
    record: dict[str, Any],
    body: dict[str, Any],
    kind: str,
    envelope: str = "log",
    body_field: str = "request",
) -> None:
    """Hold a record to the declared shapes: its envelope ("log" or "batch") and response, and
    the request body (the record itself, or its envelope's `body_field`) as the kind of request
    it was detected to be. Raises Rejected("wrong_type") naming the first field of a type the
    engine would refuse."""
    if body is record:
        walk = _FULL_RECORD_WALKS.get((envelope, kind), _RECORD_WALKS[envelope])
        walk(record, None)
        return
    _RECORD_WALKS[envelope](record, None)
    if kind in _BODY_WALKS:
        _BODY_WALKS[kind](body, (None, body_field))


def declared_fields(record: dict[str, Any], envelope: str = "log") -> dict[str, Any]:
    """The fields of a checked record its envelope declares, and only those: what a reader
    reads through this cannot be a field no shape has checked."""
    return {name: record[name] for name in _DECLARED[envelope] if name in record}
