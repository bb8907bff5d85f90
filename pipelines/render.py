"""`kvtrace render`: a trace back into text requests an OpenAI-compatible server (or aiperf, or
kvtrace anonymize) takes, whose tokenization reproduces the trace's blocks exactly
(transforms/replay/render.py says how); every rendering is checked by tokenizing it again."""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvtrace.pipelines.local_workers import (
    START_METHOD,
    adopt_environment,
    can_fork,
    end_workers,
    leave_stopping_to_parent,
    worker_death,
    workers_environment,
)
from kvtrace.pipelines.processes import end_with_parent
from kvtrace.transforms.batching import batches_by_weight
from kvtrace.transforms.encode.tokenize import encode_texts, load_tokenizer, render_chat
from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.read.trace_io import Trace, read_trace
from kvtrace.transforms.replay.render import (
    block_keys,
    render_blocks,
    reproduces_blocks,
    template_overhead,
    vocabulary,
)
from kvtrace.transforms.stats.trace_blocks import covered_tokens
from kvtrace.transforms.synth.shards import take_rows
from kvtrace.transforms.trace_format import DEFAULT_BLOCK_SIZE, OUTPUT_LENGTH_FIELD, TIMESTAMP_FIELD
from kvtrace.transforms.write.publish import StagedFile, file_output

_LOG = logging.getLogger("kvtrace")
MAX_EXAMPLES = 5


@dataclass(frozen=True)
class RenderConfig:
    inputs: tuple[str, ...]
    output: str
    tokenizer: str
    block_size: int = DEFAULT_BLOCK_SIZE
    shape: str = "prompt"  # prompt: {"prompt": text}; chat: {"messages": [one user message]}
    verify: bool = True
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


# Rows rendered, written and verified at a time, bounded by their tokens (a tokenized token costs
# ~100 bytes until it is reduced to block digests) and by count: memory follows a batch's text
# and tokens (and 16 bytes per block of the trace), not the whole trace's.
BATCH_TOKENS = 1 << 20
BATCH_ROWS = 256
# Tokens one row may cost, its text built and tokenized again: at most one batch, so that the
# batch's bound holds for every row (a 73 KB trace line may ask for 6 M tokens). Longer rows are
# skipped and counted; 1 Mi tokens is a long context window of the models served today.
MAX_ROW_TOKENS = BATCH_TOKENS
PROGRESS_INTERVAL_S = 30.0


def run_render(
    config: RenderConfig,
    report: StagedFile | None = None,
    accept: Callable[[dict], None] = lambda summary: None,
) -> dict:
    """Renders the trace into the output, published whole (publish.file_output) once written,
    with the report (which accept may stage from the summary) once accept has passed."""
    with file_output(config.output, report=report) as output:
        summary = _render(config, output)
        accept(summary)
    return summary


def _render(config: RenderConfig, output: StagedFile) -> dict:
    started = time.perf_counter()
    whole = read_trace(config.inputs)
    trace, too_long = _within_row_bound(whole, config.block_size)
    tokenizer = load_tokenizer(config.tokenizer)
    words = vocabulary(tokenizer)
    head, tail = (
        template_overhead(tokenizer, words, config.chat_template_kwargs)
        if config.shape == "chat"
        else (0, 0)
    )
    # A row must hold the template's own tokens and one word of content.
    fits = trace.input_length >= head + tail + 1
    rendered = render_blocks(trace, config.block_size, words, head)
    sessions = trace.session.tolist() if trace.session is not None else [None] * len(trace)
    lengths, keys = [], []
    last_progress = time.monotonic()
    with output.create() as handle, _verifier(config) as verify:
        tokens_of = _row_tokens(trace, config.block_size).tolist()
        pending = None  # the batch being tokenized in the verifier while the next is built
        for rows in batches_by_weight(
            range(len(trace)), BATCH_TOKENS, tokens_of.__getitem__, BATCH_ROWS
        ):
            texts = [rendered.row(r, head, tail) for r in rows]
            for r, text in zip(rows, texts):
                if fits[r]:
                    handle.write(
                        (
                            json.dumps(_request(config.shape, text, trace, r, sessions[r])) + "\n"
                        ).encode()
                    )
            if config.verify:
                if pending is not None:
                    _collect(pending, lengths, keys)
                pending = verify.submit(_verified_batch, texts)
            if time.monotonic() - last_progress >= PROGRESS_INTERVAL_S:
                last_progress = time.monotonic()
                _LOG.info(
                    "rendered %d of %d rows%s",
                    rows[-1] + 1,
                    len(trace),
                    ", verified" if config.verify else "",
                )
        if pending is not None:
            _collect(pending, lengths, keys)
    report = {
        "rows": len(whole),
        "written": int(fits.sum()),
        "shape": config.shape,
        "template_tokens": {"before": head, "after": tail},
        "too_short_for_the_template": int((~fits).sum()),
        "too_long": too_long,
        "merged_blocks": rendered.merged,
        "malformed_lines": {
            "count": whole.malformed_count,  # as analyze reports them
            "examples": whole.malformed[:MAX_EXAMPLES],
        },
    }
    if config.verify:
        report["verified"] = _verified(config, trace, lengths, keys, fits)
    _LOG.info("rendered %d requests in %.1f s", report["written"], time.perf_counter() - started)
    return report


