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
from collections.abc import Hashable, Sequence
from typing import Any

import yaml

from kvtrace.transforms.encode.regular_files import UnfitFile, read_regular_file
from kvtrace.transforms.errors import ConfigError

BEAM_SECTION = "beam"
# A preset is a few dozen values; anchors and aliases beyond these bounds are an alias bomb (a
# few lines that expand to billions of values), refused before anything walks them.
MAX_ALIASES = 64
MAX_VALUES = 100_000
# A preset is a few levels deep; YAML's composer recurses per level, and Python's stack ends
# near 1,000 (`a: [[[[...` would be a RecursionError, not a one-line error).
MAX_DEPTH = 32
MAX_CONFIG_BYTES = 1 << 20
# A preset's numbers are counts, sizes and fractions: a 64-bit integer is 20 digits. A longer
# numeric scalar is refused before it is built (Python builds a long integer in quadratic time).
MAX_NUMBER_CHARS = 40
INT_TAG, FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
MERGE_TAG = "tag:yaml.org,2002:merge"
# YAML 1.1's numbers without base 60 (`1:30` is the string YAML 1.2 reads, not 90): the safe
# loader builds `59:59:...` one base-60 digit at a time, a growing integer multiplied each step.
# Nor octal by a leading zero (`0100` was 64 to YAML 1.1, 100 to its reader): such a value is a
# string, refused where a number is expected, never a number other than the one written.
_NUMBERS = (
    (
        INT_TAG,
        r"""^(?:[-+]?0b[0-1_]+
        |[-+]?(?:0|[1-9][0-9_]*)
        |[-+]?0x[0-9a-fA-F_]+)$""",
        "-+0123456789",
    ),
    (
        FLOAT_TAG,
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
        |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        "-+0123456789.",
    ),
)


class _LongNumber(Exception):
    """A numeric scalar over MAX_NUMBER_CHARS: the key it is under, its length and line."""

    def __init__(self, key: str | None, node: yaml.ScalarNode):
        super().__init__(
            f"{'the document' if key is None else repr(key)} holds a number of "
            f"{len(node.value):,} characters (line "
            f"{node.start_mark.line + 1}; at most {MAX_NUMBER_CHARS})"
        )


def _without_base_60(resolvers: dict[Any, list]) -> dict[Any, list]:
    """The safe loader's implicit resolvers with _NUMBERS in place of its numbers."""
    kept = {
        first: [(tag, regexp) for tag, regexp in pairs if tag not in (INT_TAG, FLOAT_TAG)]
        for first, pairs in resolvers.items()
    }
    for tag, pattern, firsts in _NUMBERS:
        regexp = re.compile(pattern, re.X)
        for first in firsts:
            kept.setdefault(first, []).append((tag, regexp))
    return kept


