"""The links a request record carries to other requests (pure): the names its response gives it,
by which a later request can say it continues this one, and the name of the earlier request it
continues. They are joined into a published row number (write/parents.py) and never published
themselves: ids are strings a provider or a client chose.

- A response's `id` names its request (a request continuing a stored response by
  `previous_response_id` is a stored_context letter until stored responses are joined).
- Tool calls: a response's calls carry ids (chat `choices[].message.tool_calls[].id`, streamed
  `choices[].delta.tool_calls[].id`, Responses `output[]` items of type `function_call`:
  `call_id`, Anthropic `content[]` blocks of type `tool_use`: `id`); a later request whose
  newest messages are tool results (read/chat.py gives each its call's `tool_call_id`, whatever
  the API) continues the request whose response made the first of those calls, within its
  session (encode/hashed_batch.link_key): a request of no session continues none.

A link is a kind and the id, so a call id never meets a response id.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

RESPONSE_LINK, CALL_LINK = "response", "call"
MAX_LINK_CHARS = 1024  # an id longer than this names nothing a provider issues: not a link


def link(kind: str, value: Any) -> str | None:
    """A link's key: its kind and id; None for an id that is not a non-empty string (or
    integer) of at most MAX_LINK_CHARS."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    text = str(value)
    return f"{kind}:{text}" if 0 < len(text) <= MAX_LINK_CHARS else None


def in_conversation(key: str) -> bool:
    """Whether a link names something only within its conversation: call ids ("call_0") recur
    across conversations, a provider's response ids do not (and a conversation forked with
    `previous_response_id` continues another's response)."""
    return key.startswith(f"{CALL_LINK}:")


def continued(messages: list[dict[str, Any]] | None) -> str | None:
    """The link of the request this one continues: the call its newest tool result answers;
    None when it names none. (A `previous_response_id` is a stored_context letter before links
    are read: records.API_FIELDS.)"""
    trailing = []
    for message in reversed(messages or []):
        if message.get("role") != "tool":
            break
        trailing.append(message)
    # the newest run of tool results answers one response's calls, in their order: its first
    return link(CALL_LINK, trailing[-1].get("tool_call_id")) if trailing else None


def names(response: dict | list | None) -> tuple[str, ...]:
    """The links that name a request: its response's id and each tool call's id, in the
    response's order, each once."""
    parts = response if isinstance(response, list) else [response]
    found: dict[str | None, None] = {}
    last_id: Any = None
    for part in parts:
        if not isinstance(part, dict):
            continue
        if part.get("id") != last_id:  # a stream's chunks repeat their response's id
            last_id = part.get("id")
            found[link(RESPONSE_LINK, last_id)] = None
        if "choices" in part or "output" in part or "content" in part:
            found.update(dict.fromkeys(_calls(part)))
    return tuple(key for key in found if key is not None)


def _calls(part: dict[str, Any]) -> Iterator[str | None]:
    """One response object's (or streamed chunk's) tool calls' links."""
    for choice in _dicts(part.get("choices")):
        for holder in (choice.get("message"), choice.get("delta")):
            if isinstance(holder, dict) and "tool_calls" in holder:
                for call in _dicts(holder["tool_calls"]):
                    yield link(CALL_LINK, call.get("id"))
    for item in _dicts(part.get("output")):  # Responses
        if item.get("type") == "function_call":
            yield link(CALL_LINK, item.get("call_id"))
    for block in _dicts(part.get("content")):  # Anthropic
        if block.get("type") == "tool_use":
            yield link(CALL_LINK, block.get("id"))


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
