"""A salt file rotated after the launcher read it (a Kubernetes Secret updated mid-run): the
engine's workers load the salt again, and take only the run's (salt.SaltSource.pinned), so the
night publishes nothing and says why in one line, rather than number prefixes under another
salt; an id map's night is refused the same way, not as an altered mark.

The rotation is made where the launcher hands the run to its engine (_run_anonymize: after
every launch check, before any worker loads): no timing."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import MAP_SALT, anonymize_night, map_night

ROTATED = b"r" * 32
REFUSED = "is not the one this run began with"
ENGINES = {
    "local": ("--engine", "local", "--processes", "1"),  # its worker forked from the launcher
    "clean-workers": ("--engine", "local", "--processes", "2"),  # each loads the salt itself
    "beam": pytest.param(("--engine", "beam"), marks=pytest.mark.beam),  # in the CLI's child
}


def _engine(monkeypatch, engine: tuple[str, ...]) -> tuple[str, ...]:
    """engine's flags; the local engine's workers started clean (as where a fork is unsafe)
    when it has more than one."""
    if engine[-1] == "2":
        from kvtrace.pipelines import local_workers

        monkeypatch.setattr(local_workers, "can_fork", lambda: False)
    return engine


def _rotated_at_launch(monkeypatch, salt: Path) -> None:
    """The salt file replaced as the launcher hands the run to its engine."""
    from kvtrace.commands import anonymize

    run = anonymize._run_anonymize

    def rotating(*args, **kwargs):
        salt.write_bytes(ROTATED)
        return run(*args, **kwargs)

    monkeypatch.setattr(anonymize, "_run_anonymize", rotating)


def _refused(said: str) -> None:
    errors = [line for line in said.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and REFUSED in errors[0], said[-2000:]
    assert "--salt-file" in errors[0] and "altered" not in said and "Traceback" not in said


@pytest.mark.parametrize("engine", ENGINES.values(), ids=ENGINES.keys())
def test_a_salt_rotated_after_launch_publishes_nothing(
    tiny_tokenizer, tmp_path, monkeypatch, capsys, engine
):
    salt = tmp_path / "salt"
    salt.write_bytes(MAP_SALT)
    _rotated_at_launch(monkeypatch, salt)
    out = tmp_path / "out"
    flags = [*_engine(monkeypatch, engine), "--salt-file", str(salt)]
    code = anonymize_night(tiny_tokenizer, [map_night(tmp_path, 0)], out, *flags)
    assert code == 1
    _refused(capsys.readouterr().err)
    assert not out.exists()


@pytest.mark.parametrize("engine", ENGINES.values(), ids=ENGINES.keys())
def test_an_id_maps_night_under_a_rotated_salt_commits_nothing(
    tiny_tokenizer, tmp_path, monkeypatch, capsys, engine
):
    """The map's first night under the run's salt; the second's salt rotated after launch is
    refused as a salt that is not the run's (never 'the mark was altered'), the map left at
    its first version."""
    salt = tmp_path / "salt"
    salt.write_bytes(MAP_SALT)
    flags = [*_engine(monkeypatch, engine), "--salt-file", str(salt), "--quiet"]
    flags += ["--id-map", str(tmp_path / "map")]
    assert anonymize_night(tiny_tokenizer, [map_night(tmp_path, 0)], tmp_path / "out0", *flags) == 0
    capsys.readouterr()
    _rotated_at_launch(monkeypatch, salt)
    out = tmp_path / "out1"
    assert anonymize_night(tiny_tokenizer, [map_night(tmp_path, 1)], out, *flags) == 1
    _refused(capsys.readouterr().err)
    assert not out.exists()
    versions = sorted(p.name for p in (tmp_path / "map" / "versions").iterdir())
    assert versions == ["000001.json"], versions