class _BoundedLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing more than MAX_ALIASES aliases and nesting past MAX_DEPTH,
    reading no base-60 number and building no number over MAX_NUMBER_CHARS."""

    yaml_implicit_resolvers = _without_base_60(yaml.SafeLoader.yaml_implicit_resolvers)

    aliases = 0
    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise yaml.YAMLError(f"more than {MAX_ALIASES} aliases")
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise yaml.YAMLError(f"nested more than {MAX_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        # A key given twice would silently take its last value, where JSON documents refuse it:
        # checked on the mapping's own keys, before merge keys (<<) bring in ones it overrides.
        if isinstance(node, yaml.MappingNode):
            _check_merges(node)
            lines: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == MERGE_TAG:
                    continue
                key = self.construct_object(key_node)
                if not isinstance(key, Hashable):  # the safe loader refuses it next
                    continue
                line = key_node.start_mark.line + 1
                if key in lines:
                    raise yaml.YAMLError(
                        f"key {str(key)[:64]!r} given twice, at lines {lines[key]} and {line}"
                    )
                lines[key] = line
        return super().construct_mapping(node, deep)

    def construct_document(self, node: Any) -> Any:
        _check_numbers(node)  # every scalar, tagged implicitly or explicitly, before any is built
        return super().construct_document(node)


def _check_merges(node: yaml.MappingNode) -> None:
    """One merge key (<<) a mapping, whose merged mappings give each key once: a second `<<`, or
    a key two merged mappings both give, would silently take one value over the other (a
    mapping's own keys still override what it merges, as YAML's merge means)."""
    merges = [value for key, value in node.value if key.tag == MERGE_TAG]
    if len(merges) > 1:
        raise yaml.YAMLError(f"merge key << given twice (line {node.start_mark.line + 1})")
    merged = [
        item
        for value in merges
        for item in (value.value if isinstance(value, yaml.SequenceNode) else [value])
        if isinstance(item, yaml.MappingNode)
    ]
    given: set[str] = set()
    for mapping in merged:
        names = {key.value for key, _ in mapping.value if isinstance(key, yaml.ScalarNode)}
        if twice := sorted(names & given):
            raise yaml.YAMLError(
                f"key {twice[0][:64]!r} given twice by the mappings << merges "
                f"(line {node.start_mark.line + 1})"
            )
        given |= names


def _check_numbers(root: yaml.Node) -> None:
    """_LongNumber for the first int or float scalar over MAX_NUMBER_CHARS, named by the key it is
    under (its own, if it is a key: a mapping's keys are built too)."""
    stack: list[tuple[yaml.Node, str | None]] = [(root, None)]
    seen: set[int] = set()  # an alias is its anchor's node: walked once
    while stack:
        node, key = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            if node.tag in (INT_TAG, FLOAT_TAG) and len(node.value) > MAX_NUMBER_CHARS:
                raise _LongNumber(key, node)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, key) for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                name = (
                    key_node.value[:MAX_NUMBER_CHARS]
                    if isinstance(key_node, yaml.ScalarNode)
                    else key
                )
                stack.extend(((key_node, key), (value_node, name)))


def _one_spelling(path: str, loaded: dict[str, Any]) -> dict[str, Any]:
    """A file's options by their one name (`length-granularity` is `length_granularity`): an
    option given in both spellings is given twice, refused as a key given twice is."""
    named: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in loaded.items():
        name = key.replace("-", "_")
        if name in named:
            raise ConfigError(
                f"--config {path}: option {name} given twice (as {spelled[name]!r} and {key!r})"
            )
        named[name], spelled[name] = value, key
    return named


def _values(loaded: Any, budget: int = MAX_VALUES) -> int:
    """How many values a loaded document holds once aliases are expanded, stopping past the
    budget (an alias of an alias of ... doubles at each level)."""
    count, stack = 0, [loaded]
    while stack and count <= budget:
        node = stack.pop()
        count += 1
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count


def load_bounded_yaml(path: str, what: str) -> Any:
    """A YAML file's value, read only if it is a regular file within MAX_CONFIG_BYTES (a FIFO
    never ends, a device never stops) and only within the loader's bounds; ConfigError in one
    line, prefixed by what (the flag it came from), otherwise."""
    try:
        text = read_regular_file(path, MAX_CONFIG_BYTES)
    except UnfitFile as err:
        raise ConfigError(f"{what} {err}: not a preset") from None
    except OSError as err:
        raise ConfigError(f"{what} {path}: {err.strerror or err}") from None
    try:
        loaded = yaml.load(text, Loader=_BoundedLoader)
    # ValueError: a plain scalar YAML resolves but Python cannot build (an unquoted 2025-02-30
    # is a date to YAML), which the loader lets through
    except (yaml.YAMLError, ValueError) as err:
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"{what} {path}: not valid YAML ({first})") from None
    except _LongNumber as err:
        raise ConfigError(f"{what} {path}: {err}") from None
    if _values(loaded) > MAX_VALUES:
        raise ConfigError(f"{what} {path}: expands past {MAX_VALUES} values (an alias bomb?)")
    return loaded


