"""A model's tokenizer from its files: the Rust tokenizer of `tokenizers` plus transformers' own
chat template renderer, without AutoTokenizer.

AutoTokenizer imports transformers' model registry, which imports torch wherever torch is
installed (16 s on a GPU box); this costs the tokenizer file's load and, for chat requests only,
transformers' template renderer (loaded alone: template_renderer.py). It mirrors what
PreTrainedTokenizerFast.apply_chat_template does before it calls that renderer (template choice, None-valued keys dropped, special tokens as template
variables); tests/transforms/encode/test_fast_tokenizer.py checks token ids and rendered text against AutoTokenizer
on the shipped tokenizers and templates.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path
from typing import Any

import tokenizers

from kvtrace.transforms.encode import template_renderer
from kvtrace.transforms.encode.regular_files import UnfitFile, read_regular_file
from kvtrace.transforms.trace_format import (
    EXTRA_TEMPLATE_PATTERN,
    EXTRA_TEMPLATES,
    TOKENIZER_FILES,
    FormatError,
    parse_json,
)

_LOG = logging.getLogger("kvtrace")

# The files kvtrace reads from a tokenizer folder are the published format's vocabulary (the
# manifest's `tokenizer.sha256` keys): the tokenizer's identity is their bytes, nothing else.
TOKENIZER_FILE, CONFIG_FILE, SPECIAL_TOKENS_FILE, TEMPLATE_FILE = TOKENIZER_FILES
EXTRA_TEMPLATE_KEY = re.compile(EXTRA_TEMPLATE_PATTERN)
# What a file may weigh before it is opened: tokenizer.json 7.8 MB (DeepSeek-R1) and 11.4 MB
# (Qwen3) here, ~33 MB for the largest vocabularies (Gemma 3); its config 0.17 MB here and
# 1.2 MB for Gemma 3, whose added_tokens_decoder lists 6k tokens; templates are tens of kB.
MAX_FILE_BYTES = {
    TOKENIZER_FILE: 64 << 20,
    CONFIG_FILE: 8 << 20,
    SPECIAL_TOKENS_FILE: 1 << 20,
    TEMPLATE_FILE: 1 << 20,
}
MAX_TEMPLATE_BYTES = 1 << 20
# The model's config beside its tokenizer, read for its vocab_size alone: the engine takes any
# token id up to the larger of the tokenizer's and the model's last (a model's vocabulary may be
# padded past its tokenizer's: Qwen3's 151,936 against 151,669). Configs are a few kB.
MODEL_CONFIG_FILE = "config.json"
MAX_MODEL_CONFIG_BYTES = 1 << 20
MAX_EXTRA_TEMPLATES = 16  # entries of the folder, of any kind: the listing is bounded too
# Added tokens become one regular expression (segment_cache.py); Gemma 3 has 6k, Llama 3 256.
MAX_ADDED_TOKENS = 1 << 16
MAX_SPECIAL_TOKEN_CHARS = 1024
# The named special tokens transformers passes to every template (its special_tokens_map).
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def read_tokenizer_files(folder: Path) -> dict[str, bytes]:
    """The bytes of each tokenizer file in folder, by key: each read once, a regular file within
    its bound. tokenizer.json must be there; the others are read when present."""
    files = {}
    for name in TOKENIZER_FILES:
        data = _read_if_present(folder / name, MAX_FILE_BYTES[name])
        if data is not None:
            files[name] = data
    if TOKENIZER_FILE not in files:
        raise ValueError(f"tokenizer folder {folder}: no {TOKENIZER_FILE}")
    extra = folder / EXTRA_TEMPLATES
    if os.path.isdir(extra):
        files.update(_read_extra_templates(extra))
    return files


def _read_if_present(path: Path, max_bytes: int) -> bytes | None:
    try:
        return read_regular_file(path, max_bytes)
    except FileNotFoundError:
        if os.path.lexists(path):  # a link to nothing is a broken folder, not a missing file
            raise UnfitFile(f"{path} is a link to nothing") from None
        return None


def _read_extra_templates(extra: Path) -> dict[str, bytes]:
    files = {}
    with os.scandir(extra) as entries:
        for count, entry in enumerate(entries, 1):
            if count > MAX_EXTRA_TEMPLATES:
                raise UnfitFile(f"{extra}: more than {MAX_EXTRA_TEMPLATES} entries")
            key = f"{EXTRA_TEMPLATES}/{entry.name}"
            if not entry.name.endswith(".jinja"):
                continue  # transformers reads only *.jinja there; nor does kvtrace
            if not EXTRA_TEMPLATE_KEY.fullmatch(key):
                raise UnfitFile(
                    f"{extra}/{entry.name}: a template name is letters, digits, _ and -"
                )
            files[key] = read_regular_file(entry.path, MAX_TEMPLATE_BYTES)
    return dict(sorted(files.items()))


def files_sha256(files: dict[str, bytes]) -> dict[str, str]:
    """sha256 of each file's bytes, by key: what the manifest records."""
    return {key: hashlib.sha256(data).hexdigest() for key, data in sorted(files.items())}


