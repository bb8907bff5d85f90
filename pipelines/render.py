"""`kvtrace render`: a trace back into text requests an OpenAI-compatible server (or aiperf, or
kvtrace anonymize) takes, whose tokenization reproduces the trace's blocks exactly
(transforms/replay/render.py says how); every rendering is checked by tokenizing it again."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from transforms import storage
from transforms.encode.tokenize import encode_texts, load_tokenizer, render_chat
from transforms.replay.render import render_blocks, reproduces, template_overhead, vocabulary
from transforms.stats.trace_io import read_trace

_LOG = logging.getLogger("kvtrace")
SHAPES = ("prompt", "chat")
MAX_EXAMPLES = 5


@dataclass(frozen=True)
class RenderConfig:
    inputs: tuple[str, ...]
    output: str
    tokenizer: str
    block_size: int = 512
    shape: str = "prompt"  # prompt: {"prompt": text}; chat: {"messages": [one user message]}
    verify: bool = True
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


def run_render(config: RenderConfig) -> dict:
    started = time.perf_counter()
    trace = read_trace(config.inputs)
    tokenizer = load_tokenizer(config.tokenizer)
    words = vocabulary(tokenizer)
    head, tail = (template_overhead(tokenizer, words, config.chat_template_kwargs)
                  if config.shape == "chat" else (0, 0))
    # A row must hold the template's own tokens and one word of content.
    fits = trace.input_length >= head + tail + 1
    rendered = render_blocks(trace, config.block_size, words, head)
    texts = rendered.rows(head, tail)
    sessions = trace.session.tolist() if trace.session is not None else [None] * len(trace)
    with storage.create(config.output) as handle:
        for row in np.flatnonzero(fits).tolist():
            handle.write((json.dumps(_request(config.shape, texts[row], trace, row, sessions[row]))
                          + "\n").encode())
    report = {"rows": len(trace), "written": int(fits.sum()), "shape": config.shape,
              "template_tokens": {"before": head, "after": tail},
              "too_short_for_the_template": int((~fits).sum()), "merged_blocks": rendered.merged,
              "malformed_lines": trace.malformed_count}
    if config.verify:
        report["verified"] = _verify(config, tokenizer, trace, texts, fits)
    _LOG.info("rendered %d requests in %.1f s", report["written"], time.perf_counter() - started)
    return report


def _request(shape: str, text: str, trace, row: int, session: object) -> dict:
    request: dict[str, Any] = {"timestamp": int(trace.timestamp[row])}
    if shape == "chat":
        request["messages"] = [{"role": "user", "content": text}]
    else:
        request["prompt"] = text
    request["max_tokens"] = request["output_length"] = int(trace.output_length[row])
    if session is not None:
        request["session_id"] = str(session)
    return request


def _verify(config: RenderConfig, tokenizer: Any, trace, texts: list[str], fits: np.ndarray) -> dict:
    """Tokenize every rendered request as the server (and anonymize) would, and compare."""
    if config.shape == "chat":
        texts = [render_chat(tokenizer, [{"role": "user", "content": t}], None,
                             config.chat_template_kwargs) for t in texts]
    ok = reproduces(trace, encode_texts(tokenizer, texts), config.block_size) & fits
    wrong = np.flatnonzero(~ok & fits)
    return {"rows_reproduced": int(ok.sum()), "rows_not_reproduced": int(len(wrong)),
            "examples": [{"file": trace.files[trace.file_index[r]], "line": int(trace.line[r])}
                         for r in wrong[:MAX_EXAMPLES].tolist()]}
