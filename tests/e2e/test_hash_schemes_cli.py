"""Engine-compatible block hashes: Dynamo's and vLLM's, checked against vectors from the engines'
own code; the published ids do not depend on the scheme.

The whole CLI runs; the unit tests are in tests/transforms/encode/test_hash_schemes.py."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from helpers import MAP_SALT, anonymize, anonymize_night, chat, map_night, trace, write_jsonl
from kvtrace.cli import main


def test_published_ids_do_not_depend_on_the_scheme(tiny_tokenizer, tmp_path):
    rows = [chat(i, 1000 * i, session=f"s{i % 3}", rotate=i % 2) for i in range(12)]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    traces = []
    for scheme in (["kvtrace"], ["dynamo"], ["vllm-sha256-cbor", "--vllm-hash-seed", "7"]):
        out = tmp_path / scheme[0]
        assert (
            anonymize(tiny_tokenizer, [src], out, "--block-size", "4", "--hash-scheme", *scheme)
            == 0
        )
        traces.append(trace(out))
        manifest = (out / "manifest.json").read_text()
        assert (scheme[0] == "kvtrace") == ("salted" in manifest)
    assert traces[0] == traces[1] == traces[2]


def test_scheme_flags_are_checked(tiny_tokenizer, tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0)])
    assert (
        anonymize(
            tiny_tokenizer,
            [src],
            tmp_path / "o",
            "--hash-scheme",
            "vllm-sha256-cbor",
            "--vllm-none-hash",
            "abc",
        )
        == 2
    )
    assert "64 hex digits" in capsys.readouterr().err
    assert (
        main(
            [
                "anonymize",
                "--input",
                str(src),
                "--output",
                str(tmp_path / "o"),
                "--tokenizer",
                tiny_tokenizer,
                "--vllm-hash-seed",
                "1",
            ]
        )
        == 2
    )


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_emitted_block_hashes_are_the_same_from_both_engines(tiny_tokenizer, tmp_path):
    rows = [chat(i, 1000 * i, session=f"s{i % 2}", rotate=i % 3) for i in range(10)]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    tables = []
    for engine in ("local", "beam"):
        out = tmp_path / engine
        assert (
            anonymize(
                tiny_tokenizer,
                [src],
                out,
                "--block-size",
                "4",
                "--hash-scheme",
                "dynamo",
                "--emit-block-hashes",
                "--engine",
                engine,
            )
            == 0
        )
        tables.append(
            pq.read_table(
                tmp_path / f"{engine}-block-hashes" / "block-hashes-00000-of-00001.parquet"
            )
        )
        published = trace(out)
        by_row = tables[-1].to_pylist()
        # Each (row, position) names the published id of that block.
        assert [r["id"] for r in by_row] == [i for row in published for i in row["hash_ids"]]
    assert tables[0].equals(tables[1])


@pytest.mark.slow
def test_a_map_of_raw_engine_hashes_and_one_of_keyed_ones_are_never_mixed(
    tiny_tokenizer, tmp_path, capsys
):
    """A map keeps keys: under an engine scheme they are keyed by the salt, the raw engine hashes
    kept only by a run that writes them out (--emit-block-hashes), whose map, like every map an
    engine scheme built before keying, holds raw hashes. The two identities differ, so a night of
    one kind refuses a map of the other in one line saying what to do; the published ids are
    the same either way."""
    (tmp_path / "salt").write_bytes(MAP_SALT)
    night = [map_night(tmp_path, 0)]
    flags = ["--salt-file", str(tmp_path / "salt"), "--hash-scheme", "dynamo", "--quiet"]
    raw = ["--id-map", str(tmp_path / "raw"), "--emit-block-hashes", str(tmp_path / "hashes")]
    assert anonymize_night(tiny_tokenizer, night, tmp_path / "a", *flags, *raw) == 0
    keyed = ["--id-map", str(tmp_path / "keyed")]
    assert anonymize_night(tiny_tokenizer, night, tmp_path / "b", *flags, *keyed) == 0
    assert trace(tmp_path / "a") == trace(tmp_path / "b")
    capsys.readouterr()
    code = anonymize_night(
        tiny_tokenizer, [map_night(tmp_path, 1)], tmp_path / "c", *flags, "--id-map", raw[1]
    )
    said = capsys.readouterr().err.strip()
    assert code != 0 and len(said.splitlines()) == 1, said
    assert "+salt-keyed" in said and "start a new map" in said and not (tmp_path / "c").exists()
