"""The fast tokenizer backend: used only where its ids are `tokenizers`' (fast_backend.py).

Exactness on both shipped tokenizers (examples' rendered prompts, probes, random text), refusal
at load of a configuration outside the closed list, and the run-time fallback through a real
fastokens tokenizer that gives other ids (loaded from another tokenizer's file)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import ROOT
from kvtrace.transforms.encode.fallible_tokenizer import (
    FallibleTokenizer,
    TokenizerFailure,
    token_ids,
)
from kvtrace.transforms.encode.fast_backend import (
    AUTO,
    FASTOKENS,
    MAX_FAST_CHARS,
    TOKENIZERS,
    VerifiedBackend,
    choose_backend,
    fastokens_refusal,
    is_sampled,
    probe_difference,
)
from kvtrace.transforms.encode.tokenize import encoding_tokenizer, load_tokenizer, render_chat
from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.records import parse_record

pytest.importorskip("fastokens")
# One worker for the module: each process loads a shipped tokenizer's two backends once (~3 s).
pytestmark = pytest.mark.xdist_group("fast_backend")
EXAMPLES = sorted((ROOT / "examples").glob("*/*.jsonl"))


@functools.lru_cache(maxsize=2)
def _components(folder: str) -> str:
    """A tokenizer.json's configuration without its vocabulary and merges, as JSON."""
    config = json.loads((Path(folder) / "tokenizer.json").read_text())
    config["model"] = {k: v for k, v in config["model"].items() if k not in ("vocab", "merges")}
    return json.dumps(config)


def _config(folder: str) -> dict:
    return json.loads(_components(folder))


def _ids(backend, texts: list[str]) -> list[list[int]]:
    return [token_ids(data).tolist() for data in FallibleTokenizer(backend).encode_or_raise(texts)]


def _rendered_examples(tokenizer) -> list[str]:
    """Every example record's prompt as the job tokenizes it, and its output text."""
    texts = []
    for path in EXAMPLES:
        for line in path.read_bytes().splitlines():
            try:
                request = parse_record(line, str(path))
            except Rejected:  # an example of a record kvtrace dead-letters
                continue
            if request.kind == "chat":
                texts.append(render_chat(tokenizer, request.messages, request.tools, {}))
            elif request.prompt is not None:
                texts.append(request.prompt)
            if request.output_text:
                texts.append(request.output_text)
    return texts


@pytest.fixture(scope="module", params=["deepseek", "qwen3"])
def shipped(request) -> str:
    return request.getfixturevalue(f"{request.param}_tokenizer")


def test_the_shipped_tokenizers_are_in_the_closed_list_and_verified(shipped):
    assert fastokens_refusal(_config(shipped)) is None
    tokenizer = encoding_tokenizer(shipped, FASTOKENS)
    assert isinstance(tokenizer.backend_tokenizer, VerifiedBackend)


def test_same_ids_as_tokenizers_on_the_examples_rendered(shipped):
    """Every example's rendered prompt, whole and in one batch: fast ids (the sample's
    reference ids aside) equal tokenizers' one for one."""
    reference = load_tokenizer(shipped)
    texts = _rendered_examples(reference)
    assert len(texts) > 20
    fast = encoding_tokenizer(shipped, FASTOKENS).backend_tokenizer
    assert [e.ids.tolist() for e in fast._fast_batch(texts)] == _ids(
        reference.backend_tokenizer, texts
    )
    assert fast.fallback is None


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.text(st.characters(codec="utf-8"), max_size=200))
def test_random_unicode_gets_tokenizers_ids(deepseek_tokenizer, text):
    """Random text (any code point UTF-8 can carry, whitespace and marks among them): the fast
    library gives the reference's ids, or the backend refuses it at load (it does not here)."""
    reference = load_tokenizer(deepseek_tokenizer).backend_tokenizer
    fast = encoding_tokenizer(deepseek_tokenizer, FASTOKENS).backend_tokenizer
    assert (
        fast._fast_batch([text])[0].ids.tolist()
        == reference.encode(text, add_special_tokens=False).ids
    )


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    pieces=st.lists(
        st.sampled_from(["<|im_start|>", "<|im_end|>", "<think>", " ", "\n", "12345", "é", "x"])
        | st.text(max_size=12),
        max_size=12,
    )
)
def test_added_tokens_in_random_text_get_tokenizers_ids(qwen3_tokenizer, pieces):
    text = "".join(pieces)
    reference = load_tokenizer(qwen3_tokenizer).backend_tokenizer
    fast = encoding_tokenizer(qwen3_tokenizer, FASTOKENS).backend_tokenizer
    assert (
        fast._fast_batch([text])[0].ids.tolist()
        == reference.encode(text, add_special_tokens=False).ids
    )