class FastTokenizer:
    """The subset of a transformers fast tokenizer that kvtrace uses."""

    is_fast = True

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        chat_template: str | dict[str, str] | None,
        special_tokens: dict[str, str],
        sha256: dict[str, str] | None = None,
        tokenizer_json: bytes = b"",
        max_token_id: int | None = None,
    ):
        """max_token_id: the largest token id the engine takes (None: the tokenizer's own)."""
        self.backend_tokenizer = backend
        self.chat_template = chat_template
        self.special_tokens_map = special_tokens
        self.files_sha256 = sha256 or {}  # of the bytes this tokenizer was built from
        self.tokenizer_json = tokenizer_json  # what a faster backend loads (fast_backend.py)
        self.max_token_id = largest_token_id(backend) if max_token_id is None else max_token_id

    def encoding_with(self, backend: Any) -> FastTokenizer:
        """This tokenizer with another backend encoding its texts (fast_backend.py)."""
        return FastTokenizer(
            backend,
            self.chat_template,
            self.special_tokens_map,
            self.files_sha256,
            self.tokenizer_json,
            self.max_token_id,
        )

    @classmethod
    def from_directory(cls, folder: Path) -> FastTokenizer:
        return cls.from_files(read_tokenizer_files(folder), model_vocab_size(folder))

    @classmethod
    def from_files(cls, files: dict[str, bytes], vocab_size: int | None = None) -> FastTokenizer:
        """The tokenizer built from the bytes read (read_tokenizer_files), never from the folder
        again: what is hashed is what is loaded. vocab_size: the model's (model_vocab_size),
        which widens the token ids the engine takes past the tokenizer's."""
        config = _json_object(files, CONFIG_FILE)
        special = {**config, **_json_object(files, SPECIAL_TOKENS_FILE)}
        tokens = {
            name: _token_text(special[name], name)
            for name in SPECIAL_TOKEN_NAMES
            if special.get(name) is not None
        }
        try:
            backend = tokenizers.Tokenizer.from_buffer(files[TOKENIZER_FILE])
        except Exception as err:  # the Rust parser's error, whatever its type
            raise ValueError(f"{TOKENIZER_FILE}: not a tokenizer ({str(err)[:200]})") from None
        _encode_as_served(backend)
        added = backend.get_added_tokens_decoder()
        if len(added) > MAX_ADDED_TOKENS:
            raise ValueError(
                f"{TOKENIZER_FILE}: {len(added)} added tokens, over {MAX_ADDED_TOKENS}"
            )
        largest = largest_token_id(backend)
        return cls(
            backend,
            _chat_template(files, config),
            tokens,
            files_sha256(files),
            files[TOKENIZER_FILE],
            largest if vocab_size is None else max(largest, vocab_size - 1),
        )

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        tools: list[dict] | None = None,
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> str:
        if tokenize:
            raise ValueError("FastTokenizer renders text only; tokenize with backend_tokenizer")
        messages = [{k: v for k, v in m.items() if v is not None} for m in conversation]
        rendered, _ = template_renderer.render_jinja_template()(
            conversations=[messages],
            tools=tools,
            chat_template=self._template(chat_template, tools),
            add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens_map, **kwargs},
        )
        return rendered[0]

    def _template(self, chosen: str | None, tools: list[dict] | None) -> str:
        """The template to render with, chosen as transformers' get_chat_template chooses."""
        templates = self.chat_template
        if isinstance(templates, dict):
            if chosen is not None:
                return templates.get(chosen, chosen)
            if tools is not None and "tool_use" in templates:
                return templates["tool_use"]
            if "default" in templates:
                return templates["default"]
            raise ValueError(
                f"the tokenizer has several chat templates and none is the default: "
                f"{sorted(templates)}"
            )
        if chosen is not None:
            return chosen
        if templates is None:
            raise ValueError(
                "the tokenizer has no chat template, so chat requests cannot be "
                "rendered; give prompt-shaped records or a tokenizer with a template"
            )
        return templates


