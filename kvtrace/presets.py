"""The presets that ship with kvtrace (configs/: one per model, one per environment, and
configs/models/: what a model's KV cache costs per token), found wherever kvtrace runs from: the
source tree, an editable install, or a wheel (which carries them as kvtrace/configs)."""

from __future__ import annotations

from pathlib import Path

import yaml

_HERE = Path(__file__).resolve().parent
# A wheel holds configs/ inside the package (pyproject's package-dir); a checkout beside it.
FOLDERS = (_HERE / "configs", _HERE.parent / "configs")


def folder() -> Path:
    for candidate in FOLDERS:
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("kvtrace's presets are missing from this installation (configs/)")


def models() -> list[str]:
    """The names of the model presets that ship with kvtrace."""
    return sorted(p.stem for p in (folder() / "models").glob("*.yaml"))


def environments() -> list[str]:
    """The names of the run presets that ship with kvtrace (--config NAME)."""
    return sorted(p.stem for p in folder().glob("*.yaml"))


def config_path(name_or_path: str) -> str:
    """A --config argument as a file: a path as given, else a shipped preset by name."""
    if Path(name_or_path).is_file() or "/" in name_or_path or name_or_path.endswith(
            (".yaml", ".yml")):
        return name_or_path
    shipped = folder() / f"{name_or_path}.yaml"
    if not shipped.is_file():
        raise FileNotFoundError(f"--config {name_or_path}: no such file, nor a preset kvtrace "
                                f"ships ({', '.join(environments())})")
    return str(shipped)


def load_model(name_or_path: str) -> dict:
    """A model preset by YAML path, or by the name of one kvtrace ships."""
    path = Path(name_or_path)
    if not path.is_file():
        path = folder() / "models" / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ValueError(f"--model {name_or_path}: no such preset; give a YAML file's path or "
                         f"one of {', '.join(models())} (kvtrace simulate --list-models)")
    preset = yaml.safe_load(path.read_text()) or {}
    if not isinstance(preset, dict):
        raise ValueError(f"model preset {path}: expected a mapping")
    return preset