def _word_level(tmp_path: Path) -> Path:
    """A real tokenizer.json outside the closed list (a WordLevel model, Whitespace splitting)."""
    tokenizer = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, "[UNK]")
    )
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_a_tokenizer_outside_the_closed_list_is_refused_at_load(tmp_path):
    path = _word_level(tmp_path)
    data, config = path.read_bytes(), json.loads(path.read_text())
    reference = tokenizers.Tokenizer.from_file(str(path))
    assert "pre-tokenizer 'Whitespace'" in fastokens_refusal(config)
    with pytest.raises(ValueError, match="--tokenizer-backend fastokens: the pre-tokenizer"):
        choose_backend(FASTOKENS, data, config, reference)
    backend, why = choose_backend("auto", data, config, reference)
    assert backend is reference and "fastokens refused (the pre-tokenizer" in why


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda c: c["added_tokens"][0].update(lstrip=True), "lstrip=True"),
        (lambda c: c["added_tokens"][0].update(single_word=True), "single_word=True"),
        (lambda c: c["model"].update(byte_fallback=True), "byte_fallback=True"),
        (lambda c: c["model"].update(dropout=0.1), "dropout=0.1"),
        (lambda c: c.update(normalizer={"type": "Lowercase"}), "normalizer 'Lowercase'"),
        (lambda c: c.update(normalizer={"type": "NFC", "x": 1}), "normalizer 'NFC'"),
        (
            lambda c: c["pre_tokenizer"]["pretokenizers"][-1].update(add_prefix_space=True),
            "add_prefix_space=True",
        ),
        (
            lambda c: c["pre_tokenizer"]["pretokenizers"][0].update(behavior="Removed"),
            "behavior='Removed'",
        ),
        (lambda c: c["pre_tokenizer"]["pretokenizers"].append({"type": "Digits"}), "'Digits'"),
        (lambda c: c.update(truncation={"max_length": 8}), "truncates or pads"),
        (lambda c: c["model"].update(future_setting=1), "'future_setting'"),
    ],
)
def test_each_setting_outside_the_closed_list_is_named(qwen3_tokenizer, change, reason):
    """A change of one setting of a tokenizer the list accepts: refused, saying which."""
    config = _config(qwen3_tokenizer)
    change(config)
    assert reason in fastokens_refusal(config)


def _sampled(prefix: str, wanted: bool, count: int = 1) -> list[str]:
    texts = (f"{prefix} {i} Hello, world" for i in range(100_000))
    return [t for t in texts if is_sampled(t) == wanted][:count]


@pytest.fixture(scope="module")
def wrong(qwen3_tokenizer, deepseek_tokenizer) -> VerifiedBackend:
    """Qwen3's fast tokenizer checked against DeepSeek-R1's: a real backend whose ids differ."""
    fast = encoding_tokenizer(qwen3_tokenizer, FASTOKENS).backend_tokenizer._fast
    return fast, load_tokenizer(deepseek_tokenizer).backend_tokenizer


def test_a_sampled_difference_falls_back_for_the_rest_of_the_run(wrong, caplog):
    fast, reference = wrong
    backend = VerifiedBackend(fast, reference)
    unsampled = _sampled("before", False, 3)
    assert _ids(backend, unsampled) != _ids(reference, unsampled)  # fast ids: not yet checked
    assert backend.fallback is None
    batch = [*_sampled("batch", False, 3), *_sampled("batch", True)]
    assert _ids(backend, batch) == _ids(reference, batch)  # the whole batch again, the reference's
    assert "tokenized differently" in backend.fallback
    assert "tokenizers encodes the rest of this run" in caplog.text
    later = _sampled("after", False, 3)
    assert _ids(backend, later) == _ids(reference, later)


