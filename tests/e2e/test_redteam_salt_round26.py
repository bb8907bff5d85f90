"""Red team round 26, determinism and the salt: reproducers of holes left after the
twenty-fifth round's fixes (one salt for one map, a salt read alike however it is given, the
same input and config giving the same bytes). Each asserts the promised behaviour and fails
today (2026-11-28)."""

from __future__ import annotations

import shutil

import pyarrow.parquet as pq
import pytest

from helpers import MAP_SALT, anonymize_night, map_night, trace, write_jsonl

pytestmark = pytest.mark.slow


def test_a_rolled_back_map_is_refused_when_its_salt_file_is_named_through_a_link(
    tiny_tokenizer, tmp_path, capsys
):
    """Promise (docs/ID_MAP.md, Rollback: 'a rolled-back map is refused'; the marks are 'by
    default SALT_FILE.id-map-marks/ beside a salt file', named by the map's id so 'every
    spelling of the map ... meets the same mark'). The default folder of marks is the salt
    file's path as spelled plus `.id-map-marks` (anchor.marks_folder), and a map whose mark
    that folder lacks is extended with no check (anchor.check_anchor: `if mark is not None`).
    So the same salt file named through a link (a config's /etc/kvtrace/salt pointing at the
    secret's mount, a salt moved and linked back) anchors nowhere: a map restored from a
    backup one night old is extended, and the night publishes for its new prefixes the ids
    that the night rolled back already published for others (two prefixes, one id, across
    published nights). Promised: refused in one line, the map not extended and nothing
    published, as it is under the salt file's own name."""
    secret, linked = tmp_path / "secret", tmp_path / "etc"
    secret.mkdir()
    linked.mkdir()
    (secret / "salt").write_bytes(MAP_SALT)
    (linked / "salt").symlink_to(secret / "salt")
    common = ["--id-map", str(tmp_path / "map"), "--quiet"]
    salt = ["--salt-file", str(secret / "salt")]
    night0 = map_night(tmp_path, 0)
    assert anonymize_night(tiny_tokenizer, [night0], tmp_path / "out0", *common, *salt) == 0
    shutil.copytree(tmp_path / "map", tmp_path / "backup")
    night1 = map_night(tmp_path, 1)
    assert anonymize_night(tiny_tokenizer, [night1], tmp_path / "out1", *common, *salt) == 0
    shutil.rmtree(tmp_path / "map")
    shutil.copytree(tmp_path / "backup", tmp_path / "map")  # rolled back to version 1
    capsys.readouterr()
    out = tmp_path / "out2"
    through_link = ["--salt-file", str(linked / "salt")]
    code = anonymize_night(tiny_tokenizer, [map_night(tmp_path, 2)], out, *common, *through_link)
    published = trace(out) if out.exists() else []
    assert (code, published) == (1, []), [row["hash_ids"] for row in published]
    assert "rolled back" in capsys.readouterr().err


def test_a_leaked_id_map_confirms_no_guessed_prompt_without_the_salt_under_an_engine_scheme(
    tiny_tokenizer, tmp_path
):
    """Promise (docs/REPLAY.md: the dictionary attack 'finds nothing in a leaked id map of keyed
    hashes without the salt'; docs/NIGHTLY.md: a segment's `hi`, `lo` are 'the keyed 128-bit
    hash'; docs/PRIVACY.md: the map holds keyed hashes, and leaking the salt is what 'lets
    whoever holds the map test guesses of prompts'). Under `--hash-scheme dynamo` (or
    vllm-sha256-cbor) a night on an id map stores each block's engine hash as it is, unkeyed
    (schemes.HashScheme.block_keys: the 64-bit hash twice, hi == lo), and nothing warns: the
    map's salt keys its MAC only. Whoever holds a copy of the map (a backup bucket) and the
    public tokenizer confirms a guessed prompt block by block, no salt needed. Promised: the
    map's keys keyed by the salt under every scheme (as a capture's engine hashes are re-keyed,
    encode/captures.rekeyed), so the attack finds nothing without it."""
    from kvtrace.transforms.encode.blocks import token_bytes
    from kvtrace.transforms.encode.schemes import HashScheme
    from kvtrace.transforms.encode.tokenize import encode_texts, load_tokenizer

    secret = "What is the capital of Finland ? The capital of Finland is Helsinki ."
    log = write_jsonl(
        tmp_path / "in.jsonl", [{"timestamp": 0, "prompt": secret, "output_length": 3}]
    )
    (tmp_path / "salt").write_bytes(MAP_SALT)
    flags = ["--salt-file", str(tmp_path / "salt"), "--id-map", str(tmp_path / "map")]
    flags += ["--hash-scheme", "dynamo", "--quiet"]
    assert anonymize_night(tiny_tokenizer, [log], tmp_path / "out", *flags) == 0
    stored = set()
    for segment in (tmp_path / "map").rglob("*.parquet"):  # read as an attacker would
        table = pq.read_table(segment)
        stored |= set(table["hi"].to_pylist()) | set(table["lo"].to_pylist())
    assert stored
    # The attacker's guess: the public tokenizer, the engine's public hash, no salt.
    data = token_bytes(encode_texts(load_tokenizer(tiny_tokenizer), [secret])[0])
    keys = HashScheme("dynamo", raw=True).block_keys(data, 4, b"")
    guessed = {int.from_bytes(keys[i : i + 8], "little") for i in range(0, len(keys), 16)}
    assert guessed
    assert not guessed & stored


