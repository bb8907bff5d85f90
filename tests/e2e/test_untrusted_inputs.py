"""Tokenizer folders and chat templates are data, never code: no trust_remote_code, and a
template reaching for Python internals stops the job with a clear error instead of running."""

from __future__ import annotations

import json
import shutil

import pytest

from helpers import anonymize, chat, write_jsonl

HOSTILE = "{{ ''.__class__.__mro__[1].__subclasses__() }}{{ messages[0].content }}"


@pytest.mark.parametrize("engine", ["local", pytest.param("beam", marks=pytest.mark.beam)])
def test_a_template_reaching_for_python_internals_stops_the_job(
    tiny_tokenizer, tmp_path, capsys, engine
):
    """On Beam the encoding step's refusal is an output its job finishes with, raised by the
    launcher: the same one line."""
    folder = tmp_path / "hostile"
    shutil.copytree(tiny_tokenizer, folder)
    (folder / "chat_template.jinja").write_text(HOSTILE)
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0), chat(1, 10)])
    code = anonymize(str(folder), [src], tmp_path / "out", "--block-size", "4", "--engine", engine)
    assert code == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("error: the chat template tried to reach Python")
    assert "Traceback" not in err
    assert not list((tmp_path / "out").glob("trace-*"))


def test_a_tokenizer_that_needs_its_own_code_is_refused_unrun(tiny_tokenizer, tmp_path, capsys):
    folder = tmp_path / "remote-code"
    shutil.copytree(tiny_tokenizer, folder)
    (folder / "tokenizer.json").unlink()  # so AutoTokenizer, not our loader, reads the folder
    marker = tmp_path / "ran"
    (folder / "custom_tokenizer.py").write_text(
        f"open({str(marker)!r}, 'w').write('code from the tokenizer folder ran')\n"
        "from transformers import PreTrainedTokenizerFast\n"
        "class CustomTokenizer(PreTrainedTokenizerFast):\n    pass\n"
    )
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": [None, "custom_tokenizer.CustomTokenizer"]}
    config["tokenizer_class"] = "CustomTokenizer"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0)])
    assert anonymize(str(folder), [src], tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "trust_remote_code" in err and "Traceback" not in err
    assert not marker.exists()
