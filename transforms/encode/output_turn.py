"""A response's generation counted as the engine generated it, where the log holds no usage.

The text a response holds (read.chat.generated_text) is what the engine's parsers left of the
tokens the model generated: the tool calls cut out of the template's tool-call markup, the
reasoning out of its think markup, the end-of-turn token dropped. So the turn is counted through
the run's own chat template, as the engine's next request would render it: the prompt's
messages and the assistant message the response holds (chat.generated_turn) rendered without a
generation prompt, tokenized through the same segment-cached call as the prompt, and the tokens
past the prompt (rendered with its generation prompt, what the prompt tokens already are) are
the turn's. docs/ANONYMIZE.md says the rule and its cases:
- the end-of-turn token the template writes after the turn counts where the sequence stopped
  (the engine generated it as its stop token), the whitespace the template writes after it
  does not; a sequence that did not (cut at its length, aborted, not said) generated nothing
  past its text: no end-of-turn token, nor, cut in its reasoning, the markup closing it;
- a template that rewrites what the prompt rendered (the conversation's tokens no extension of
  the prompt's): the turn is what the conversation renders past the tokens the two share;
- a template that leaves the turn's reasoning out (renders the turn the same without it): the
  reasoning's own tokens are added, with the added token that ended it (reasoning_marker: the
  engine generated both);
- whatever the turn counts, the output is never shorter than the text's own tokens and the stop
  token the response says it ended at (the count without a template: the completions API).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvtrace.transforms.encode.blocks import TOKEN_DTYPE, shared_length
from kvtrace.transforms.encode.tokenize import check_rendered, render_chat
from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.records import Request


@dataclass(frozen=True)
class Turn:
    """The texts a generated turn is counted from: the conversation it ends (its prompt's
    messages and the turn, rendered without a generation prompt, through its end-of-turn
    token), and the reasoning the template left out of it, if any."""

    conversation: str
    dropped_reasoning: str | None

    def texts(self) -> list[str]:
        """The texts to tokenize, in the order generated_length takes their tokens."""
        return [self.conversation] + ([self.dropped_reasoning] if self.dropped_reasoning else [])


def render_turn(
    tokenizer: Any, request: Request, template_kwargs: dict[str, Any], max_record_bytes: int
) -> Turn | None:
    """The Turn of a chat request whose output is its response's generation, rendered under the
    same budget and bound as its prompt; None where there is none to render, or the template
    does not render it (then the text's count stands)."""
    if request.output_turn is None or request.kind != "chat" or request.messages is None:
        return None
    own = dict(request.template_kwargs or {})
    if {**template_kwargs, **own}.get("continue_final_message"):
        return None  # the generation continues the prompt's last message: no turn of its own

    def rendered(turn: dict[str, Any]) -> str:
        conversation = render_chat(
            tokenizer,
            [*request.messages, turn],
            request.tools,
            template_kwargs,
            request.timestamp_ms,
            {**own, "add_generation_prompt": False},
        )
        return check_rendered(conversation, len(request.line), max_record_bytes)

    turn = request.output_turn
    reasoning = turn.get("reasoning_content")
    try:
        conversation = rendered(turn)
        without = rendered(without_reasoning(turn)) if reasoning else conversation
    except Rejected:
        return None
    # Dropped where the template renders the turn the same without it (DeepSeek-R1's).
    dropped = bool(reasoning) and conversation == without
    # A sequence that did not stop (cut at its length, aborted, not said) generated nothing past
    # its text: cut in its reasoning, none of the markup the template closes it with.
    in_reasoning = request.output_stopped is not True and not (
        turn.get("content") or turn.get("tool_calls")
    )
    if in_reasoning and reasoning and not dropped:
        conversation = conversation[: reasoning_end(conversation, without)]
    else:
        eos = getattr(tokenizer, "special_tokens_map", {}).get("eos_token")
        conversation = through_end_of_turn(conversation, eos, request.output_stopped)
    if not dropped:
        return Turn(conversation, None)
    marker = None if in_reasoning else reasoning_marker(tokenizer, template_kwargs)
    return Turn(conversation, reasoning + (marker or ""))


def reasoning_end(conversation: str, without: str) -> int:
    """Where the reasoning ends in a conversation that renders it (`without`: the same turn
    rendered without it): past the text the two share at their end, after the prefix they
    share (so the two never overlap)."""
    start = common_prefix(conversation, without)
    return len(conversation) - common_prefix(conversation[start:][::-1], without[start:][::-1])


def without_reasoning(turn: dict[str, Any]) -> dict[str, Any]:
    """The turn without its reasoning, under either name a message carries it by."""
    return {name: value for name, value in turn.items() if name not in REASONING_NAMES}


REASONING_NAMES = frozenset({"reasoning", "reasoning_content"})


def reasoning_marker(tokenizer: Any, template_kwargs: dict[str, Any]) -> str | None:
    """The added token a template splits an assistant turn's content on, rendering only what
    follows it: the end of the reasoning the model generated (DeepSeek-R1's `</think>`), where
    the engine's parser cut the reasoning from the content, and which the template drops with
    the reasoning. Found by rendering, once per tokenizer and run's template variables: the
    first added token the template's source names whose turn `x<token>y` renders as the turn
    `y` (and `xy` does not); None where none does."""
    found = _MARKERS.get(tokenizer)
    if found is None:
        found = _MARKERS.setdefault(tokenizer, {})
    key = repr(sorted(template_kwargs.items()))
    if key not in found:
        found[key] = _find_marker(tokenizer, template_kwargs)
    return found[key]


def _find_marker(tokenizer: Any, template_kwargs: dict[str, Any]) -> str | None:
    templates = tokenizer.chat_template
    source = "".join(templates.values()) if isinstance(templates, dict) else templates or ""
    added = tokenizer.backend_tokenizer.get_added_tokens_decoder()

    def rendered(content: str) -> str | None:
        turn = [_PROBE_QUESTION, {"role": "assistant", "content": content}]
        try:
            return render_chat(
                tokenizer, turn, None, template_kwargs, 0, {"add_generation_prompt": False}
            )
        except Rejected:
            return None

    after = rendered("y")
    if after is None or rendered("xy") == after:
        return None  # the template renders no content to split
    for _, token in sorted(added.items()):
        if token.content and token.content in source and rendered(f"x{token.content}y") == after:
            return token.content
    return None


_PROBE_QUESTION = {"role": "user", "content": "kvtrace probe"}
# Per tokenizer (a process may hold several), forgotten with it: per run's template variables,
# its reasoning marker.
_MARKERS: weakref.WeakKeyDictionary[Any, dict[str, str | None]] = weakref.WeakKeyDictionary()


def through_end_of_turn(conversation: str, eos: str | None, stopped: bool | None) -> str:
    """The conversation through the end-of-turn token that ends it (the whitespace a template
    writes after it never generated) where the sequence stopped (stopped True), else before it
    (cut at its length, aborted, or not said: as the text's floor counts none); as it is where
    it does not end in that token."""
    at = conversation.rfind(eos) if eos else -1
    if at < 0 or conversation[at + len(eos or "") :].strip():
        return conversation
    return conversation[: at + len(eos or "")] if stopped else conversation[:at]


def common_prefix(first: str, second: str) -> int:
    """The length of the longest prefix the two share, by halving (each test one C compare)."""
    if second.startswith(first):
        return len(first)
    low, high = 0, min(len(first), len(second))
    while low < high:
        middle = (low + high + 1) // 2
        if first[:middle] == second[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def generated_length(
    prompt: bytes, text: bytes, stopped: bool | None, turn: list[bytes] | None
) -> tuple[int, bytes]:
    """(the output length, the generated tokens to hash): prompt, text and turn as token_bytes
    (turn: Turn.texts' tokens). The tokens the conversation holds past those it shares with
    the prompt, with a dropped reasoning's, but never fewer than the text's and its stop token;
    the turn's tokens are the ones hashed where they extend the prompt, else the text's."""
    floor = len(text) // TOKEN_DTYPE.itemsize + (1 if stopped else 0)
    if turn is None:
        return floor, text
    conversation, *dropped = turn
    shared = _shared_tokens(prompt, conversation)
    generated = conversation[shared * TOKEN_DTYPE.itemsize :]
    counted = (len(generated) + sum(map(len, dropped))) // TOKEN_DTYPE.itemsize
    extends = shared * TOKEN_DTYPE.itemsize == len(prompt) and not dropped
    return max(floor, counted), generated if extends else text


def _shared_tokens(first: bytes, second: bytes) -> int:
    """How many leading tokens two token_bytes share."""
    return shared_length(np.frombuffer(first, TOKEN_DTYPE), np.frombuffer(second, TOKEN_DTYPE))