def check_types(path: str, options: dict[str, Any], kinds: dict[str, str]) -> None:
    """Each preset value of the type its flag takes, strictly: a quoted "false" is a string,
    never a boolean, and a string where a number goes is an error, not a guess."""
    checks = {
        "flag": lambda v: isinstance(v, bool),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "strs": lambda v: (
            isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))
        ),
        "json": lambda v: isinstance(v, (str, dict)),
        "size": lambda v: isinstance(v, (int, str)) and not isinstance(v, bool),
        "str_or_flag": lambda v: isinstance(v, str) or v is True,
    }
    words = {
        "flag": "true or false (unquoted)",
        "int": "a whole number",
        "float": "a number",
        "str": "a string",
        "strs": "a string or a list of strings",
        "json": "a mapping (or its JSON text)",
        "size": "a size (a whole number, or 1MB, 1MiB)",
        "str_or_flag": "a path or true",
    }
    for name, value in options.items():
        kind = kinds.get(name)
        if kind and value is not None and not checks[kind](value):
            raise ConfigError(
                f"--config {path}: {name.replace('_', '-')} must be {words[kind]}, not {value!r}"[
                    :300
                ]
            )


def load_presets(
    paths: Sequence[str], kinds: dict[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(kvtrace options, Beam options) merged from the files in order; with kinds (option name
    -> "flag", "int", ...), each value's type checked (check_types)."""
    options: dict[str, Any] = {}
    beam_options: dict[str, Any] = {}
    for path in paths:
        loaded = load_bounded_yaml(path, "--config") or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"--config {path}: expected a mapping of option names to values")
        beam_part = loaded.pop(BEAM_SECTION, None) or {}
        if not isinstance(beam_part, dict):
            raise ConfigError(f"--config {path}: `{BEAM_SECTION}:` must be a mapping")
        if not all(isinstance(key, str) for key in [*loaded, *beam_part]):
            raise ConfigError(f"--config {path}: option names must be strings")
        named = _one_spelling(path, loaded)
        if kinds is not None:
            check_types(path, named, kinds)
        options.update(named)
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
# A site value deploy/render.sh fills in from deploy/values.env, left as the template names it.
UNRENDERED = re.compile(r"\$\{KVTRACE_[A-Z_]+\}")


def parse_date(text: str) -> datetime.date:
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        raise ConfigError(f"--date {text}: expected YYYY-MM-DD")
    try:
        return datetime.date.fromisoformat(text)
    except ValueError as err:
        raise ConfigError(f"--date {text}: {err}") from None


def fill_dates(options: dict[str, Any], date: datetime.date | None) -> dict[str, Any]:
    """The path options with their date placeholders filled; an error names what is missing."""
    values = (
        {
            "date": date.isoformat(),
            "yyyy": f"{date.year:04d}",
            "mm": f"{date.month:02d}",
            "dd": f"{date.day:02d}",
        }
        if date
        else {}
    )
    filled = dict(options)
    for name in TEMPLATED_OPTIONS:
        value = options.get(name)
        if value is None:
            continue
        filled[name] = (
            [_fill(name, v, values) for v in value]
            if isinstance(value, list)
            else _fill(name, value, values)
        )
    return filled


def _fill(name: str, template: str, values: dict[str, str]) -> str:
    fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    unknown = fields - set(DATE_FIELDS)
    unrendered = UNRENDERED.findall(template)
    if unrendered:
        raise ConfigError(
            f"--{name.replace('_', '-')} {template}: {', '.join(unrendered)} not filled in: this "
            f"preset is a template; render it with deploy/render.sh and give the rendered "
            f"copy (docs/deploy/DATAFLOW.md)"
        )
    if unknown:
        raise ConfigError(
            f"--{name.replace('_', '-')} {template}: unknown placeholder(s) "
            f"{', '.join(sorted(unknown))}; use {{{'}, {'.join(DATE_FIELDS)}}}"
        )
    if fields and not values:
        raise ConfigError(
            f"--{name.replace('_', '-')} {template} has a date placeholder: give --date"
        )
    return template.format(**values)
