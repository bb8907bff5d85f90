"""anonymize and audit agree on which template kwargs need a persistent salt
(write/manifest.template_kwargs_keyed): kwargs published keyed by the salt are refused under a
random one before any work, as audit could never confirm them; kwargs that key nothing need none
on either side."""

from __future__ import annotations

from helpers import anonymize, chat, main, write_jsonl


def test_keyed_kwargs_under_a_random_salt_are_refused_before_the_work(
    tiny_tokenizer, tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv("KVTRACE_SALT", raising=False)
    log = write_jsonl(tmp_path / "night.jsonl", [chat(i, 997 * i) for i in range(3)])
    out = tmp_path / "out"
    kwargs = '{"reasoning_effort": "high"}'
    assert anonymize(tiny_tokenizer, [log], out, "--chat-template-kwargs", kwargs) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--salt-file" in err
    assert not out.exists() and not (tmp_path / "out-rejected").exists()


def test_the_audit_asks_for_the_salt_only_for_keyed_kwargs(tiny_tokenizer, tmp_path, monkeypatch):
    monkeypatch.delenv("KVTRACE_SALT", raising=False)
    log = write_jsonl(tmp_path / "night.jsonl", [chat(i, 997 * i) for i in range(3)])
    out = tmp_path / "out"
    kwargs = '{"enable_thinking": false}'
    assert anonymize(tiny_tokenizer, [log], out, "--chat-template-kwargs", kwargs) == 0
    audit = ["audit", str(out), "--tokenizer", tiny_tokenizer, "--chat-template-kwargs"]
    assert main([*audit, kwargs]) == 0
    assert main([*audit, '{"enable_thinking": "no"}']) == 2  # keyed: the run's salt is asked for
