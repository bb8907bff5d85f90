"""A tokenizer's identity is the files kvtrace loads from its folder: each a regular file within
its bound, read once, hashed from the bytes loaded; nothing else in the folder is read or named."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.encode.fast_tokenizer import (
    CONFIG_FILE,
    MAX_EXTRA_TEMPLATES,
    MAX_FILE_BYTES,
    TOKENIZER_FILE,
    FastTokenizer,
    read_tokenizer_files,
)
from kvtrace.transforms.encode.regular_files import UnfitFile, read_regular_file
from kvtrace.transforms.encode.tokenize import (
    TOKENIZER_FILES,
    is_tokenizer_file_key,
    tokenizer_sha256,
)

# Bound on a refusal that must not wait on the file (a FIFO, a device): far above its ~1 s.
REFUSAL_S = 60


@pytest.fixture
def folder(tiny_tokenizer, tmp_path) -> Path:
    copy = tmp_path / "tok"
    shutil.copytree(tiny_tokenizer, copy)
    return copy


def test_the_manifest_names_exactly_the_files_loaded(folder):
    (folder / ".env").write_text("API_KEY=secret\n")
    (folder / "customer-contract.txt").write_text("confidential")
    (folder / "vocab.txt").write_text("a\nb\n")
    (folder / "notes.json").write_text("{}")
    sha256 = tokenizer_sha256(str(folder))
    assert set(sha256) == {name for name in TOKENIZER_FILES if (folder / name).exists()}
    assert TOKENIZER_FILE in sha256 and CONFIG_FILE in sha256
    assert all(is_tokenizer_file_key(key) for key in sha256)
    for key, digest in sha256.items():
        assert digest == hashlib.sha256((folder / key).read_bytes()).hexdigest()


def test_the_hash_is_of_the_bytes_loaded_not_of_the_folder_later(folder):
    files = read_tokenizer_files(folder)
    (folder / "chat_template.jinja").write_text("SWAPPED")  # after the read, before the load
    tokenizer = FastTokenizer.from_files(files)
    assert tokenizer.chat_template != "SWAPPED"
    assert (
        tokenizer.files_sha256["chat_template.jinja"]
        == hashlib.sha256(files["chat_template.jinja"]).hexdigest()
    )


def test_named_templates_are_keyed_by_their_folder(folder):
    (folder / "additional_chat_templates").mkdir()
    (folder / "additional_chat_templates" / "tool_use.jinja").write_text("T")
    (folder / "additional_chat_templates" / "README.md").write_text("not read")
    sha256 = FastTokenizer.from_directory(folder).files_sha256
    assert "additional_chat_templates/tool_use.jinja" in sha256
    assert all(is_tokenizer_file_key(key) for key in sha256)
    assert not is_tokenizer_file_key("additional_chat_templates/README.md")
    assert not is_tokenizer_file_key(".env")


def test_a_symlink_to_a_regular_file_is_followed(folder, tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    (folder / TOKENIZER_FILE).rename(elsewhere)
    (folder / TOKENIZER_FILE).symlink_to(elsewhere)
    assert (
        FastTokenizer.from_directory(folder).files_sha256[TOKENIZER_FILE]
        == hashlib.sha256(elsewhere.read_bytes()).hexdigest()
    )


def _refusal(folder: Path) -> subprocess.CompletedProcess:
    """Loading folder in a child process, which a hang cannot take the test down with."""
    code = (
        "from pathlib import Path\nfrom kvtrace.transforms.encode.fast_tokenizer import FastTokenizer\n"
        f"FastTokenizer.from_directory(Path({str(folder)!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=REFUSAL_S,
        cwd=Path(__file__).resolve().parents[3],
    )


@pytest.mark.parametrize("make", ["fifo", "dev_zero", "dangling"])
def test_a_special_file_is_refused_without_being_read(folder, make):
    target = folder / CONFIG_FILE
    target.unlink()
    if make == "fifo":
        os.mkfifo(target)  # opened for reading, it would block until a writer came
    elif make == "dev_zero":
        target.symlink_to("/dev/zero")  # read whole, it would fill memory
    else:
        target.symlink_to(folder / "missing")
    result = _refusal(folder)
    assert result.returncode == 1
    assert "UnfitFile" in result.stderr
    assert ("not a regular file" if make != "dangling" else "link to nothing") in result.stderr


def test_a_file_over_its_bound_is_refused_before_it_is_read(folder):
    with open(folder / TOKENIZER_FILE, "r+b") as handle:  # sparse: no disk, no time
        handle.truncate(MAX_FILE_BYTES[TOKENIZER_FILE] + 1)
    with pytest.raises(UnfitFile, match="over the"):
        read_tokenizer_files(folder)


def test_the_template_folder_listing_is_bounded(folder):
    extra = folder / "additional_chat_templates"
    extra.mkdir()
    for i in range(MAX_EXTRA_TEMPLATES + 1):
        (extra / f"stray-{i}").write_text("")
    with pytest.raises(UnfitFile, match="entries"):
        read_tokenizer_files(folder)


def test_a_template_name_outside_the_vocabulary_is_refused(folder):
    (folder / "additional_chat_templates").mkdir()
    (folder / "additional_chat_templates" / "a b.jinja").write_text("T")
    with pytest.raises(UnfitFile, match="template name"):
        read_tokenizer_files(folder)


def test_read_regular_file_reads_within_its_bound(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert read_regular_file(path, 10) == b"x" * 10
    with pytest.raises(UnfitFile):
        read_regular_file(path, 9)
    with pytest.raises(UnfitFile, match="not a regular file"):
        read_regular_file(tmp_path, 10)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
KEYS = st.sampled_from(["chat_template", "eos_token", "bos_token", "pad_token", "x"])


@settings(max_examples=30, deadline=None)
@given(config=st.dictionaries(KEYS, JSON, max_size=4) | JSON, raw=st.binary(max_size=40))
def test_any_tokenizer_config_loads_or_is_one_line_error(tiny_tokenizer, config, raw):
    """A config of any JSON shape, or any bytes, loads or is a ValueError of one line."""
    files = read_tokenizer_files(Path(tiny_tokenizer))
    files.pop("chat_template.jinja", None)  # so the config's chat_template is read
    for data in (json.dumps(config).encode(), raw):
        try:
            FastTokenizer.from_files({**files, CONFIG_FILE: data})
        except ValueError as err:
            assert "\n" not in str(err) and str(err).startswith(CONFIG_FILE)


def test_a_worker_refuses_tokenizer_files_other_than_the_runs(tiny_tokenizer):
    from kvtrace.transforms.encode.tokenize import checked_tokenizer, load_tokenizer
    from kvtrace.transforms.errors import JobStopped

    began = dict(load_tokenizer(tiny_tokenizer).files_sha256)
    assert checked_tokenizer(tiny_tokenizer, began).files_sha256 == began
    with pytest.raises(JobStopped, match="not the ones this run began with"):
        checked_tokenizer(tiny_tokenizer, {**began, "tokenizer.json": "0" * 64})
