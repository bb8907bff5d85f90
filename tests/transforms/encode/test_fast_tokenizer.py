"""The light tokenizer (tokenizers + transformers' template renderer) against AutoTokenizer: the
same token ids and the same rendered text, so that skipping the model stack changes no byte."""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import SHAPES, shared_path
from kvtrace.transforms.encode.fast_tokenizer import FastTokenizer
from kvtrace.transforms.encode.template_renderer import RENDERER_MODULE
from kvtrace.transforms.encode.tokenize import (
    PROBE_TEXT,
    encode_texts,
    load_tokenizer,
    render_chat,
    tokenization_fingerprint,
)
from kvtrace.transforms.read.records import ParseOptions, parse_record

TEXTS = [
    PROBE_TEXT,
    "",
    " ",
    "a\n\n\nb",
    "<|im_start|>user\nhi<|im_end|>",
    "  leading",
    "<｜begin▁of▁sentence｜><｜User｜>x<｜Assistant｜><think>\n",
    "x" * 5000,
    "١٢٣ 𝔘𝔫𝔦",
]
TEMPLATES = [
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "Qwen-Qwen3-0.6B.jinja",
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "openai-gpt-oss-120b.jinja",
    "deepseek-ai-DeepSeek-V3.1.jinja",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
]
PLAIN = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hello?"},
    {"role": "assistant", "content": "Hi.", "name": None},
    {"role": "user", "content": "x"},
]


def reference(folder: str):
    """transformers' AutoTokenizer, imported by the tests that compare with it rather than at
    collection, which every test worker runs (~2.5 CPU-s each)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def requests() -> list:
    shapes = [
        parse_record(json.dumps(record).encode(), "t", ParseOptions()) for record in SHAPES.values()
    ]
    return [(r.messages, r.tools) for r in shapes] + [(PLAIN, None)]


@pytest.fixture(scope="module", params=["deepseek-r1", "qwen3"])
def both(request):
    folder = str(shared_path("tokenizers", request.param))
    return FastTokenizer.from_directory(shared_path("tokenizers", request.param)), reference(folder)


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_token_ids_equal_autotokenizer(both):
    light, auto = both
    assert encode_texts(light, TEXTS) == encode_texts(auto, TEXTS)
    assert encode_texts(light, TEXTS) == [auto.encode(t, add_special_tokens=False) for t in TEXTS]


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}])
def test_rendered_chats_equal_autotokenizer(both, kwargs):
    light, auto = both
    assert light.special_tokens_map == auto.special_tokens_map
    for messages, tools in requests():
        assert render_chat(light, messages, tools, kwargs) == render_chat(
            auto, messages, tools, kwargs
        )


@pytest.fixture(scope="module")
def deepseek_reference(deepseek_tokenizer):
    """Loaded once for every template: each test passes its template, changing no tokenizer."""
    return reference(deepseek_tokenizer)


# A request's time (2023-11-14 22:13:20 UTC), and transformers' clock stopped at it.
REQUEST_MS = 1_700_000_000_000


class _StoppedClock(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=tz)


@pytest.mark.parametrize("template", TEMPLATES)
def test_real_templates_render_as_autotokenizer(
    deepseek_tokenizer, deepseek_reference, template, monkeypatch
):
    """The same text, strftime_now (gpt-oss prints it) reading the request's time in ours and
    a clock stopped at that time in transformers'."""
    light, auto = load_tokenizer(deepseek_tokenizer), deepseek_reference
    monkeypatch.setattr(sys.modules[RENDERER_MODULE], "datetime", _StoppedClock)
    kwargs = {
        "chat_template": shared_path("templates", template).read_text(),
        "date_string": "21 Nov 2026",
    }
    for messages, tools in requests():
        ours = render_chat(light, messages, tools, kwargs, timestamp_ms=REQUEST_MS)
        assert ours == render_chat(auto, messages, tools, kwargs)


def test_template_files_and_named_templates_are_chosen_as_transformers_does(
    tiny_tokenizer, tmp_path
):
    folder = tmp_path / "tok"
    shutil.copytree(tiny_tokenizer, folder)
    (folder / "additional_chat_templates").mkdir()
    (folder / "additional_chat_templates" / "tool_use.jinja").write_text("TOOLS{{ tools|length }}")
    light, auto = FastTokenizer.from_directory(folder), reference(str(folder))
    assert set(light.chat_template) == {"default", "tool_use"}
    assert light.chat_template == auto.chat_template
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for use in (None, tools):
        assert render_chat(light, PLAIN[1:2], use, {}) == render_chat(auto, PLAIN[1:2], use, {})
    assert render_chat(light, PLAIN[1:2], tools, {}) == "TOOLS1"


