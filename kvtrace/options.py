"""Checks that run before any work: flags Beam does not know either, and output, dead-letter,
input and id-map locations that would overwrite or publish one another."""

from __future__ import annotations

import argparse
import difflib
import glob
import importlib
import os
import posixpath
from collections.abc import Iterable, Sequence

from transforms.errors import ConfigError
from transforms.storage import is_url

# Modules that define Beam options classes the core options module does not (runner options);
# each is imported when present so that its flags count as known.
_BEAM_OPTION_MODULES = (
    "apache_beam.options.pipeline_options",
    "apache_beam.runners.portability.flink_runner",
    "apache_beam.runners.portability.spark_runner",
    "apache_beam.runners.portability.prism_runner",
    "pipelines.runner",  # kvtrace's declaration of the Flink runner's checkpointing option
)


def beam_option_names() -> set[str]:
    """Every --flag some Beam PipelineOptions class declares."""
    from apache_beam.options.pipeline_options import PipelineOptions

    for module in _BEAM_OPTION_MODULES:
        try:
            importlib.import_module(module)
        except ImportError:
            continue
    names: set[str] = set()
    classes = list(PipelineOptions.__subclasses__())
    while classes:
        cls = classes.pop()
        classes.extend(cls.__subclasses__())
        parser = argparse.ArgumentParser(add_help=False, conflict_handler="resolve")
        try:
            cls._add_argparse_args(parser)
        except (argparse.ArgumentError, TypeError, ValueError):
            continue
        names.update(o for action in parser._actions for o in action.option_strings)
    return names


def check_beam_flags(flags: Sequence[str], our_flags: Iterable[str]) -> None:
    """Refuse flags that neither kvtrace nor any Beam options class knows, and words that are
    no flag's value (Beam would silently drop both), suggesting the closest known spelling."""
    given = [f.split("=", 1)[0] for f in flags if f.startswith("--")]
    if not given:
        refuse_stray_words(flags)
        return
    beam_names = beam_option_names()
    unknown = [name for name in given if name not in beam_names]
    if not unknown:
        refuse_stray_words(_left_by_beam(flags))
        return
    candidates = sorted(set(our_flags) | beam_names)
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.75)
        hints.append(f"{name} (did you mean {close[0]}?)" if close else name)
    raise ConfigError(f"unknown option(s): {', '.join(hints)}; see kvtrace COMMAND --help")


def _left_by_beam(flags: Sequence[str]) -> list[str]:
    """What Beam's own parser takes from flags as no option's value (it drops those)."""
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)
    return parser.parse_known_args(list(flags))[1]


def refuse_stray_words(words: Sequence[str]) -> None:
    """A word left over by every parser was read by none: a shell-expanded glob given to an
    option that takes one value, say. Refused rather than dropped."""
    stray = [word for word in words if not word.startswith("-")]
    if stray:
        raise ConfigError(f"unexpected argument(s) {' '.join(stray[:3])}"
                          f"{' ...' if len(stray) > 3 else ''}: no option takes them (an "
                          f"unquoted glob the shell expanded? quote it: --input 'logs/*.jsonl')")


def normalized(location: str) -> str:
    """A location compared by what it names: an absolute, resolved local path, or a URL with
    its path normalized and no trailing slash."""
    if is_url(location):
        scheme, rest = location.split("://", 1)
        return f"{scheme.lower()}://{posixpath.normpath('/' + rest).lstrip('/')}"
    return os.path.realpath(os.path.abspath(os.path.expanduser(location)))


def inside(path: str, folder: str) -> bool:
    """Whether path is folder or lies beneath it (both normalized)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def check_locations(
    outputs: dict[str, str], input_patterns: Sequence[str], input_files: Sequence[str]
) -> None:
    """outputs: flag name -> location (--output, --dead-letter, --id-map). None may lie inside
    another; no input file may lie inside any of them; none may be the folder an input pattern
    reads (nor lie under it, for a recursive ** pattern), or the next run would read them."""
    for flag, where in outputs.items():  # each is a folder: a file in its place is a mistake
        if where and not is_url(where) and os.path.exists(where) and not os.path.isdir(where):
            raise ConfigError(f"{flag} {where} is a file; it names a folder")
    places = {flag: normalized(where) for flag, where in outputs.items() if where}
    flags = list(places)
    for i, first in enumerate(flags):
        for second in flags[i + 1:]:
            a, b = places[first], places[second]
            if inside(a, b) or inside(b, a):
                raise ConfigError(f"{first} {outputs[first]} and {second} {outputs[second]} "
                                  "overlap: give each its own location, neither inside the other")
    for path in input_files:
        where = normalized(path)
        for flag, place in places.items():
            if inside(where, place):
                raise ConfigError(f"input {path} lies inside {flag} {outputs[flag]}")
    for pattern in input_patterns:
        folder = normalized(_static_folder(pattern))
        for flag, place in places.items():
            if place == folder or ("**" in pattern and inside(place, folder)):
                raise ConfigError(f"{flag} {outputs[flag]} is the folder input {pattern} reads; "
                                  f"write elsewhere, or the next run would read its own output")


def _static_folder(pattern: str) -> str:
    """The folder a path or glob reads from: the part before the first wildcard's segment."""
    if not glob.has_magic(pattern):
        return posixpath.dirname(pattern.rstrip("/")) or "."
    head = pattern[: min(pattern.find(c) for c in "*?[" if c in pattern)]
    return head.rsplit("/", 1)[0] if "/" in head else "."


DURATION_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str, flag: str) -> int:
    """A duration such as 500ms, 30s, 10m, 1h or 1d, in milliseconds."""
    value = str(text).strip().lower()
    for unit in sorted(DURATION_UNITS_MS, key=len, reverse=True):
        number = value[:-len(unit)]
        if value.endswith(unit) and number.isdigit():
            return int(number) * DURATION_UNITS_MS[unit]
    raise ConfigError(f"{flag} takes a duration such as 30s, 10m or 1h, not {text!r}")
