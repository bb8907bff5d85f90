"""YAML presets merged under command-line flags.

A preset is a mapping of option names (as on the command line, with - or _) to values, plus an
optional `beam:` mapping of Beam pipeline options. Later files override earlier ones; flags given
on the command line override every file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

BEAM_SECTION = "beam"


class ConfigError(ValueError):
    """A config file that cannot be used; the message says which and why."""


def load_presets(paths: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(kvtrace options, Beam options) merged from the files in order."""
    options: dict[str, Any] = {}
    beam_options: dict[str, Any] = {}
    for path in paths:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as err:
            raise ConfigError(f"--config {path}: {err.strerror}") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"--config {path}: not valid YAML ({err})") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"--config {path}: expected a mapping of option names to values")
        beam_part = loaded.pop(BEAM_SECTION, None) or {}
        if not isinstance(beam_part, dict):
            raise ConfigError(f"--config {path}: `{BEAM_SECTION}:` must be a mapping")
        options.update({key.replace("-", "_"): value for key, value in loaded.items()})
        beam_options.update(beam_part)
    return options, beam_options


def beam_flags(beam_options: dict[str, Any]) -> list[str]:
    """Beam options from a preset as command-line flags, for PipelineOptions to parse."""
    flags = []
    for name, value in beam_options.items():
        if value is True:
            flags.append(f"--{name}")
        elif value not in (None, False):
            flags.append(f"--{name}={value}")
    return flags
