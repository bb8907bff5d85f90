"""add_special_tokens and truncation as the engine's tokenizer applies them (round 24's review):
the special tokens a tokenizer's post-processor adds, found by a probe, wrapped around a prompt
whose request asks for them, truncation keeping them and cutting the content from its side."""

from __future__ import annotations

import json
import shutil

import pytest

from kvtrace.transforms.encode.blocks import chain_seed, token_bytes
from kvtrace.transforms.encode.tokenize import SpecialTokens, load_tokenizer, special_tokens
from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.records import ParseOptions, Request, parse_record

BOS, EOS = "<|im_start|>", "<|im_end|>"
TEXT = "the quick brown fox jumps over the lazy dog again and again"
TS = {"timestamp": 1_700_000_000_000, "output_length": 1}


@pytest.fixture(scope="module")
def wrapping_tokenizer(tiny_tokenizer, tmp_path_factory) -> str:
    """The tiny tokenizer whose post-processor puts a BOS before one sequence and an EOS after
    it, as Llama-style tokenizer.json files do (its TemplateProcessing)."""
    folder = tmp_path_factory.mktemp("wrapping-tokenizer") / "tok"
    shutil.copytree(tiny_tokenizer, folder)
    path = folder / "tokenizer.json"
    config = json.loads(path.read_text())
    ids = {t["content"]: t["id"] for t in config["added_tokens"]}
    special = {name: {"id": name, "ids": [ids[name]], "tokens": [name]} for name in (BOS, EOS)}
    sequence = {"Sequence": {"id": "A", "type_id": 0}}
    config["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, sequence]
        + [{"SpecialToken": {"id": EOS, "type_id": 0}}],
        "pair": [sequence, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": special,
    }
    path.write_text(json.dumps(config))
    return str(folder)


def _engine_ids(tokenizer: str, extra: dict) -> list[int]:
    """The prompt's ids as the engine's tokenizer (transformers) makes them for a completions
    request: add_special_tokens true unless the request says, truncated from its side."""
    from transformers import AutoTokenizer

    engine = AutoTokenizer.from_pretrained(
        tokenizer, truncation_side=extra.get("truncation_side", "left")
    )
    kwargs = {}
    if "truncate_prompt_tokens" in extra:
        kwargs = {"truncation": True, "max_length": extra["truncate_prompt_tokens"]}
    add = extra.get("add_special_tokens", True)
    return engine(TEXT, add_special_tokens=add, **kwargs).input_ids


def _rows(tokenizer: str, requests: list[Request]) -> tuple[list, list[str]]:
    """Each request's (input length, block hashes) as a run encodes them, and letters."""
    from kvtrace.transforms.encode.encode_requests import EncodeOptions, RequestEncoder
    from kvtrace.transforms.encode.salt import SaltSource

    options = EncodeOptions(tokenizer, SaltSource("random", inline=b"x" * 32), block_size=4)
    encoder = RequestEncoder(load_tokenizer(tokenizer), chain_seed(b"x" * 32), options)
    batch, letters = encoder.encode(requests)
    reasons = [letter.reason for letter in letters]
    if batch is None:
        return [], reasons
    keys = [tuple(key) for key in batch.block_hashes.tolist()]
    rows, at = [], 0
    for row in batch.requests:
        rows.append((int(row["input_length"]), keys[at : at + row["num_blocks"]]))
        at += row["num_blocks"]
    return rows, reasons


def _parsed(record: dict) -> Request:
    return parse_record(json.dumps({**record, **TS}).encode(), "x.jsonl", ParseOptions())


def test_the_probe_finds_what_the_post_processor_adds(wrapping_tokenizer, tiny_tokenizer):
    added = special_tokens(load_tokenizer(wrapping_tokenizer))
    ids = load_tokenizer(wrapping_tokenizer).backend_tokenizer.token_to_id
    assert added == SpecialTokens(token_bytes([ids(BOS)]), token_bytes([ids(EOS)]))
    assert special_tokens(load_tokenizer(tiny_tokenizer)) == SpecialTokens(b"", b"")


@pytest.mark.parametrize("name", ["deepseek-r1", "qwen3"])
def test_the_shipped_tokenizers_add_nothing_to_one_sequence(name):
    """Golden outputs hold their bytes: a completions prompt's default (true) adds nothing."""
    from helpers import shared_path

    tokenizer = load_tokenizer(str(shared_path("tokenizers", name)))
    assert special_tokens(tokenizer) == SpecialTokens(b"", b"")


@pytest.mark.parametrize(
    "extra",
    [
        {},  # a completions prompt: the engine adds the special tokens by default
        {"add_special_tokens": True},
        {"add_special_tokens": False},
        {"add_special_tokens": True, "truncate_prompt_tokens": 8},
        {"truncate_prompt_tokens": 8, "truncation_side": "right"},
        {"truncate_prompt_tokens": 8, "truncation_side": "left"},
        {"add_special_tokens": False, "truncate_prompt_tokens": 3, "truncation_side": "right"},
        {"truncate_prompt_tokens": 2},  # the special tokens fill it: no content is left
    ],
)
def test_a_prompts_ids_are_the_engines(wrapping_tokenizer, extra):
    """The ids hashed are the engine's tokenizer's ids for the request, token for token: the
    same rows as the engine's ids given as token ids (which get no special tokens)."""
    served = _parsed({"prompt": TEXT, **extra})
    expected = _parsed({"input_ids": _engine_ids(wrapping_tokenizer, extra)})
    rows, letters = _rows(wrapping_tokenizer, [served, expected])
    assert letters == [] and rows[0] == rows[1]


def test_a_chat_asking_for_special_tokens_gets_them_and_one_asking_none_does_not(
    wrapping_tokenizer, tiny_tokenizer
):
    """A chat's default adds none; its add_special_tokens true wraps the rendered prompt, and
    with a tokenizer whose probe adds nothing is served as the default (no false letter)."""
    messages = [{"role": "user", "content": "hello world"}]
    plain, wrapped = (
        _parsed({"messages": messages, "add_special_tokens": add}) for add in (False, True)
    )
    rows, letters = _rows(wrapping_tokenizer, [plain, wrapped])
    assert letters == [] and rows[1][0] == rows[0][0] + 2
    rows, letters = _rows(tiny_tokenizer, [plain, wrapped])
    assert letters == [] and rows[0] == rows[1]


def test_special_tokens_not_known_exactly_are_a_letter_for_a_request_asking_for_them():
    """A post-processor that changes the sequence itself: no prefix and suffix to add, so a
    request asking for special tokens is a letter, and one asking none is served."""
    from kvtrace.transforms.encode.encode_requests import served_tokens

    class Rewriting:
        def encode_batch_fast(self, texts: list[str], add_special_tokens: bool = False):
            ids = [7, 8] if add_special_tokens else [1, 2]
            return [type("Encoding", (), {"ids": ids})() for _ in texts]

    assert special_tokens(type("Tokenizer", (), {"backend_tokenizer": Rewriting()})()) is None
    content = token_bytes([1, 2])
    asks = Request("x", b"{}", 1, "prompt", prompt="p", add_special_tokens=True)
    with pytest.raises(Rejected) as refused:
        served_tokens(asks, content, None)
    assert refused.value.reason == "unsupported_request"
    plain = Request("x", b"{}", 1, "prompt", prompt="p")
    assert served_tokens(plain, content, None) == content


def test_truncation_to_fewer_tokens_than_the_special_ones_is_a_letter():
    from kvtrace.transforms.encode.encode_requests import served_tokens

    added = SpecialTokens(token_bytes([0]), token_bytes([9]))
    request = Request(
        "x", b"{}", 1, "prompt", prompt="p", add_special_tokens=True, truncate_tokens=1
    )
    with pytest.raises(Rejected) as refused:
        served_tokens(request, token_bytes([1, 2, 3]), added)
    assert refused.value.reason == "unsupported_request"


def test_token_ids_are_cut_from_the_side_the_request_says():
    from kvtrace.transforms.encode.encode_requests import served_tokens

    ids = token_bytes([1, 2, 3, 4, 5])
    for side, kept in (("left", [4, 5]), ("right", [1, 2])):
        request = Request(
            "x", b"{}", 1, "tokens", input_ids=[1], truncate_tokens=2, truncation_side=side
        )
        assert served_tokens(request, ids, SpecialTokens(b"", b"")) == token_bytes(kept)


@pytest.mark.xfail(
    strict=True,
    reason="accepted residual: a tokenizer_config add_bos_token its post-processor does not "
    "carry is served as the installed transformers serves it (docs/ANONYMIZE.md)",
)
def test_special_tokens_that_depend_on_the_library_version_are_a_letter(tiny_tokenizer, tmp_path):
    """transformers 4 rebuilds a Llama-class tokenizer's post-processor from its config's
    add_bos_token (a BOS added), transformers 5 keeps the file's (none): a completions prompt's
    special tokens depend on the engine's library version, so it is not guessed."""
    folder = tmp_path / "tok"
    shutil.copytree(tiny_tokenizer, folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config |= {"add_bos_token": True, "bos_token": BOS, "tokenizer_class": "LlamaTokenizerFast"}
    config_path.write_text(json.dumps(config))
    rows, letters = _rows(str(folder), [_parsed({"prompt": TEXT})])
    assert (rows, letters) == ([], ["unsupported_request"])


def test_the_probe_encodes_by_the_reference_whatever_the_backend(
    qwen3_tokenizer, deepseek_tokenizer
):
    """A fast backend whose ids differ (Qwen3's, checked against DeepSeek-R1's): the probe is
    the reference's alone, so it finds the reference's answer, and counts no backend sample."""
    pytest.importorskip("fastokens")
    from kvtrace.transforms.encode.fast_backend import FASTOKENS, VerifiedBackend
    from kvtrace.transforms.encode.tokenize import encoding_tokenizer

    fast = encoding_tokenizer(qwen3_tokenizer, FASTOKENS).backend_tokenizer._fast
    reference = load_tokenizer(deepseek_tokenizer)
    backend = VerifiedBackend(fast, reference.backend_tokenizer)
    assert special_tokens(reference.encoding_with(backend)) == SpecialTokens(b"", b"")
    assert (backend.fallback, backend.checked) == (None, 0)
