"""Parse one log record (a JSON object) into a Request, or reject it with a reason.

Shapes, detected per record unless forced: chat (`messages`, or `input` as in seed 000), prompt
(`prompt`, already formatted), tokens (`input_ids`); any of them may sit inside an OpenAI log
envelope {"request": {...}, "response": {...}}.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from transforms.encode.blocks import MAX_TOKEN_ID
from transforms.errors import Rejected
from transforms.read.timestamps import timestamp_ms

INPUT_FORMATS = ("auto", "chat", "prompt", "tokens")
# Real requests nest about 5 deep (messages > message > content > part), tool schemas ~15;
# far deeper is an attack or a bug, and deep recursion is what makes parsers fall over.
MAX_NESTING_DEPTH = 64
# The roles OpenAI-compatible servers accept; anything else they answer with a 400.
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


@dataclass(frozen=True)
class Request:
    """One parsed request, still holding its text: it never leaves the tokenize step."""

    source: str
    line: bytes  # the original record, for a dead letter if rendering fails later
    timestamp_ms: int
    kind: str  # "chat" | "prompt" | "tokens"
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    prompt: str | None = None
    input_ids: list[int] | None = None
    output_text: str | None = None
    output_length: int | None = None
    session: str | None = None
    defaulted: tuple[str, ...] = ()  # fields the record lacked and got a default for


def parse_record(line: bytes, source: str, input_format: str = "auto") -> Request:
    """The Request in one JSONL line; raises Rejected with a reason when there is none."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise Rejected("invalid_utf8", f"not valid UTF-8 at byte {err.start}") from None
    try:
        record = json.loads(text)
    except RecursionError:
        raise Rejected("too_deep", "JSON nested too deep to parse") from None
    except ValueError as err:
        raise Rejected("invalid_json", f"not JSON: {err}") from None
    if not isinstance(record, dict):
        raise Rejected("not_an_object", f"a JSON {type(record).__name__}, not an object")
    return request_from_object(record, line, source, input_format)


def request_from_object(
    record: dict[str, Any], line: bytes, source: str, input_format: str = "auto"
) -> Request:
    """The Request in an already-decoded record (JSONL line or Parquet row)."""
    if _depth(record) > MAX_NESTING_DEPTH:
        raise Rejected("too_deep", f"nested deeper than {MAX_NESTING_DEPTH} levels")
    envelope = record.get("request")
    body = envelope if isinstance(envelope, dict) else record
    response = record.get("response")
    response = response if isinstance(response, dict) else None

    kind = _detect_kind(body) if input_format == "auto" else input_format
    fields: dict[str, Any] = {"kind": kind}
    if kind == "chat":
        fields["messages"] = _messages(body)
        fields["tools"] = _tools(body.get("tools"))
    elif kind == "prompt":
        fields["prompt"] = _prompt(body.get("prompt"))
    elif kind == "tokens":
        fields["input_ids"] = _token_ids(body.get("input_ids"))
    else:
        raise Rejected("no_input", "no messages, input, prompt or input_ids")

    defaulted = []
    ts = _timestamp(record, body, response)
    if ts is None:
        defaulted.append("timestamp")
    output_text, output_length = _output(record, body, response)
    if output_text is None and output_length is None:
        defaulted.append("output_length")
    return Request(
        source=source,
        line=line,
        timestamp_ms=0 if ts is None else ts,
        output_text=output_text,
        output_length=output_length,
        session=_session(record, body),
        defaulted=tuple(defaulted),
        **fields,
    )