_VERIFIER: dict = {}  # in the verifier process: the config and its tokenizer


@contextlib.contextmanager
def _verifier(config: RenderConfig) -> Iterator[ProcessPoolExecutor]:
    """One process that tokenizes the rendered texts to verify them, as the local engine's
    workers tokenize: a native abort in the tokenizer is this process's one-line error, not
    its silent death."""
    context = multiprocessing.get_context("fork" if can_fork() else START_METHOD)
    pool = ProcessPoolExecutor(
        1, context, initializer=_start_verifier, initargs=(config, workers_environment())
    )
    try:
        yield pool
    except BrokenProcessPool:
        workers = list((pool._processes or {}).values())  # no public handle on them
        end_workers(pool)
        raise JobStopped(worker_death(workers).replace("a worker", "the verifying")) from None
    except BaseException:
        end_workers(pool)
        raise
    pool.shutdown()


def _start_verifier(config: RenderConfig, environment: dict[str, str]) -> None:
    end_with_parent()
    adopt_environment(environment)
    leave_stopping_to_parent()
    _VERIFIER.update(config=config, tokenizer=load_tokenizer(config.tokenizer))


def _verified_batch(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """In the verifier: each text's block lengths and keys, tokenized as served."""
    config, tokenizer = _VERIFIER["config"], _VERIFIER["tokenizer"]
    return block_keys(
        encode_texts(tokenizer, _as_served(config, tokenizer, texts)), config.block_size
    )


def _collect(pending: Future, lengths: list[np.ndarray], keys: list[np.ndarray]) -> None:
    batch_lengths, batch_keys = pending.result()
    lengths.append(batch_lengths)
    keys.append(batch_keys)


def _row_tokens(trace: Trace, block_size: int) -> np.ndarray:
    """Per row, the tokens rendering it costs: render_blocks spells what its ids cover, which a
    row whose ids outnumber its input_length makes larger than the length it claims."""
    return np.maximum(
        trace.input_length, covered_tokens(trace.input_length, trace.lengths, block_size)
    )


def _within_row_bound(trace: Trace, block_size: int) -> tuple[Trace, dict]:
    """The rows of at most MAX_ROW_TOKENS tokens, and the count and first places of the rest,
    left out before any of their text is built."""
    over = _row_tokens(trace, block_size) > MAX_ROW_TOKENS
    places = [
        {"file": trace.files[trace.file_index[r]], "line": int(trace.line[r])}
        for r in np.flatnonzero(over)[:MAX_EXAMPLES].tolist()
    ]
    skipped = {"count": int(over.sum()), "max_tokens": MAX_ROW_TOKENS, "examples": places}
    if places:
        _LOG.warning(
            "%d row(s) left out: over %d tokens to render (first: %s line %d)",
            skipped["count"],
            MAX_ROW_TOKENS,
            places[0]["file"],
            places[0]["line"],
        )
    return (take_rows(trace, np.flatnonzero(~over)) if over.any() else trace), skipped


def _request(shape: str, text: str, trace, row: int, session: object) -> dict:
    request: dict[str, Any] = {TIMESTAMP_FIELD: int(trace.timestamp[row])}
    if shape == "chat":
        request["messages"] = [{"role": "user", "content": text}]
    else:
        request["prompt"] = text
    request["max_tokens"] = request[OUTPUT_LENGTH_FIELD] = int(trace.output_length[row])
    if session is not None:
        request["session_id"] = str(session)
    return request


def _as_served(config: RenderConfig, tokenizer: Any, texts: list[str]) -> list[str]:
    """The text the server (and anonymize) tokenizes for each request."""
    if config.shape != "chat":
        return texts
    return [
        render_chat(tokenizer, [{"role": "user", "content": t}], None, config.chat_template_kwargs)
        for t in texts
    ]


def _verified(
    config: RenderConfig, trace, lengths: list[np.ndarray], keys: list[np.ndarray], fits: np.ndarray
) -> dict:
    """Every rendered request, tokenized as served, against the trace's blocks."""
    ok = (
        reproduces_blocks(
            trace,
            np.concatenate(lengths + [np.zeros(0, np.int64)]),
            np.concatenate(keys + [np.zeros((0, 2), np.uint64)]),
            config.block_size,
        )
        & fits
    )
    wrong = np.flatnonzero(~ok & fits)
    return {
        "rows_reproduced": int(ok.sum()),
        "rows_not_reproduced": int(len(wrong)),
        "examples": [
            {"file": trace.files[trace.file_index[r]], "line": int(trace.line[r])}
            for r in wrong[:MAX_EXAMPLES].tolist()
        ],
    }