def test_a_tokenizer_without_a_template_is_a_clear_error(tiny_tokenizer, tmp_path):
    folder = tmp_path / "tok"
    shutil.copytree(tiny_tokenizer, folder)
    (folder / "chat_template.jinja").unlink()
    with pytest.raises(ValueError, match="no chat template"):
        FastTokenizer.from_directory(folder).apply_chat_template(PLAIN, tokenize=False)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[" * 5000 + "]" * 5000, "nested deeper than"),  # past the parser's stack
        ('{"a": 1, "a": 2}', "an object repeats a key"),
        ("{", "not JSON"),
    ],
)
def test_a_config_the_json_parse_refuses_is_named_in_one_line(tiny_tokenizer, tmp_path, text, said):
    folder = tmp_path / "tok"
    shutil.copytree(tiny_tokenizer, folder)
    (folder / "tokenizer_config.json").write_text(text)
    with pytest.raises(ValueError, match=f"^tokenizer_config.json: {said}") as refused:
        FastTokenizer.from_directory(folder)
    assert "\n" not in str(refused.value)


def test_loading_imports_neither_the_model_stack_nor_beam(deepseek_tokenizer):
    """What load_tokenizer and a prompt's encoding import: tokenizers, not transformers (whose
    model registry pulls in torch where installed) nor Beam."""
    code = (
        "import sys\n"
        "from kvtrace.transforms.encode.tokenize import load_tokenizer, encode_texts\n"
        f"encode_texts(load_tokenizer({deepseek_tokenizer!r}), ['hello'])\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'transformers', 'torch', "
        "'apache_beam'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _edited(folder: str, tmp_path, edit) -> tuple[FastTokenizer, FastTokenizer]:
    """(the tokenizer of folder, the same with its tokenizer.json edited), each loaded."""
    changed = tmp_path / "edited"
    shutil.copytree(folder, changed)
    config = json.loads((changed / "tokenizer.json").read_text())
    edit(config)
    (changed / "tokenizer.json").write_text(json.dumps(config))
    return FastTokenizer.from_directory(Path(folder)), FastTokenizer.from_directory(changed)


def test_a_files_truncation_and_padding_never_reach_an_encode(tiny_tokenizer, tmp_path):
    """The engine encodes a prompt whole and alone: a tokenizer.json's truncation to 2 tokens
    and padding to the longest of a batch are off once loaded, fingerprint included."""

    def edit(config: dict) -> None:
        config["truncation"] = {
            "direction": "Right", "max_length": 2, "strategy": "LongestFirst", "stride": 0
        }  # fmt: skip
        config["padding"] = {
            "strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": None,
            "pad_id": 0, "pad_type_id": 0, "pad_token": "<unk>",
        }  # fmt: skip

    plain, edited = _edited(tiny_tokenizer, tmp_path, edit)
    assert edited.backend_tokenizer.truncation is None and edited.backend_tokenizer.padding is None
    texts = ["hello", "hello world this is a prompt", PROBE_TEXT]
    assert encode_texts(edited, texts) == encode_texts(plain, texts)
    assert len(encode_texts(edited, texts)[1]) > 2
    assert tokenization_fingerprint(edited) == tokenization_fingerprint(plain)


def test_a_bpe_dropout_is_cleared_and_said(qwen3_tokenizer, tmp_path, caplog):
    """A training-time dropout skips merges at random: cleared at load (as transformers' model
    tokenizers load it), so the same text gives the same ids on every encode."""
    plain, edited = _edited(
        qwen3_tokenizer, tmp_path, lambda config: config["model"].update(dropout=0.5)
    )
    assert "dropout 0.5" in caplog.text
    assert edited.backend_tokenizer.model.dropout is None
    text = ["Summarize the following paragraph about caching attention keys. " * 8]
    assert all(encode_texts(edited, text) == encode_texts(plain, text) for _ in range(8))
    assert tokenization_fingerprint(edited) == tokenization_fingerprint(plain)