def test_sampled_texts_take_the_reference_ids_whatever_the_fast_ones(wrong):
    """A text's sampling is its content's, in any batch and order: the same texts are checked
    in every run, and each of them takes the reference's ids."""
    fast, reference = wrong
    texts = _sampled("s", True, 4)
    assert all(map(is_sampled, texts)) and not any(map(is_sampled, _sampled("s", False, 4)))
    assert [is_sampled(t) for t in reversed(texts)] == [True] * 4
    backend = VerifiedBackend(fast, reference)
    assert _ids(backend, texts) == _ids(reference, texts)


def test_probes_catch_a_backend_that_differs_at_load(wrong, deepseek_tokenizer):
    fast, reference = wrong
    reason = probe_difference(
        VerifiedBackend(fast, reference), reference, _config(deepseek_tokenizer)
    )
    assert reason and reason.startswith("the probe ")


def test_a_text_over_the_fast_length_is_the_references(wrong):
    """A pattern whose backtracking grows with the text reaches the reference's retry limit
    only on millions of characters: such texts are the reference's, ids and failures."""
    fast, reference = wrong
    backend = VerifiedBackend(fast, reference)
    texts = _sampled("long", False, 2)
    texts[1] += " x" * (MAX_FAST_CHARS // 2)
    assert _ids(backend, texts[:1]) != _ids(reference, texts[:1])  # fast ids: differ here
    assert _ids(backend, texts) == _ids(reference, texts)
    assert backend.fallback is None  # never sampled, never compared: the reference's alone


def _splitting_on(qwen3_tokenizer: str, regex: str) -> tuple[bytes, dict, tokenizers.Tokenizer]:
    config = json.loads((Path(qwen3_tokenizer) / "tokenizer.json").read_text())
    config["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": regex}
    data = json.dumps(config).encode()
    return data, config, tokenizers.Tokenizer.from_str(data.decode())


def test_a_reference_failing_on_a_probe_keeps_it_naming_the_probe(qwen3_tokenizer):
    """`(q|q)+z` backtracks past Oniguruma's limit on a run of q's: tokenizers would fail on
    such a text where fastokens encodes it. Off the verified list, it is refused there first;
    the probes, the second step, refuse it too, naming the probe."""
    import fastokens

    data, config, reference = _splitting_on(qwen3_tokenizer, "(q|q)+z")
    backend, why = choose_backend(AUTO, data, config, reference)
    assert backend is reference and "not one verified" in why
    fast = VerifiedBackend(fastokens.Tokenizer.from_json_str(data.decode()), reference)
    why = probe_difference(fast, reference, config)
    assert "tokenizers fails on the probe 'qqqq" in why and "retry-limit" in why


def test_a_text_the_fast_library_fails_on_is_the_references_to_decide(deepseek_tokenizer):
    """A lone surrogate fails in both libraries: the batch goes to the reference, whose
    failure is the text's (a tokenizer_error), and the other texts keep their ids."""
    reference = load_tokenizer(deepseek_tokenizer).backend_tokenizer
    fast = encoding_tokenizer(deepseek_tokenizer, FASTOKENS).backend_tokenizer
    texts = ["fine text", "bad \ud800 text", "more text"]
    got, want = FallibleTokenizer(fast).encode(texts), FallibleTokenizer(reference).encode(texts)
    assert got == want
    assert isinstance(got[1], TokenizerFailure) and isinstance(got[0], bytes)
    assert fast.fallback is None  # a failure is not a difference


def test_the_tokenizers_backend_is_the_reference_itself(deepseek_tokenizer):
    reference = load_tokenizer(deepseek_tokenizer)
    chosen = encoding_tokenizer(deepseek_tokenizer, TOKENIZERS)
    assert chosen.backend_tokenizer is reference.backend_tokenizer
    assert chosen.files_sha256 == reference.files_sha256


def test_an_unknown_backend_is_refused_in_one_line(deepseek_tokenizer):
    with pytest.raises(ValueError, match="one of auto, tokenizers, fastokens"):
        encoding_tokenizer(deepseek_tokenizer, "fast")
