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

import json
from pathlib import Path
from typing import Any

import tokenizers

from transforms.encode import template_renderer

TOKENIZER_FILE = "tokenizer.json"
# The named special tokens transformers passes to every template (its special_tokens_map).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")


class FastTokenizer:
    """The subset of a transformers fast tokenizer that kvtrace uses."""

    is_fast = True

    def __init__(self, backend: tokenizers.Tokenizer, chat_template: str | dict[str, str] | None,
                 special_tokens: dict[str, str]):
        self.backend_tokenizer = backend
        self.chat_template = chat_template
        self.special_tokens_map = special_tokens

    @classmethod
    def from_directory(cls, folder: Path) -> FastTokenizer:
        config = _read_json(folder / "tokenizer_config.json")
        special = {**config, **_read_json(folder / "special_tokens_map.json")}
        tokens = {name: _token_text(special[name]) for name in SPECIAL_TOKEN_NAMES
                  if special.get(name) is not None}
        backend = tokenizers.Tokenizer.from_file(str(folder / TOKENIZER_FILE))
        return cls(backend, _chat_template(folder, config), tokens)

    def apply_chat_template(
        self, conversation: list[dict[str, Any]], tools: list[dict] | None = None,
        tokenize: bool = False, add_generation_prompt: bool = False,
        chat_template: str | None = None, **kwargs: Any,
    ) -> str:
        if tokenize:
            raise ValueError("FastTokenizer renders text only; tokenize with backend_tokenizer")
        messages = [{k: v for k, v in m.items() if v is not None} for m in conversation]
        rendered, _ = template_renderer.render_jinja_template()(
            conversations=[messages], tools=tools, chat_template=self._template(chat_template, tools),
            add_generation_prompt=add_generation_prompt, **{**self.special_tokens_map, **kwargs},
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
            raise ValueError(f"the tokenizer has several chat templates and none is the default: "
                             f"{sorted(templates)}")
        if chosen is not None:
            return chosen
        if templates is None:
            raise ValueError("the tokenizer has no chat template, so chat requests cannot be "
                             "rendered; give prompt-shaped records or a tokenizer with a template")
        return templates


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _token_text(value: Any) -> str:
    """A special token as configured: a string, or an AddedToken's fields."""
    return value["content"] if isinstance(value, dict) else str(value)


def _chat_template(folder: Path, config: dict[str, Any]) -> str | dict[str, str] | None:
    """The model's chat template(s), as transformers reads them: template files
    (chat_template.jinja as "default", additional_chat_templates/NAME.jinja) take priority over
    tokenizer_config.json's entry; named templates become a dict."""
    files = {}
    if (folder / "chat_template.jinja").is_file():
        files["default"] = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        files.update({path.stem: path.read_text(encoding="utf-8")
                      for path in sorted(extra.glob("*.jinja"))})
    if files:
        return files["default"] if list(files) == ["default"] else files
    template = config.get("chat_template")
    if isinstance(template, list):
        return {entry["name"]: entry["template"] for entry in template}
    return template
