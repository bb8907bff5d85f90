"""Token ids past the vocabulary: the bound learned as the tokenizer loads (its largest id, or
the model config's vocab_size less one, the larger) and every token-id prompt held to it where
the encoder takes ids, as the engine refuses an id past it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvtrace.transforms.encode.encode_requests import EncodeOptions, RequestEncoder
from kvtrace.transforms.encode.fast_tokenizer import FastTokenizer, largest_token_id
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.read.records import parse_record


def _folder(tiny_tokenizer: str, tmp_path: Path, config: object | None) -> Path:
    """The tiny tokenizer's files, with config as the model's config.json (None: none)."""
    folder = tmp_path / "tok"
    shutil.copytree(tiny_tokenizer, folder)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def _letters(tokenizer: FastTokenizer, records: list[dict]) -> tuple[list[int], list[str]]:
    """(the exported input lengths, the letters' reasons and messages) of records encoded."""
    options = EncodeOptions("tiny", SaltSource("random"), block_size=4)
    requests = [parse_record(json.dumps(r).encode(), "f") for r in records]
    batch, letters = RequestEncoder(tokenizer, b"\0" * 16, options).encode(requests)
    lengths = [] if batch is None else batch.requests["input_length"].tolist()
    return lengths, [f"{letter.reason}: {letter.message}" for letter in letters]


def test_without_a_model_config_the_tokenizers_largest_id_is_the_bound(tiny_tokenizer, tmp_path):
    tokenizer = FastTokenizer.from_directory(_folder(tiny_tokenizer, tmp_path, None))
    largest = largest_token_id(tokenizer.backend_tokenizer)
    assert tokenizer.max_token_id == largest
    assert tokenizer.backend_tokenizer.id_to_token(largest) is not None
    lengths, letters = _letters(
        tokenizer,
        [
            {"timestamp": 1, "input_ids": [0, largest]},
            {"timestamp": 2, "input_ids": [0, largest + 1]},
            {"timestamp": 3, "prompt": [[largest + 1, 1]]},  # a list of one token-id prompt
            {"timestamp": 4, "request": {"prompt": [largest + 5]}},
        ],
    )
    assert lengths == [2]
    bound = f"invalid_request: token id {largest + 1} is out of the vocabulary (ids 0 to {largest})"
    assert letters[:2] == [bound, bound]
    assert letters[2].startswith(f"invalid_request: token id {largest + 5} ")


def test_a_model_vocabulary_past_the_tokenizers_widens_the_bound(tiny_tokenizer, tmp_path):
    """A padded model vocabulary (Qwen3's model 151,936 ids, its tokenizer 151,669): the engine
    takes ids up to the model's last."""
    plain = FastTokenizer.from_directory(_folder(tiny_tokenizer, tmp_path / "a", None))
    size = plain.max_token_id + 100
    tokenizer = FastTokenizer.from_directory(
        _folder(tiny_tokenizer, tmp_path / "b", {"vocab_size": size})
    )
    assert tokenizer.max_token_id == size - 1
    lengths, letters = _letters(
        tokenizer,
        [{"timestamp": 1, "input_ids": [size - 1]}, {"timestamp": 2, "input_ids": [size]}],
    )
    assert lengths == [1] and len(letters) == 1 and letters[0].startswith("invalid_request")


def test_a_nested_text_config_gives_the_vocabulary_and_a_smaller_one_never_narrows(
    tiny_tokenizer, tmp_path
):
    nested = {"vocab_size": 1, "text_config": {"vocab_size": 1 << 20}}
    assert (
        FastTokenizer.from_directory(_folder(tiny_tokenizer, tmp_path / "a", nested)).max_token_id
        == (1 << 20) - 1
    )
    small = FastTokenizer.from_directory(_folder(tiny_tokenizer, tmp_path / "b", {"vocab_size": 2}))
    assert small.max_token_id == largest_token_id(small.backend_tokenizer)
    other = FastTokenizer.from_directory(_folder(tiny_tokenizer, tmp_path / "c", {"model": "x"}))
    assert other.max_token_id == small.max_token_id


@pytest.mark.parametrize(
    "config", [{"vocab_size": "151936"}, {"vocab_size": 0}, {"vocab_size": True}, [1]]
)
def test_a_model_config_that_gives_no_count_is_refused_in_one_line(
    tiny_tokenizer, tmp_path, config
):
    with pytest.raises(ValueError, match=r"^config\.json: [^\n]*$"):
        FastTokenizer.from_directory(_folder(tiny_tokenizer, tmp_path, config))


def test_the_bound_survives_another_encoding_backend(tiny_tokenizer, tmp_path):
    folder = _folder(tiny_tokenizer, tmp_path, {"vocab_size": 1 << 20})
    tokenizer = FastTokenizer.from_directory(folder)
    assert tokenizer.encoding_with(tokenizer.backend_tokenizer).max_token_id == (1 << 20) - 1
