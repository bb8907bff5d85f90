"""YAML presets merged under command-line flags, and the date templates of nightly runs.

A preset is a mapping of option names (as on the command line, with - or _) to values, plus an
optional `beam:` mapping of Beam pipeline options. Later files override earlier ones; flags given
on the command line override every file. Path options may hold {date} (YYYY-MM-DD), {yyyy},
{mm} and {dd}, filled in from --date.
"""

from __future__ import annotations

import datetime
import re
import string
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


TEMPLATED_OPTIONS = ("input", "output", "dead_letter", "id_map")
DATE_FIELDS = ("date", "yyyy", "mm", "dd")


def parse_date(text: str) -> datetime.date:
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        raise ConfigError(f"--date {text}: expected YYYY-MM-DD")
    try:
        return datetime.date.fromisoformat(text)
    except ValueError as err:
        raise ConfigError(f"--date {text}: {err}") from None


def fill_dates(options: dict[str, Any], date: datetime.date | None) -> dict[str, Any]:
    """The path options with their date placeholders filled; an error names what is missing."""
    values = {"date": date.isoformat(), "yyyy": f"{date.year:04d}", "mm": f"{date.month:02d}",
              "dd": f"{date.day:02d}"} if date else {}
    filled = dict(options)
    for name in TEMPLATED_OPTIONS:
        value = options.get(name)
        if value is None:
            continue
        filled[name] = (
            [_fill(name, v, values) for v in value] if isinstance(value, list)
            else _fill(name, value, values)
        )
    return filled


def _fill(name: str, template: str, values: dict[str, str]) -> str:
    fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    unknown = fields - set(DATE_FIELDS)
    if unknown:
        raise ConfigError(
            f"--{name.replace('_', '-')} {template}: unknown placeholder(s) "
            f"{', '.join(sorted(unknown))}; use {{{'}, {'.join(DATE_FIELDS)}}}"
        )
    if fields and not values:
        raise ConfigError(f"--{name.replace('_', '-')} {template} has a date placeholder: give --date")
    return template.format(**values)
