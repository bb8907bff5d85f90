"""The presets that ship with kvtrace (configs/: one per model, one per environment, and
configs/models/: what a model's KV cache costs per token), found wherever kvtrace runs from: the
source tree, an editable install, or a wheel (which carries them as kvtrace/configs)."""

from __future__ import annotations

from pathlib import Path

from kvtrace.config import load_bounded_yaml

_HERE = Path(__file__).resolve().parent
# A model preset's sizes, each a whole number from 1 to its bound: far above any model's (those
# shipped: at most 80 layers, 8 KV heads of 128, a 512 latent) and small enough that their
# product stays an ordinary number of bytes.
MODEL_SIZE_BOUNDS = {
    "layers": 1 << 12,
    "kv_heads": 1 << 12,
    "head_dim": 1 << 14,
    "kv_lora_rank": 1 << 16,
    "qk_rope_head_dim": 1 << 14,
}
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
    if (
        Path(name_or_path).is_file()
        or "/" in name_or_path
        or name_or_path.endswith((".yaml", ".yml"))
    ):
        return name_or_path
    shipped = folder() / f"{name_or_path}.yaml"
    if not shipped.is_file():
        raise FileNotFoundError(
            f"--config {name_or_path}: no such file, nor a preset kvtrace "
            f"ships ({', '.join(environments())})"
        )
    return str(shipped)


def load_model(name_or_path: str) -> dict:
    """A model preset by YAML path, or by the name of one kvtrace ships."""
    path = Path(name_or_path)
    if not path.is_file():
        path = folder() / "models" / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ValueError(
            f"--model {name_or_path}: no such preset; give a YAML file's path or "
            f"one of {', '.join(models())} (kvtrace simulate --list-models)"
        )
    preset = load_bounded_yaml(str(path), "--model") or {}
    if not isinstance(preset, dict):
        raise ValueError(f"model preset {path}: expected a mapping")
    for key, bound in MODEL_SIZE_BOUNDS.items():
        value = preset.get(key)
        if value is not None and (type(value) is not int or not 1 <= value <= bound):
            raise ValueError(
                f"model preset {path}: {key} must be a whole number from 1 to "
                f"{bound}, not {value!r}"[:300]
            )
    return preset