def _encode_as_served(backend: tokenizers.Tokenizer) -> None:
    """backend made to encode a prompt as the serving engine does, whatever its file says.

    A tokenizer.json may carry `truncation` and `padding` from its export, which `tokenizers`
    applies to every encode: a prompt cut short, or padded to the longest of its batch (its ids
    then depend on which texts share its batch). transformers, which the engines encode prompts
    through, turns both off for an encode that asks for neither. A BPE model's `dropout` (a
    training setting) skips merges at random on every encode; transformers' model tokenizers
    (Qwen2Tokenizer, LlamaTokenizer, ...) rebuild the model from its vocabulary and merges
    without it, and an engine that kept it would tokenize no prompt reproducibly, so no trace
    could follow it: cleared too, said once.
    """
    backend.no_truncation()
    backend.no_padding()
    dropout = getattr(backend.model, "dropout", None)
    if dropout:
        _LOG.warning(
            "%s: its model's dropout %g is a training setting; prompts are tokenized without "
            "it, as transformers' model tokenizers load it",
            TOKENIZER_FILE,
            dropout,
        )
        backend.model.dropout = None


def largest_token_id(backend: tokenizers.Tokenizer) -> int:
    """The tokenizer's largest token id: its vocabulary's size, or an added token past it."""
    added = backend.get_added_tokens_decoder()
    return max(backend.get_vocab_size(with_added_tokens=True) - 1, max(added, default=-1))


def model_vocab_size(folder: Path) -> int | None:
    """The vocab_size of the model's config.json in folder (its text model's, for a model whose
    config nests one, as the engine reads it); None without the file or the field. ValueError,
    in one line, for a config that is no JSON object or a vocab_size that is no count."""
    data = _read_if_present(folder / MODEL_CONFIG_FILE, MAX_MODEL_CONFIG_BYTES)
    if data is None:
        return None
    config = _json_object({MODEL_CONFIG_FILE: data}, MODEL_CONFIG_FILE)
    text = config.get("text_config")
    size = text.get("vocab_size") if isinstance(text, dict) else None
    size = config.get("vocab_size") if size is None else size
    if size is not None and (type(size) is not int or not 1 <= size <= 1 << 32):
        raise ValueError(f"{MODEL_CONFIG_FILE}: vocab_size is not a count from 1 to 2^32")
    return size


def _json_object(files: dict[str, bytes], name: str) -> dict[str, Any]:
    if name not in files:
        return {}
    try:
        value = parse_json(_text(files[name], name))
    except FormatError as err:  # not JSON, too deep, a key twice: named, in one line
        raise ValueError(f"{name}: {err}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name}: not a JSON object")
    return value


def _token_text(value: Any, name: str) -> str:
    """A special token as configured: a string, or an AddedToken's fields."""
    text = value.get("content") if isinstance(value, dict) else value
    if not isinstance(text, str) or len(text) > MAX_SPECIAL_TOKEN_CHARS:
        raise ValueError(
            f"{CONFIG_FILE}: {name} is not a string of at most {MAX_SPECIAL_TOKEN_CHARS} characters"
        )
    return text


def _chat_template(files: dict[str, bytes], config: dict[str, Any]) -> str | dict[str, str] | None:
    """The model's chat template(s), as transformers reads them: template files
    (chat_template.jinja as "default", additional_chat_templates/NAME.jinja) take priority over
    tokenizer_config.json's entry; named templates become a dict."""
    templates = {}
    if TEMPLATE_FILE in files:
        templates["default"] = _text(files[TEMPLATE_FILE], TEMPLATE_FILE)
    templates.update(
        {
            key[len(EXTRA_TEMPLATES) + 1 : -len(".jinja")]: _text(data, key)
            for key, data in files.items()
            if key.startswith(EXTRA_TEMPLATES + "/")
        }
    )
    if templates:
        return templates["default"] if list(templates) == ["default"] else templates
    return _configured_template(config.get("chat_template"))


def _configured_template(template: Any) -> str | dict[str, str] | None:
    """tokenizer_config.json's chat_template: one template, or a list of named ones."""
    if template is None or (isinstance(template, str) and len(template) <= MAX_TEMPLATE_BYTES):
        return template
    if (
        isinstance(template, list)
        and len(template) <= MAX_EXTRA_TEMPLATES
        and all(
            isinstance(entry, dict)
            and isinstance(entry.get("name"), str)
            and isinstance(entry.get("template"), str)
            and len(entry["template"]) <= MAX_TEMPLATE_BYTES
            for entry in template
        )
    ):
        return {entry["name"]: entry["template"] for entry in template}
    raise ValueError(
        f"{CONFIG_FILE}: chat_template is neither a template of at most "
        f"{MAX_TEMPLATE_BYTES} characters nor a list of at most "
        f"{MAX_EXTRA_TEMPLATES} named ones"
    )


def _text(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{name}: not UTF-8 text") from None
