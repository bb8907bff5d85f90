"""Chat histories as serving engines see them: OpenAI Chat Completions (tool calling included),
the Responses API's `input` items and Anthropic Messages, normalized into the messages that
vLLM's OpenAI server hands to the chat template; and the text a response generated.

vLLM's normalization (vllm/entrypoints/chat_utils): each message keeps only role, content,
tool_calls, reasoning, tool_call_id and name; content None or absent becomes "" and text parts
are joined with newlines; tool-call arguments are parsed from JSON into an object ({} when
absent or not an object); an empty tool_calls list is dropped.
"""

from __future__ import annotations

import json
from typing import Any

from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.json_tree import ContainerBudget, loads_checked

# json.dumps(value, ensure_ascii=False), the same text: json.dumps builds an encoder per call for
# any option but its defaults, and this runs per tool call of a request rendered with strings.
_json_text = json.JSONEncoder(ensure_ascii=False).encode

# The roles OpenAI-compatible servers accept; anything else they answer with a 400.
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
# Parts whose tokens depend on the model's processor (image patches, audio frames), which a log
# does not let us count: dead-lettered, or dropped with --drop-non-text-parts.
NON_TEXT_PART_TYPES = frozenset(
    {
        "image_url",
        "input_image",
        "image",
        "input_audio",
        "audio",
        "file",
        "input_file",
        "document",
        "video_url",
        "video",
    }
)
ANTHROPIC_BLOCK_TYPES = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking"})


def is_anthropic(body: dict[str, Any], tools: Any) -> bool:
    """Anthropic Messages, told by the fields only Anthropic's API has: a top-level system
    prompt, a tool defined by `input_schema` (of the tools the request is rendered with:
    LiteLLM's payload keeps them beside the body), or content blocks only Anthropic uses. A null
    field is not given, as vLLM's request models read it. (Its required `max_tokens` tells
    nothing: Chat Completions takes one too; and a request with none of these renders alike
    either way: string or text-block content.)"""
    if body.get("messages") is None:
        return False
    if body.get("system") is not None:
        return True
    if isinstance(tools, list) and any(
        isinstance(tool, dict) and tool.get("input_schema") is not None for tool in tools
    ):
        return True
    messages = body.get("messages")
    if not isinstance(messages, list):
        return False
    return any(
        type_of(block) in ANTHROPIC_BLOCK_TYPES
        for message in messages
        if isinstance(message, dict)
        for block in (message.get("content") if isinstance(message.get("content"), list) else ())
    )


def openai_messages(
    messages: Any, drop_non_text: bool, budget: ContainerBudget
) -> list[dict[str, Any]]:
    """Chat Completions messages, normalized as vLLM does."""
    if isinstance(messages, str):
        raise Rejected("wrong_type", "messages is a string, not a list of messages")
    if not isinstance(messages, list):
        raise Rejected("wrong_type", f"messages is a {type(messages).__name__}, not a list")
    if not messages:
        raise Rejected("invalid_request", "messages is empty")
    return [_openai_message(m, i, drop_non_text, budget) for i, m in enumerate(messages)]


def _openai_message(
    message: Any, index: int, drop_non_text: bool, budget: ContainerBudget
) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise Rejected("wrong_type", f"message {index} is not an object")
    role = _role(message, index)
    if message.get("content") is None and role != "assistant":  # as the OpenAI API requires
        raise Rejected("invalid_request", f"message {index} ({role}) has no content")
    normalized: dict[str, Any] = {
        "role": role,
        "content": text_of(message.get("content"), f"message {index}", drop_non_text),
    }
    if role == "assistant":
        calls = message.get("tool_calls")
        if calls is not None:
            normalized_calls = _tool_calls(calls, index, budget)
            if normalized_calls:
                normalized["tool_calls"] = normalized_calls
        reasoning = message.get("reasoning", message.get("reasoning_content"))
        if reasoning is not None:
            reasoning = _string(reasoning, f"message {index} reasoning")
            normalized["reasoning"] = normalized["reasoning_content"] = reasoning
    elif role == "tool" and message.get("tool_call_id") is not None:
        normalized["tool_call_id"] = _string(
            message["tool_call_id"], f"message {index} tool_call_id"
        )
    if isinstance(message.get("name"), str):
        normalized["name"] = message["name"]
    return normalized


def _role(message: dict[str, Any], index: int) -> str:
    role = message.get("role")
    if not isinstance(role, str):
        raise Rejected("invalid_request", f"message {index} has no role")
    if role not in CHAT_ROLES:
        raise Rejected("invalid_request", f"message {index} has unknown role {role[:32]!r}")
    return role