def test_one_salt_file_is_one_salt_as_a_file_and_as_the_environment_deploy_gives_it(
    tiny_tokenizer, tmp_path, monkeypatch, capsys
):
    """Promise (docs/ANONYMIZE.md: the salt from `--salt-file`, `--salt-secret` or
    `$KVTRACE_SALT`; docs/NIGHTLY.md and deploy/flink/flink-session.yaml: keep it in a
    Kubernetes Secret made `--from-file=salt=./salt` and exposed as KVTRACE_SALT; an id map
    needs the same salt every night). A salt file as `head -c 32 /dev/urandom | base64 > salt`
    writes it ends in a newline; `--salt-file` and `--salt-secret` strip it
    (salt.SaltSource._fetch: `.strip()`), `$KVTRACE_SALT` keeps it (a Secret's env value is
    the file's bytes). So the one secret is two salts: the map its nights built with the file
    is refused by the deploy that reads it from the environment ('its MAC does not verify with
    this run's salt: either the salt is not the map's ... or the map was damaged or altered'),
    and a night the deploy published cannot be audited with the file. Promised: one secret,
    one salt, whichever way it is given (or the difference named, never a damaged map)."""
    salt = tmp_path / "salt"
    salt.write_bytes(b"a2V5ZWQtbWFwLXRlc3Qtc2FsdC1vZi0zMi1ieXRlcyE=\n")
    common = ["--id-map", str(tmp_path / "map"), "--quiet"]
    night0 = map_night(tmp_path, 0)
    flags = [*common, "--salt-file", str(salt)]
    assert anonymize_night(tiny_tokenizer, [night0], tmp_path / "out0", *flags) == 0
    monkeypatch.setenv("KVTRACE_SALT", salt.read_text())  # as a Secret's env gives the file
    flags = [*common, "--id-map-marks", f"{salt}.id-map-marks"]
    capsys.readouterr()
    code = anonymize_night(tiny_tokenizer, [map_night(tmp_path, 1)], tmp_path / "out1", *flags)
    said = capsys.readouterr().err
    assert code == 0 or not {"damaged", "altered"} & set(said.split()), said[-600:]


def test_a_salt_of_random_bytes_in_the_environment_is_read_as_its_bytes(
    tiny_tokenizer, tmp_path, monkeypatch, capsys
):
    """The same cause, its other face: `$KVTRACE_SALT` is read as text and encoded as strict
    UTF-8 (salt.SaltSource._fetch: `value.encode()`), where `--salt-file` reads bytes. A
    Secret of random bytes (`head -c 32 /dev/urandom > salt`, the file a `--salt-file` takes
    as it is) exposed as the variable stops every run with `error: 'utf-8' codec can't encode
    characters in position 0-1: surrogates not allowed`, naming neither the salt nor where it
    came from. Promised: the variable's bytes are the salt, as the file's are (or a one-line
    error naming $KVTRACE_SALT)."""
    monkeypatch.setenv("KVTRACE_SALT", "\udcff\udcfe" + "random-bytes-of-a-salt-0123456789")
    capsys.readouterr()
    code = anonymize_night(tiny_tokenizer, [map_night(tmp_path, 0)], tmp_path / "out", "--quiet")
    said = capsys.readouterr().err
    assert code == 0 or "KVTRACE_SALT" in said, said[-400:]