def _depth(value: Any) -> int:
    """Nesting depth of containers, iteratively so a hostile record cannot blow the stack."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            node = node.values()
        elif not isinstance(node, list):
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_NESTING_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in node)
    return deepest


def _detect_kind(body: dict[str, Any]) -> str:
    if "messages" in body or isinstance(body.get("input"), (list, str)):
        return "chat"
    if "prompt" in body:
        return "prompt"
    if "input_ids" in body:
        return "tokens"
    return "none"


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages", body.get("input"))
    if messages is None:
        raise Rejected("no_input", "no messages or input")
    if isinstance(messages, str):  # the Responses API's shorthand for one user message
        messages = [{"role": "user", "content": messages}]
    if not isinstance(messages, list):
        raise Rejected("wrong_type", "messages is not a list")
    if not messages:
        raise Rejected("invalid_request", "messages is empty")
    return [_message(m, i) for i, m in enumerate(messages)]


def _message(message: Any, index: int) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise Rejected("wrong_type", f"message {index} is not an object")
    role = message.get("role")
    if not isinstance(role, str):
        raise Rejected("invalid_request", f"message {index} has no role")
    if role not in CHAT_ROLES:
        raise Rejected("invalid_request", f"message {index} has unknown role {role[:32]!r}")
    content = message.get("content")
    if isinstance(content, list):
        return {**message, "content": _join_text_parts(content, index)}
    if content is None and role != "assistant":
        raise Rejected("invalid_request", f"message {index} ({role}) has no content")
    if content is not None and not isinstance(content, str):
        raise Rejected("wrong_type", f"message {index} content is a {type(content).__name__}")
    return message


def _join_text_parts(parts: list[Any], index: int) -> str:
    """Text parts joined with newlines, as vLLM does for templates that take string content."""
    texts = []
    for part in parts:
        if not isinstance(part, dict):
            raise Rejected("wrong_type", f"message {index} has a content part that is not an object")
        if part.get("type") != "text":
            # Images and audio become model-specific tokens we cannot count from a log.
            raise Rejected("unsupported_content", f"message {index} has a {part.get('type')!r} part")
        if not isinstance(part.get("text"), str):
            raise Rejected("wrong_type", f"message {index} has a text part without text")
        texts.append(part["text"])
    return "\n".join(texts)


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise Rejected("wrong_type", "tools is not a list of objects")
    return tools or None


def _prompt(prompt: Any) -> str:
    if prompt is None:
        raise Rejected("no_input", "no prompt")
    if not isinstance(prompt, str):
        raise Rejected("wrong_type", f"prompt is a {type(prompt).__name__}, not a string")
    if not prompt:
        raise Rejected("no_input", "prompt is empty")
    return prompt


def _token_ids(ids: Any) -> list[int]:
    if ids is None:
        raise Rejected("no_input", "no input_ids")
    if not isinstance(ids, list):
        raise Rejected("wrong_type", "input_ids is not a list")
    if not ids:
        raise Rejected("no_input", "input_ids is empty")
    for token in ids:
        if type(token) is not int or not 0 <= token <= MAX_TOKEN_ID:
            raise Rejected("wrong_type", "input_ids holds something other than token ids")
    return ids


def _timestamp(record: dict, body: dict, response: dict | None) -> int | None:
    for holder in (record, body):
        if "timestamp" in holder:
            return timestamp_ms(holder["timestamp"], unit_ms=1)
    for holder in (record, body, response or {}):
        if "created" in holder:
            return timestamp_ms(holder["created"], unit_ms=1000)
    return None


def _output(record: dict, body: dict, response: dict | None) -> tuple[str | None, int | None]:
    """(text to tokenize, known length): the first source present, in the order of the issue."""
    for holder in (record, body):
        if "output" in holder:
            output = holder["output"]
            if not isinstance(output, str):
                raise Rejected("wrong_type", "output is not a string")
            return output, None
    for holder in (record, body):
        if "output_length" in holder:
            return None, _count(holder["output_length"], "output_length")
    if response is None:
        return None, None
    usage = response.get("usage")
    if isinstance(usage, dict) and "completion_tokens" in usage:
        return None, _count(usage["completion_tokens"], "usage.completion_tokens")
    return _response_text(response), None


def _response_text(response: dict) -> str | None:
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    message = choice.get("message")
    if isinstance(message, dict):
        # Reasoning is generated too, so it counts towards the output length.
        texts = [message.get("reasoning_content"), message.get("content")]
        texts = [t for t in texts if isinstance(t, str)]
        return "".join(texts) if texts else None
    text = choice.get("text")
    return text if isinstance(text, str) else None


def _count(value: Any, name: str) -> int:
    if type(value) is not int or value < 0:
        raise Rejected("wrong_type", f"{name} is not a non-negative integer")
    return value


def _session(record: dict, body: dict) -> str | None:
    for holder in (record, body):
        for name in ("session_id", "conversation_id"):
            value = holder.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                raise Rejected("wrong_type", f"{name} is not a string or integer")
            return str(value)
    return None