def text_of(content: Any, where: str, drop_non_text: bool) -> str:
    """A content string, or its text parts joined with newlines; None is empty."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise Rejected("wrong_type", f"{where} content is a {type(content).__name__}")
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            raise Rejected("wrong_type", f"{where} has a content part that is not an object")
        kind = type_of(part)
        if kind in TEXT_PART_TYPES:
            texts.append(_string(part.get("text"), f"{where} text part"))
        elif kind == "refusal":  # an assistant turn's refusal part: the engine reads it as text
            texts.append(_string(part.get("refusal"), f"{where} refusal part"))
        elif kind in NON_TEXT_PART_TYPES:
            if not drop_non_text:
                raise Rejected(
                    "non_text_content",
                    f"{where} has a {kind!r} part (images, audio "
                    "and files cannot be counted from a log; --drop-non-text-parts)",
                )
        else:
            raise Rejected(
                "unsupported_content", f"{where} has a content part of type {str(kind)[:32]!r}"
            )
    return "\n".join(texts)


def _tool_calls(calls: Any, index: int, budget: ContainerBudget) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise Rejected("wrong_type", f"message {index} tool_calls is not a list")
    normalized = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or type_of(call, "function") != "function":
            raise Rejected(
                "invalid_request", f"message {index} has a tool call that is not a function call"
            )
        name = _string(function.get("name"), f"message {index} tool call name")
        normalized.append(
            {
                **({"id": call["id"]} if isinstance(call.get("id"), str) else {}),
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": _arguments(function.get("arguments"), budget),
                },
            }
        )
    return normalized


def _arguments(arguments: Any, budget: ContainerBudget) -> dict[str, Any]:
    """Arguments as an object, as vLLM passes them to templates ({} when not a JSON object); a
    string is parsed within what its record's bound leaves (json_tree.loads_checked)."""
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str) and arguments:
        try:
            parsed = loads_checked(arguments, budget)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


def arguments_as_strings(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same messages with tool-call arguments as JSON strings, the OpenAI wire form, for
    templates that concatenate them as strings (DeepSeek-R1's)."""
    converted = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            calls = [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": _json_text(c["function"]["arguments"]),
                    },
                }
                for c in calls
            ]
            message = {**message, "tool_calls": calls}
        converted.append(message)
    return converted


