"""The dictionary attack: someone holding the tokenizer hashes a guessed prompt and looks for its
hashes. Against unkeyed engine hashes (--emit-block-hashes) it works, which is why they stay
private; against kvtrace's keyed hashes (even a leaked id map, which holds them) it fails
without the salt."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from helpers import anonymize, write_jsonl
from kvtrace.transforms.encode.blocks import chain_seed, token_bytes
from kvtrace.transforms.encode.schemes import HashScheme
from kvtrace.transforms.encode.tokenize import encode_texts, load_tokenizer

SECRET = "What is the capital of Finland ? The capital of Finland is Helsinki ."
SALT = b"the provider's secret salt, 32b."
BLOCK = 4


def logs(tmp_path):
    rows = [
        {"timestamp": 0, "prompt": SECRET, "output_length": 3},
        {
            "timestamp": 5,
            "prompt": "the quick brown fox jumps over the lazy dog",
            "output_length": 3,
        },
    ]
    return write_jsonl(tmp_path / "in.jsonl", rows)


def guessed_keys(tokenizer: str, scheme: HashScheme, salt: bytes) -> set[bytes]:
    """What the attacker computes for the guessed prompt: its block keys (16 bytes each)."""
    data = token_bytes(encode_texts(load_tokenizer(tokenizer), [SECRET])[0])
    keys = scheme.block_keys(data, BLOCK, chain_seed(salt))
    return {keys[i : i + 16] for i in range(0, len(keys), 16)}


def test_unkeyed_engine_hashes_confirm_a_guessed_prompt(tiny_tokenizer, tmp_path):
    out = tmp_path / "out"
    assert (
        anonymize(
            tiny_tokenizer,
            [logs(tmp_path)],
            out,
            "--block-size",
            str(BLOCK),
            "--hash-scheme",
            "dynamo",
            "--emit-block-hashes",
        )
        == 0
    )
    emitted = pq.read_table(next((tmp_path / "out-block-hashes").glob("*.parquet")))
    published = set(emitted.column("hash").to_pylist())
    guessed = {
        int.from_bytes(k[:8], "little")
        for k in guessed_keys(tiny_tokenizer, HashScheme("dynamo", raw=True), b"")
    }
    assert guessed and guessed <= published  # every block of the guess is found: confirmed
    assert not list(out.glob("block-hashes*"))  # and none of it is in the published folder


def test_keyed_hashes_cannot_be_matched_without_the_salt(tiny_tokenizer, tmp_path):
    salt_file = tmp_path / "salt"
    salt_file.write_bytes(SALT)
    out, id_map = tmp_path / "out", tmp_path / "map"
    assert (
        anonymize(
            tiny_tokenizer,
            [logs(tmp_path)],
            out,
            "--block-size",
            str(BLOCK),
            "--salt-file",
            str(salt_file),
            "--id-map",
            str(id_map),
        )
        == 0
    )
    # The id map holds every keyed block hash: the worst leak short of the salt itself.
    stored = set()
    for segment in id_map.rglob("*.parquet"):  # read as an attacker would: plain Parquet
        table = pq.read_table(segment)
        stored |= {
            int(hi).to_bytes(8, "little") + int(lo).to_bytes(8, "little")
            for hi, lo in zip(table["hi"].to_pylist(), table["lo"].to_pylist())
        }
    assert stored
    for wrong_salt in (b"", b"a guess at the provider's salt!!", SALT[:-1] + b"!"):
        assert not guessed_keys(tiny_tokenizer, HashScheme(), wrong_salt) & stored
    # With the salt the same computation finds them: the test would see a match.
    assert guessed_keys(tiny_tokenizer, HashScheme(), SALT) <= stored
    published = (out / "manifest.json").read_text() + "".join(
        p.read_text() for p in out.glob("trace-*.jsonl")
    )
    assert (
        "Finland" not in published
        and json.loads((out / "manifest.json").read_text())["hash_scheme_keyed"] is True
    )
