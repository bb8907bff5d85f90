"""Checks that run before any work: flags Beam does not know either, words no option read, and
durations. Locations are checked by transforms/write/publish.plan_locations."""

from __future__ import annotations

import argparse
import difflib
import importlib
from collections.abc import Iterable, Sequence

from kvtrace.transforms.errors import ConfigError

# Modules that define Beam options classes the core options module does not (runner options);
# each is imported when present so that its flags count as known.
_BEAM_OPTION_MODULES = (
    "apache_beam.options.pipeline_options",
    "apache_beam.runners.portability.flink_runner",
    "apache_beam.runners.portability.spark_runner",
    "apache_beam.runners.portability.prism_runner",
    "kvtrace.pipelines.runner",  # kvtrace's declaration of the Flink runner's checkpointing option
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
    given = [f.split("=", 1)[0] for f in flags if _is_flag(f)]
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
        if close == [name]:  # kvtrace's own, of other commands (export's --overwrite)
            hints.append(f"{name} (not an option of this command)")
        else:
            hints.append(f"{name} (did you mean {close[0]}?)" if close else name)
    raise ConfigError(f"unknown option(s): {', '.join(hints)}; see kvtrace COMMAND --help")


def _is_flag(word: str) -> bool:
    """--name or -x: Beam has no short options, so -x is a flag nobody knows (-5 is a value)."""
    return word.startswith("--") or (len(word) > 1 and word[0] == "-" and not word[1].isdigit())


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
        raise ConfigError(
            f"unexpected argument(s) {' '.join(stray[:3])}"
            f"{' ...' if len(stray) > 3 else ''}: no option takes them (an "
            f"unquoted glob the shell expanded? quote it: --input 'logs/*.jsonl')"
        )


DURATION_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str, flag: str) -> int:
    """A duration such as 500ms, 30s, 10m, 1h or 1d, in milliseconds."""
    value = str(text).strip().lower()
    for unit in sorted(DURATION_UNITS_MS, key=len, reverse=True):
        number = value[: -len(unit)]
        if value.endswith(unit) and number.isdigit():
            return int(number) * DURATION_UNITS_MS[unit]
    raise ConfigError(f"{flag} takes a duration such as 30s, 10m or 1h, not {text!r}")