def responses_messages(
    body: dict[str, Any], drop_non_text: bool, budget: ContainerBudget
) -> list[dict[str, Any]]:
    """The Responses API's `instructions` and `input` (a string or a list of items), each item
    turned by RESPONSES_ITEMS into the message the engine's Responses server builds of it."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None and _string(instructions, "instructions"):  # "" adds no turn
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):  # the API's shorthand for one user message
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list):
        raise Rejected("wrong_type", f"input is a {type(items).__name__}, not a string or list")
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise Rejected("wrong_type", f"input item {index} is not an object")
        kind = type_of(item, "message")
        build = RESPONSES_ITEMS.get(kind) if kind is not None else None
        if build is None:
            raise Rejected("unsupported_content", f"input item {index} has type {str(kind)[:32]!r}")
        message = build(item, index, drop_non_text, budget)
        if _joins_reasoning(item, messages):
            messages[-1] = {**messages[-1], "tool_calls": message["tool_calls"]}
        else:
            messages.append(message)
    if not messages:
        raise Rejected("invalid_request", "input is empty")
    return messages


def _message_item(
    item: dict[str, Any], index: int, drop_non_text: bool, budget: ContainerBudget
) -> dict[str, Any]:
    """A message item (input, or a previous response's output message): its role and text. An
    output message (it has the `id` and `status` only a response's output item has) is built
    as the engine builds one: from its first content part alone."""
    content = item.get("content")
    if item.get("id") is not None and item.get("status") is not None and isinstance(content, list):
        content = content[:1]
    text = text_of(content, f"input item {index}", drop_non_text)
    return {"role": _role(item, index), "content": text}


def _function_call_item(
    item: dict[str, Any], index: int, drop_non_text: bool, budget: ContainerBudget
) -> dict[str, Any]:
    """One assistant message per call, parallel calls too, as the engine builds them."""
    call: dict[str, Any] = {
        "type": "function",
        "function": {
            "name": _string(item.get("name"), f"input item {index} name"),
            "arguments": _arguments(item.get("arguments"), budget),
        },
    }
    if isinstance(item.get("call_id"), str):
        call["id"] = item["call_id"]
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def _function_call_output_item(
    item: dict[str, Any], index: int, drop_non_text: bool, budget: ContainerBudget
) -> dict[str, Any]:
    output = item.get("output")
    if not isinstance(output, str):
        output = text_of(output, f"input item {index} output", drop_non_text)
    return {"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": output}


def _reasoning_item(
    item: dict[str, Any], index: int, drop_non_text: bool, budget: ContainerBudget
) -> dict[str, Any]:
    """An assistant message holding the reasoning: its first content part's text, else its
    first summary part's, else none. The engine refuses encrypted reasoning: it cannot read it,
    and neither can a template."""
    if item.get("encrypted_content"):
        raise Rejected(
            "invalid_request",
            f"input item {index} is encrypted reasoning (encrypted_content): the engine refuses it",
        )
    parts = _list(item.get("content")) or _list(item.get("summary"))
    first = parts[0] if parts else {"text": ""}
    text = first.get("text") if isinstance(first, dict) else first
    reasoning = _string(text, f"input item {index} reasoning text")
    return {
        "role": "assistant",
        "content": "",
        "reasoning": reasoning,
        "reasoning_content": reasoning,
    }


# Each Responses input item type, as the message the engine's Responses server builds of it;
# any other type is a letter (the engine would hand the template an item it cannot render).
RESPONSES_ITEMS = {
    "message": _message_item,
    "function_call": _function_call_item,
    "function_call_output": _function_call_output_item,
    "reasoning": _reasoning_item,
}
# A function_call item of this id prefix (a call to an MCP server) joins the reasoning message
# before it, its call in place of any that message held: the engine builds them as one message.
MCP_CALL_PREFIX = "mcp_"


def _joins_reasoning(item: dict[str, Any], messages: list[dict[str, Any]]) -> bool:
    item_id = item.get("id")
    return (
        type_of(item) == "function_call"
        and isinstance(item_id, str)
        and item_id.startswith(MCP_CALL_PREFIX)
        and bool(messages)
        and messages[-1]["role"] == "assistant"
        and "reasoning" in messages[-1]
    )


def anthropic_messages(
    body: dict[str, Any], drop_non_text: bool, budget: ContainerBudget
) -> list[dict[str, Any]]:
    """Anthropic Messages (top-level system, text / tool_use / tool_result / thinking blocks) as
    the OpenAI messages an OpenAI-compatible server would render."""
    messages: list[dict[str, Any]] = []
    system = _anthropic_system(body.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise Rejected("invalid_request", "messages is not a non-empty list")
    for index, message in enumerate(raw):
        if not isinstance(message, dict):
            raise Rejected("wrong_type", f"message {index} is not an object")
        role = _role(message, index)
        content = message.get("content")
        if not isinstance(content, list):
            text = text_of(content, f"message {index}", drop_non_text)
            messages.append({"role": role, "content": text})
            continue
        texts, calls, thinking, results = [], [], [], []
        for block in content:
            kind = type_of(block)
            if kind == "tool_use":
                calls.append(
                    {
                        "id": str(block.get("id", "")),
                        "type": "function",
                        "function": {
                            "name": _string(block.get("name"), f"message {index} tool_use name"),
                            "arguments": _arguments(block.get("input"), budget),
                        },
                    }
                )
            elif kind == "tool_result":
                result = text_of(
                    block.get("content"), f"message {index} tool_result", drop_non_text
                )
                results.append(
                    {
                        "role": "tool",
                        "tool_call_id": str(block.get("tool_use_id", "")),
                        "content": result,
                    }
                )
            elif kind == "thinking":
                thinking.append(_string(block.get("thinking"), f"message {index} thinking"))
            elif kind == "redacted_thinking" or (kind == "text" and block.get("text") == ""):
                continue  # vLLM's Anthropic server skips empty text blocks too
            else:
                texts.append(block)
        messages.extend(results)  # tool results answer the previous turn's calls: they come first
        text = text_of(texts, f"message {index}", drop_non_text)
        if role == "assistant":
            normalized: dict[str, Any] = {"role": role, "content": text}
            if calls:
                normalized["tool_calls"] = calls
            if thinking:
                normalized["reasoning"] = normalized["reasoning_content"] = "".join(thinking)
            messages.append(normalized)
        elif texts:  # a user turn of tool results (or nothing) alone is no message of its own
            messages.append({"role": role, "content": text})
    return messages


# Claude Code's per-request attribution block: vLLM's Anthropic server drops it (it would defeat
# prefix caching), so the prompt it renders never holds it.
BILLING_HEADER = "x-anthropic-billing-header"


def _anthropic_system(system: Any) -> str:
    """The top-level system prompt as vLLM's Anthropic server joins it: a string as it is; of a
    list of blocks, the non-empty text blocks concatenated with nothing between them."""
    if system is None or isinstance(system, str):
        return system or ""
    if not isinstance(system, list):
        raise Rejected("wrong_type", f"system is a {type(system).__name__}")
    texts = [
        _string(block.get("text"), "system text block")
        for block in system
        if type_of(block) == "text"
    ]
    return "".join(t for t in texts if t and not t.startswith(BILLING_HEADER))


# A function definition's fields the engine's models keep, in their order; any other key of a
# tool or its function is dropped as the tool is dumped for the template. The optional flags are
# dropped too while null. (Chat Completions' tool model; the Responses and Anthropic servers
# build that same model from their own tools.)
FUNCTION_FIELDS = ("name", "description", "parameters")
FUNCTION_FLAGS = ("strict", "defer_loading")
# The Responses API's tool union, by its `type`: the fields each variant requires. Only function
# tools reach the template (a namespace's function tools too, named NAMESPACE__NAME): the
# others are the server's own tools, which a template never sees.
RESPONSES_TOOL_FIELDS: dict[str, tuple[str, ...]] = {
    "function": ("name",),
    "namespace": ("name", "description", "tools"),
    "custom": ("name",),
    "file_search": ("vector_store_ids",),
    "computer": (),
    "computer_use_preview": ("display_height", "display_width", "environment"),
    "web_search": (),
    "web_search_2025_08_26": (),
    "web_search_preview": (),
    "web_search_preview_2025_03_11": (),
    "mcp": ("server_label",),
    "code_interpreter": ("container",),
    "programmatic_tool_calling": (),
    "image_generation": (),
    "local_shell": (),
    "shell": (),
    "tool_search": (),
    "apply_patch": (),
}
NAMESPACE_SEPARATOR = "__"
# A namespace's tools: function or custom tools, by `type`.
NAMESPACED_TOOL_TYPES = frozenset({"function", "custom"})


def chat_completions_tools(tools: list[Any]) -> list[dict[str, Any]]:
    """A Chat Completions request's tools as the engine's request model takes them (each of
    type "function", the default, with a `function` object naming it by a string) and dumps
    them for the template (served_tool); anything else is the engine's 400."""
    served = []
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if type_of(tool, "function") != "function" or not isinstance(function, dict):
            raise Rejected(
                "invalid_request",
                f"tool {index} of a Chat Completions request is no function tool "
                '({"type": "function", "function": {"name": ...}})',
            )
        served.append(served_tool(function, tool.get("defer_loading"), f"tool {index}"))
    return served


def responses_tools(tools: list[Any]) -> list[dict[str, Any]]:
    """A Responses request's tools as the engine's request model takes them (its tool union: a
    known `type` with the fields that type requires; a function flat, named by a string) and
    hands them to the template: its function tools, a namespace's named within it, each as
    served_tool dumps it; the server's own tools render nothing. Anything else: a 400."""
    served = []
    for index, tool in enumerate(tools):
        kind = type_of(tool) if isinstance(tool, dict) else None
        required = RESPONSES_TOOL_FIELDS.get(kind) if kind is not None else None
        if required is None or any(tool.get(name) is None for name in required):
            raise Rejected(
                "invalid_request",
                f"tool {index} of a Responses request is none of its API's tools (a known "
                "type, with the fields that type requires)",
            )
        where = f"tool {index}"
        if kind == "function":
            served.append(served_tool(tool, None, where))
        elif kind == "namespace":
            served.extend(_namespace_tools(tool, where))
    return served


def _namespace_tools(namespace: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """A Responses namespace's function tools, each named NAMESPACE__NAME for the template."""
    name, tools = namespace["name"], namespace["tools"]
    if not isinstance(name, str) or not isinstance(tools, list):
        raise Rejected("invalid_request", f"{where}: a namespace's name or tools of a wrong type")
    served = []
    for index, tool in enumerate(tools):
        inner = f"{where}.tools[{index}]"
        if (
            not isinstance(tool, dict)
            or type_of(tool) not in NAMESPACED_TOOL_TYPES
            or not isinstance(tool.get("name"), str)
        ):
            raise Rejected("invalid_request", f"{inner} is no named function or custom tool")
        if type_of(tool) == "function":
            named = {**tool, "name": f"{name}{NAMESPACE_SEPARATOR}{tool['name']}"}
            served.append(served_tool(named, None, inner))
    return served


def anthropic_tools(tools: list[Any]) -> list[dict[str, Any]]:
    """Anthropic tool definitions as vLLM's Anthropic server hands them on: every tool needs a
    name and an `input_schema` (its request model refuses the request otherwise), which becomes
    the function's parameters, with `"type": "object"` added last when the schema has no type,
    as its validator adds it; then dumped as served_tool dumps a function."""
    converted = []
    for index, tool in enumerate(tools):
        name = tool.get("name") if isinstance(tool, dict) else None
        schema = tool.get("input_schema") if isinstance(tool, dict) else None
        if not isinstance(name, str) or not isinstance(schema, dict):
            raise Rejected(
                "invalid_request",
                f"tool {index} of an Anthropic request has no name and input_schema",
            )
        parameters = schema if "type" in schema else {**schema, "type": "object"}
        function = {"name": name, "description": tool.get("description"), "parameters": parameters}
        function |= {flag: tool.get(flag) for flag in FUNCTION_FLAGS}
        converted.append(served_tool(function, None, f"tool {index}"))
    return converted


def served_tool(function: dict[str, Any], defer_loading: Any, where: str) -> dict[str, Any]:
    """A function tool as the engine's tool model dumps it for the template, whichever API sent
    it: type; function: name, description, parameters (absent ones null), then strict and
    defer_loading where not null (the function's own defer_loading, else the tool's); then the
    tool's defer_loading where not null. Every other key is dropped. A field of the wrong type
    is the engine's 400 (the name a string, the parameters an object, the flags booleans).
    where: the tool, for the letter."""
    declared = {name: function.get(name) for name in FUNCTION_FIELDS}
    if function.get("defer_loading") is None:
        function = {**function, "defer_loading": defer_loading}
    flags = {flag: function.get(flag) for flag in FUNCTION_FLAGS}
    if not isinstance(declared["name"], str):  # its shape refused any other type: none given
        raise Rejected("invalid_request", f"{where} names no function")
    if (
        not isinstance(declared["description"], (str, type(None)))
        or not isinstance(declared["parameters"], (dict, type(None)))
        or not all(
            isinstance(value, (bool, type(None))) for value in (*flags.values(), defer_loading)
        )
    ):
        raise Rejected(
            "wrong_type",
            f"{where}: a function's description, parameters, strict or defer_loading of "
            "a wrong type",
        )
    served: dict[str, Any] = {
        "type": "function",
        "function": declared | {flag: value for flag, value in flags.items() if value is not None},
    }
    if defer_loading is not None:
        served["defer_loading"] = defer_loading
    return served


def type_of(item: Any, default: str | None = None) -> str | None:
    """An item's `type` when it is a string (a hostile list or object in its place is no type:
    it must not reach a set lookup, which would raise instead of rejecting)."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type", default)
    return kind if isinstance(kind, str) else None


def _list(value: Any) -> list[Any]:
    """A list field of a response, or nothing when it holds anything else."""
    return value if isinstance(value, list) else []


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise Rejected("wrong_type", f"{where} is a {type(value).__name__}, not a string")
    return value


# What a piece of a generation is: the turn's reasoning, its content, a tool call's name or its
# arguments, or its id (no text the model counts: a template may render it, as a prompt's call
# keeps it). A piece is (what, the tool call it belongs to or None, its value).
REASONING, CONTENT, CALL_NAME, CALL_ARGUMENTS = "reasoning", "content", "name", "arguments"
CALL_ID = "id"
Piece = tuple[str, Any, Any]


def generated_text(response: Any) -> str | None:
    """What the model generated, as text to count: content, reasoning, tool-call names and
    arguments, from a Chat Completions, Responses or Anthropic response, or a list of streamed
    chunks; None when the response holds none of them."""
    pieces = _pieces(response)
    if pieces is None:
        return None
    return "".join(_piece_text(value) for what, _, value in pieces if what != CALL_ID)


def generated_turn(response: Any, budget: ContainerBudget) -> dict[str, Any] | None:
    """The assistant message a response holds, normalized as a prompt's assistant message is
    (openai_messages): the pieces generated_text counts, put back where a chat template reads
    them (reasoning_content, content, tool_calls, with their ids as a prompt's calls keep them),
    a stream's deltas joined per tool call; None when the response holds no generation. The
    same walk as generated_text: the turn holds exactly what the text holds."""
    pieces = _pieces(response)
    if pieces is None:
        return None
    texts: dict[str, list[str]] = {REASONING: [], CONTENT: []}
    calls: dict[Any, dict[str, list[Any]]] = {}
    for what, call, value in pieces:
        if call is None:
            texts[what].append(_piece_text(value))
        else:
            parts = calls.setdefault(call, {CALL_ID: [], CALL_NAME: [], CALL_ARGUMENTS: []})
            parts[what].append(value)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts[CONTENT])}
    if texts[REASONING]:
        message["reasoning_content"] = "".join(texts[REASONING])
    message["tool_calls"] = [
        {
            **({"id": call[CALL_ID][0]} if call[CALL_ID] else {}),
            "type": "function",
            "function": {
                "name": "".join(map(_piece_text, call[CALL_NAME])),
                "arguments": _joined_arguments(call[CALL_ARGUMENTS]),
            },
        }
        for call in calls.values()
    ]
    return _openai_message(message, 0, False, budget)


def _pieces(response: Any) -> list[Piece] | None:
    """Every chunk's pieces in order; None when there are none but ids."""
    chunks = response if isinstance(response, list) else [response]
    pieces = [p for c in chunks if isinstance(c, dict) for p in _generated_pieces(c) or ()]
    return pieces if any(what != CALL_ID for what, _, _ in pieces) else None


def _piece_text(value: Any) -> str:
    return value if isinstance(value, str) else _json_text(value)


def _joined_arguments(values: list[Any]) -> Any:
    """A call's arguments: an object as it came (Anthropic's input), a stream's strings joined."""
    if len(values) == 1 and not isinstance(values[0], str):
        return values[0]
    return "".join(map(_piece_text, values))


def ended_at_stop(response: Any) -> bool | None:
    """Whether the first sequence ended at a stop (its end-of-sequence or a stop token or
    string, which the engine generated and counts), or was cut at its length (nothing after
    its text); None when the response does not say. The last reason given wins (a stream's
    final chunk). Read by shape, as the generation is (_generated_pieces): a first sequence's
    finish_reason, else an Anthropic message's stop_reason, else a Responses status, so a
    stream's condensed read (streamed.condensed, by its choices) and its whole read agree."""
    ended = None
    for chunk in response if isinstance(response, list) else [response]:
        if not isinstance(chunk, dict):
            continue
        choice = _first_sequence(chunk.get("choices"))
        if choice is not None:
            reason = choice.get("finish_reason")
        elif chunk.get("type") == "message":  # Anthropic
            reason = chunk.get("stop_reason")
        else:
            reason = chunk.get("status") if chunk.get("object") == "response" else None
        if isinstance(reason, str) and reason in STOP_REASONS:
            ended = STOP_REASONS[reason]
    return ended


# Each API's word for how a sequence ended: at a stop (True) or at its length (False).
STOP_REASONS = {
    "stop": True,
    "tool_calls": True,
    "end_turn": True,
    "stop_sequence": True,
    "tool_use": True,
    "completed": True,
    "length": False,
    "max_tokens": False,
    "incomplete": False,
}


def holds_generation(response: Any) -> bool:
    """Whether a response holds a place where what was generated is read (generated_text), if
    empty: a first sequence's message, delta or text; a Responses `output`; an Anthropic
    message's `content`."""
    chunks = response if isinstance(response, list) else [response]
    return any(isinstance(c, dict) and _generated_pieces(c) is not None for c in chunks)


def _generated_pieces(chunk: dict[str, Any]) -> list[Piece] | None:
    """What a chunk generated, in order; None when it holds no place a generation is read."""
    pieces: list[Piece] = []
    held = False
    choice = _first_sequence(chunk.get("choices"))
    if choice is not None:
        message = choice.get("message", choice.get("delta"))
        if isinstance(message, dict):
            pieces += message_pieces(message)
            held = True
        elif "text" in choice:
            pieces.append((CONTENT, None, choice.get("text")))
            held = True
    output = chunk.get("output")
    held = held or isinstance(output, list)
    for position, item in enumerate(output if isinstance(output, list) else []):  # Responses
        if not isinstance(item, dict):
            continue
        if type_of(item) == "function_call":
            call = ("item", position)
            pieces += [
                (CALL_ID, call, item.get("call_id")),
                (CALL_NAME, call, item.get("name")),
                (CALL_ARGUMENTS, call, item.get("arguments")),
            ]
        what = REASONING if type_of(item) == "reasoning" else CONTENT
        for part in _list(item.get("content")) or _list(item.get("summary")):
            if isinstance(part, dict):  # a refusal part's text generated too, as text_of reads it
                pieces.append(
                    (what, None, part.get("refusal" if type_of(part) == "refusal" else "text"))
                )
    if chunk.get("type") == "message" and isinstance(chunk.get("content"), list):  # Anthropic
        held = True
        for position, block in enumerate(chunk["content"]):
            if not isinstance(block, dict):
                continue
            if type_of(block) == "tool_use":
                call = ("block", position)
                pieces += [
                    (CALL_ID, call, block.get("id")),
                    (CALL_NAME, call, block.get("name")),
                    (CALL_ARGUMENTS, call, block.get("input")),
                ]
            else:
                what = REASONING if type_of(block) == "thinking" else CONTENT
                pieces.append((what, None, block.get("text", block.get("thinking"))))
    return [p for p in pieces if isinstance(p[2], (str, dict, list))] if held else None


def _first_sequence(choices: Any) -> dict[str, Any] | None:
    """The choice of the first sequence generated (`index` 0, or none given): a streamed chunk
    of a request of many carries any of them, in any order."""
    for choice in choices if isinstance(choices, list) else ():
        if isinstance(choice, dict) and choice.get("index") in (None, 0):
            return choice
    return None


def message_pieces(message: dict[str, Any]) -> list[Piece]:
    """What a response's message (or a streamed chunk's delta) generated, in order, None where
    it holds nothing: its reasoning, content, and each tool call's name and arguments (a
    streamed delta's call known by its `index`, a message's by its place)."""
    reasoning, content = message_texts(message)
    pieces: list[Piece] = [(REASONING, None, reasoning), (CONTENT, None, content)]
    for position, call in enumerate(_list(message.get("tool_calls"))):
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            index = call.get("index")
            key = ("call", index if isinstance(index, int) else position)
            pieces += [
                (CALL_ID, key, call.get("id")),
                (CALL_NAME, key, function.get("name")),
                (CALL_ARGUMENTS, key, function.get("arguments")),
            ]
    return pieces


def message_texts(message: dict[str, Any]) -> tuple[Any, Any]:
    """A response message's reasoning (by either name it goes by) and content, None where
    absent: what it generated before any tool call."""
    return message.get("reasoning_content", message.get("reasoning")), message.get("content")


# The Chat Completions request fields the serving engine hands its chat template, each of the
# type its request model takes, as the template variable of its name; the same names inside
# chat_template_kwargs are held to the same types. Each API resolves its own (the settings
# functions below, one per API, named by records.API_FIELDS): the engine merges a request's
# resolved variables over its server's defaults (the run's --chat-template-kwargs); it refuses a
# request's own template unless its server trusts request templates, which kvtrace, rendering
# the run's template, never does.
TEMPLATE_FIELDS: dict[str, type] = {
    "add_generation_prompt": bool,
    "continue_final_message": bool,
    "documents": list,
    "reasoning_effort": str,
}
# Their values where a Chat Completions request gives none (and always, for the one an Anthropic
# request is built into): set, not unset, so they override chat_template_kwargs of the same name.
CHAT_DEFAULTS = {"add_generation_prompt": True, "continue_final_message": False}
UNTRUSTED_TEMPLATE = "untrusted_template"
# apply_chat_template's own arguments: as a template variable each would change what the render
# returns (tokenize: ids, not text) or what it renders, never what the engine's template reads.
RENDER_ARGUMENTS = frozenset(
    {
        "chat_template",
        "conversation",
        "messages",
        "tools",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
MAX_TEMPLATE_KWARGS = 64  # names a request may set: more than any template reads


def request_fields(record: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The request's fields as the engine received them. LiteLLM's standard logging payload (its
    body the record itself) keeps the chat at its top level and the request's other parameters
    in `model_parameters`, those the OpenAI API lacks under their `extra_body`, which the client
    sends as top-level fields (over any of the same name); the payload's own fields come first."""
    parameters = record.get("model_parameters") if body is record else None
    if not isinstance(parameters, dict):
        return body
    extra = parameters.get("extra_body")
    if extra is not None and not isinstance(extra, dict):
        raise Rejected("wrong_type", f"model_parameters extra_body is a {type(extra).__name__}")
    sent = {name: value for name, value in parameters.items() if name != "extra_body"}
    return sent | (extra or {}) | body


# The template variable a reasoning effort turns thinking on or off by, unless the request's
# chat_template_kwargs name it: on for any effort but "none".
ENABLE_THINKING = "enable_thinking"
# The reasoning efforts each API's request model takes (Chat Completions' reasoning_effort and
# Responses' reasoning.effort alike; Anthropic's output_config.effort has no "none" nor
# "minimal"): the engine refuses any other.
REASONING_EFFORTS = frozenset({"none", "minimal", "low", "medium", "high", "xhigh", "max"})
ANTHROPIC_EFFORTS = REASONING_EFFORTS - {"none", "minimal"}
# A Responses input item the engine continues rather than closing it and opening a new turn:
# its last item, a message or reasoning item, of one of these statuses.
CONTINUED_ITEMS = frozenset({"message", "reasoning"})
PARTIAL_STATUSES = frozenset({"in_progress", "incomplete"})


def chat_completions_settings(body: dict[str, Any]) -> dict[str, Any]:
    """A Chat Completions request's template variables as the engine resolves them: its
    chat_template_kwargs, under its top-level fields (add_generation_prompt and
    continue_final_message always: their defaults, true and false, override the kwargs of the
    same name), and a reasoning effort's enable_thinking (_with_effort)."""
    if body.get("chat_template") is not None:
        raise Rejected(UNTRUSTED_TEMPLATE, "the request brings its own chat_template")
    settings = own_kwargs(body)
    for name, kind in TEMPLATE_FIELDS.items():
        value = body.get(name)
        if value is None:
            value = CHAT_DEFAULTS.get(name)
        elif not isinstance(value, kind):
            raise Rejected("wrong_type", f"{name} is a {type(value).__name__}, no {kind.__name__}")
        if value is not None:
            settings[name] = value
    if settings.get("documents") is not None and not all(
        isinstance(d, dict) and all(isinstance(v, str) for v in d.values())
        for d in settings["documents"]
    ):
        raise Rejected("wrong_type", "documents are not objects of strings")
    if settings["add_generation_prompt"] and settings["continue_final_message"]:
        raise Rejected(
            "invalid_request", "add_generation_prompt and continue_final_message both true"
        )
    return _with_effort(settings, body.get("reasoning_effort"), REASONING_EFFORTS, body)


def responses_settings(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request's template variables as the engine resolves them: its
    chat_template_kwargs, under a generation prompt unless its last input item is a partial
    message or reasoning item (CONTINUED_ITEMS, PARTIAL_STATUSES), which is continued instead,
    and its reasoning.effort (_with_effort)."""
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise Rejected("wrong_type", f"reasoning is a {type(reasoning).__name__}, no object")
    effort = reasoning.get("effort") if reasoning is not None else None
    items = body.get("input")
    last = items[-1] if isinstance(items, list) and items else None
    continued = (
        isinstance(last, dict)
        and type_of(last, "message") in CONTINUED_ITEMS
        and last.get("status") in PARTIAL_STATUSES
    )
    settings = own_kwargs(body) | {
        "add_generation_prompt": not continued,
        "continue_final_message": continued,
    }
    return _with_effort(settings, effort, REASONING_EFFORTS, body)


def anthropic_settings(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages request's template variables as the engine resolves them: it builds
    a Chat Completions request of its chat_template_kwargs alone (so with a generation prompt,
    never continuing), its output_config.effort the reasoning effort (_with_effort). Thinking
    turned off takes an effort the server picks by probing its template (or its own option),
    which no log says: a letter."""
    config = body.get("output_config")
    if config is not None and not isinstance(config, dict):
        raise Rejected("wrong_type", f"output_config is a {type(config).__name__}, no object")
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        raise Rejected(
            "unsupported_request",
            "thinking disabled: the engine renders it with an effort its server picks, which "
            "the log does not say",
        )
    settings = own_kwargs(body) | CHAT_DEFAULTS
    effort = config.get("effort") if config is not None else None
    return _with_effort(settings, effort, ANTHROPIC_EFFORTS, body)


def _with_effort(
    settings: dict[str, Any], effort: Any, efforts: frozenset[str], body: dict[str, Any]
) -> dict[str, Any]:
    """Settings with a request's reasoning effort (null: none), one of the API's `efforts`: the
    template variable reasoning_effort, and enable_thinking on for any effort but "none" unless
    the request's chat_template_kwargs name it (ENABLE_THINKING)."""
    if effort is None:
        return settings
    if not isinstance(effort, str):
        raise Rejected("wrong_type", f"reasoning effort is a {type(effort).__name__}, no str")
    if effort not in efforts:
        raise Rejected(
            "invalid_request",
            f"reasoning effort {effort[:32]!r}: the API takes {', '.join(sorted(efforts))}",
        )
    kwargs = body.get("chat_template_kwargs")
    settings = {**settings, "reasoning_effort": effort}
    # Named at all, even unset (UNSET_KWARGS): the engine then leaves it to its server.
    if not (isinstance(kwargs, dict) and ENABLE_THINKING in kwargs):
        settings[ENABLE_THINKING] = effort != "none"
    return settings


# The kwarg values the engine reads as unset, merging a request's kwargs over its server's.
UNSET_KWARGS = (None, "auto")


def own_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """A request's chat_template_kwargs, checked: of a bounded number of names, none of them
    apply_chat_template's own arguments nor a template, those TEMPLATE_FIELDS name of its type
    where they reach the template.
    A kwarg the engine reads as unset (UNSET_KWARGS) is left out (a null one also as a Parquet
    row, which cannot tell null from absent, reads it); a null inside a kwarg's value is the
    template's."""
    own = body.get("chat_template_kwargs")
    if own is None:
        return {}
    if not isinstance(own, dict):
        raise Rejected("wrong_type", f"chat_template_kwargs is a {type(own).__name__}")
    own = {name: value for name, value in own.items() if value not in UNSET_KWARGS}
    if len(own) > MAX_TEMPLATE_KWARGS:
        raise Rejected("too_large", f"{len(own)} chat_template_kwargs, over {MAX_TEMPLATE_KWARGS}")
    if own.get("chat_template") is not None:
        raise Rejected(UNTRUSTED_TEMPLATE, "the request brings its own chat_template")
    if reserved := sorted(RENDER_ARGUMENTS.intersection(own)):
        raise Rejected("invalid_request", f"chat_template_kwargs sets {reserved[0][:64]!r}")
    for name, kind in TEMPLATE_FIELDS.items():
        # Only those that reach the template: every API's settings set the generation prompt's
        # two (CHAT_DEFAULTS' names) over the kwargs, whatever these hold.
        if name not in CHAT_DEFAULTS and name in own and not isinstance(own[name], kind):
            raise Rejected("wrong_type", f"chat_template_kwargs {name} is no {kind.__name__}")
    return own
