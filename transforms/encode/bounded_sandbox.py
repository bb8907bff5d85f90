"""transformers' sandboxed Jinja environment with every value a template builds sized before it
is built.

The render watchdog (render_budget.py) stops a template between two of its Python steps; a
single step is one C call it cannot interrupt (nor can Ctrl-C: it waits for the GIL). So every
value a step makes is sized by its type family: text (str, bytes, bytearray) by its length,
integers by their bits, collections (lists, tuples, dicts, sets, a dict's views) by their
items. Where the operands tell the result's size it is sized before the call: `'x' * n`, `+`,
`~`, `join`, a render's or block's output (`concat`), `replace`, `translate`, `expandtabs`, `wordwrap`, `indent`, escaping, widths in
`%` and `format`, every operator on two integers from their bit lengths (long multiplication
and division are quadratic, in one C call), and a value printed as text by walking what it
holds (`_text_length`), in one check every step that prints a value goes through
(`_check_text`: `{{ }}`, `|string`, `|tojson`, the filters and tests that str() their value or
arguments, raise_exception's message): a type whose text its size does not tell (an object,
printed with its address) is refused, never printed to be measured. No set reaches a template
(its order is the process's hash seed's). Where only the result tells (case mapping, `hex`,
`from_bytes`), it is measured after the call, whose cost its operands bound. Calls whose cost
their result does not show are refused before: a number read from text past MAX_NUMBER_TEXT
(`|int`, `|float`, any base), rounding past MAX_ROUND_DIGITS, any integer argument past
MAX_ARGUMENT. A call that lists a value (`|list` of a string, a split) makes a new object per
item, so what one step may list is counted first too, against a bound of items (MAX_ITEMS).
`sum` adds numbers only (over lists it is one quadratic C call). Attributes, subscripts and
iteration hand out values already held. Whatever else a template does is one C call linear in
values within the bound, or a Python step the watchdog can stop.

Loaded with transformers' renderer in kvtrace's own copy of its module (template_renderer.py),
which builds this environment instead of its plain sandbox.
"""

from __future__ import annotations

import functools
import re
import string
import sys
from collections.abc import Iterable, Iterator
from itertools import chain
from typing import Any, Callable

from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.exceptions import TemplateRuntimeError, TemplateSyntaxError
from jinja2.filters import make_attrgetter
from jinja2.nodes import Add, Concat
from jinja2.runtime import Context, LoopContext, Undefined
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, _PassArg, object_type_repr

from kvtrace.transforms.encode.template_names import FILTERS, GLOBALS, TESTS, AllowedNames

# The longest string or list a template may build: 4x the longest record kvtrace reads
# (DEFAULT_MAX_RECORD_BYTES, 64 MiB), since a template may repeat what a record holds.
MAX_VALUE_LENGTH = 256 << 20
# An integer arithmetic computes (a 1,233-digit number): far past any count, length or id a chat
# template needs, and small enough that any operation on integers within it is microseconds
# (long division is quadratic in its operands' bits, and one C call).
MAX_INT_BITS = 1 << 12
MAX_ARGUMENT = 1 << 20  # an integer given to a call or filter: widths, counts, indents
# The longest text read as a number (`|int`, `|float`): a MAX_INT_BITS integer in binary, with
# room for a prefix and underscores. Parsing is one C call, quadratic in the digits for bases
# that are not powers of two; a number is read at most this long, whatever its base.
MAX_NUMBER_TEXT = 2 * MAX_INT_BITS + 8
# The most digits rounding may keep or drop (`|round(n)`): those of a MAX_INT_BITS integer.
# Python's round() of an integer to -n digits computes 10 ** n and divides by it in one call.
MAX_ROUND_DIGITS = (MAX_INT_BITS * 30103) // 100000 + 1
# The most items one step may build a sequence of (a list, the pieces of a split, a filter's
# listing of a value): an item may be a new object of ~80 bytes (a character of a string, a
# piece), so a bound on length alone would let one call build gigabytes; 1 Mi items is ~100 MB,
# and a chat template lists messages, tools and the pieces of a message, never millions.
MAX_ITEMS = 1 << 20
# What str.split() with no separator splits at, and str.splitlines() ends a line at
# (test_bounded_sandbox_bounds.py checks both against Python's own).
_WHITESPACE = (
    " \n\t\x0b\x0c\r\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
    "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_LINE_BREAKS = "\n\x0b\x0c\r\x1c\x1d\x1e\x85\u2028\u2029"
_BYTES_WHITESPACE = (b" ", b"\t", b"\n", b"\r", b"\x0b", b"\x0c")
_BYTES_LINE_BREAKS = (b"\n", b"\r")
# After a % and its mapping key: flags, width, precision and length modifier.
_PRINTF_SIZES = re.compile(r"[#0 +\-]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?")
_BYTES_PRINTF_SIZES = re.compile(_PRINTF_SIZES.pattern.encode())
_DIGITS = re.compile(r"\d+")


class ValueTooLarge(TemplateRuntimeError):
    """A template step that would build a value past its bound."""


class Unordered(TemplateRuntimeError):
    """A template step that made a set (`d.keys() - []`): its order is that of its items'
    hashes, which Python seeds anew in each process (PYTHONHASHSEED), so whatever a template
    spells from it differs by worker. The engine's own render is as seed-dependent, so no
    order is its; refusing it is the same dead letter on every run."""


# The type families a value is sized by: text by its characters or bytes, collections by their
# items (a mapping's view is its mapping's size), integers by their bits.
_TEXTS = (str, bytes, bytearray)
_KEYS_VIEW, _VALUES_VIEW, _ITEMS_VIEW = type({}.keys()), type({}.values()), type({}.items())
_COLLECTIONS = (list, tuple, dict, set, frozenset, _KEYS_VIEW, _VALUES_VIEW, _ITEMS_VIEW)
_LENGTHS = (*_TEXTS, *_COLLECTIONS)


def _sized(value: Any) -> int:
    """value's length where its type is text or a sequence: what repeating it repeats."""
    return len(value) if isinstance(value, (*_TEXTS, list, tuple)) else 0


def _checked(result: Any, what: str) -> Any:
    """result, refused if it is past its bound by the size of its type family: built in one
    call whose cost its operands bound (each within theirs), measured before the template sees
    it. Every other value has a size that no call makes grow (a float, a bool, a function)."""
    if type(result) is str:  # most results: told at once
        if len(result) > MAX_VALUE_LENGTH:
            raise ValueTooLarge(
                f"{what} built a value of {len(result)} items, over {MAX_VALUE_LENGTH}"
            )
    elif isinstance(result, int):
        if result.bit_length() > MAX_INT_BITS:
            raise ValueTooLarge(
                f"{what} built an integer of {result.bit_length()} bits, over {MAX_INT_BITS}"
            )
    elif isinstance(result, (set, frozenset)):
        raise Unordered(f"{what} built a set, whose order differs by process")
    elif isinstance(result, _LENGTHS) and len(result) > MAX_VALUE_LENGTH:
        raise ValueTooLarge(f"{what} built a value of {len(result)} items, over {MAX_VALUE_LENGTH}")
    return result


def _children(value: Any) -> Iterable[Any] | None:
    """What str() or JSON of value prints inside it, or None for a value printed whole."""
    if isinstance(value, (list, tuple, set, frozenset, _KEYS_VIEW, _VALUES_VIEW)):
        return value
    if isinstance(value, dict):
        return chain.from_iterable(value.items())  # each key, then its value
    if isinstance(value, _ITEMS_VIEW):
        # its (key, value) pairs, held while the walk runs: a pair is a new tuple each time it
        # is iterated, and the walk knows a container met again by its id
        return list(value)
    if isinstance(value, Namespace):  # printed with the dict of its attributes
        return _children(value._Namespace__attrs)  # type: ignore[attr-defined]
    return None


def _wrapper_length(value: Any) -> int:
    """What a collection's text holds beside its brackets: `dict_values(...)`, `frozenset(...)`
    name their type (a set's and a view's items are printed as a list's or a dict's are)."""
    return 0 if isinstance(value, (list, tuple, dict, Namespace)) else len(type(value).__name__) + 2


# Values printed whole by repr(), told by their exact type (most of what a walk meets): their
# text is short (an integer's at most Python's 4300 digits, past which it refuses to print).
_REPR_LEAVES = frozenset((int, float, bool, type(None)))


def _leaf_length(value: Any) -> int:
    """The length of a value printed whole, from its size, never by printing it: a string's
    characters, bytes at 4 characters a byte (`\\xff`) and their prefix, a number's digits;
    an Undefined prints as "" (or raises). Any other type is refused: its text cannot be told."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, (bytes, bytearray)):
        return 4 * len(value) + len("bytearray(b'')")
    if isinstance(value, (int, float, complex, type(None))):
        return len(repr(value))
    if isinstance(value, Undefined):
        return len("Undefined")
    if isinstance(value, range):
        return len(repr(value))  # three integers
    raise ValueTooLarge(
        f"printing a {type(value).__name__}, whose size cannot be told before it is printed"
    )


def _text_length(value: Any, indent: int = 0, limit: int | None = None) -> int:
    """The length of value as text (str(), or JSON with indent), up to the escaping of its
    strings (a fixed factor, measured afterwards), counting a value each time it is listed.
    A container met again is counted from its first walk (`[a] * n` is n steps, not n times
    a's), one met inside itself (a cycle: `{% set x.a = x %}`) as repr prints it, `[...]`, at
    once; and the walk stops once past limit: Python steps the watchdog can stop."""
    limit = MAX_VALUE_LENGTH if limit is None else limit
    children = _children(value)
    if children is None:
        return _leaf_length(value)
    # (container, depth) -> its length, and the container: kept alive, so that its id is
    # never another's (a mapping's items are tuples made as they are listed, and freed after)
    known: dict[tuple[int, int], tuple[int, Any]] = {}
    total = 2 + (indent > 0) + _wrapper_length(value)  # brackets, a newline before the last
    # per container: key, items, length, the container
    stack = [[(id(value), 0), iter(children), total, value]]
    walking = {id(value)}  # the containers on the stack: one met again in them is a cycle
    while stack and total <= limit:
        frame = stack[-1]
        depth = len(stack) if indent else 0
        # before each item: separator, newline, indent; the same closes a container
        separator = 2 + indent * depth + 1 if indent else 2
        own = frame[2]
        for item in frame[1]:
            kind = type(item)
            if kind is str:  # the common cases first, as _children would tell them
                length = separator + len(item) + 2
            elif kind in _REPR_LEAVES:
                length = separator + len(repr(item))
            else:
                inner = _children(item)
                if inner is None:
                    length = separator + _leaf_length(item) + 2 * isinstance(item, str)
                elif id(item) in walking:  # repr's recursion guard prints it as `[...]`
                    length = separator + _wrapper_length(item) + len("[...]")
                elif (id(item), depth) in known:
                    length = separator + known[id(item), depth][0]
                else:
                    wrapper = 0 if kind is dict or kind is list else _wrapper_length(item)
                    own += separator
                    total += 2 * separator + wrapper
                    stack.append([(id(item), depth), iter(inner), separator + wrapper, item])
                    walking.add(id(item))
                    break
            own += length
            total += length
            if total > limit:
                break
        else:
            stack.pop()
            walking.discard(frame[0][0])
            known[frame[0]] = (own, frame[3])
            if stack:
                stack[-1][2] += own
            continue
        frame[2] = own
    return total


def _check_text(value: Any, what: str) -> None:
    """value's text sized before anything prints it: the one check of every step that turns a
    value into text (`{{ }}`, the filters and tests that print their value, raise_exception's
    message). A type whose text its size does not tell (an object printed with its address)
    is refused here."""
    if type(value) is not str:
        _check_length(_text_length(value), what)


def _text(value: Any, what: str) -> str:
    """str(value), sized first (_check_text) and measured after (escapes)."""
    if type(value) is str:
        return value
    _check_text(value, what)
    return _checked(str(value), what)


def _check_length(length: int, what: str) -> None:
    if length > MAX_VALUE_LENGTH:
        raise ValueTooLarge(
            f"{what} would build a value of {length} items, over {MAX_VALUE_LENGTH}"
        )


def _printf_fields(template: str | bytes) -> Iterator[tuple[str, str]]:
    """(width, precision) of each conversion of a % format (str's or bytes'), read as CPython
    reads it: a mapping key in parentheses (nested ones counted), flags, width, precision,
    length."""
    text = isinstance(template, str)
    percent, opening, closing = ("%", "(", ")") if text else (b"%", b"(", b")")
    sizes = _PRINTF_SIZES if text else _BYTES_PRINTF_SIZES
    at = template.find(percent)  # type: ignore[arg-type]
    while 0 <= at < len(template) - 1:
        at += 1
        if template[at : at + 1] == opening:
            depth = 0
            while at < len(template):
                mark = template[at : at + 1]
                depth += (mark == opening) - (mark == closing)
                at += 1
                if depth == 0:
                    break
        size = sizes.match(template, at)  # type: ignore[call-overload]
        at = size.end()
        if template[at : at + 1] != percent:  # "%%" is a literal percent sign
            yield tuple(_ascii(group) for group in size.groups())  # type: ignore[misc]
        at = template.find(percent, at + 1)  # type: ignore[arg-type]


def _ascii(group: str | bytes | None) -> str:
    return "" if group is None else group if isinstance(group, str) else group.decode()


def _longest_text(values: Iterable[Any]) -> int:
    """The longest of values as text: what one format field may print of any of them."""
    return max(
        (len(value) if isinstance(value, _TEXTS) else _text_length(value) for value in values),
        default=0,
    )


def _check_printf(template: str | bytes, operand: Any = ()) -> None:
    """`template % operand` sized first: its text, and each field at its width and precision
    plus the longest value it may print (a field's width alone is bounded, their sum too)."""
    values = (
        operand.values()
        if isinstance(operand, dict)
        else operand
        if isinstance(operand, tuple)
        else (operand,)
    )
    longest, length = _longest_text(values), len(template)
    for width, precision in _printf_fields(template):
        if "*" in (width, precision):
            raise ValueTooLarge("a % format whose width is an argument")
        sizes = [int(size) for size in (width, precision) if size]
        if any(size > MAX_ARGUMENT for size in sizes):
            raise ValueTooLarge(f"a % format with a width over {MAX_ARGUMENT}")
        length += sum(sizes) + longest
    _check_length(length, "a % format")


def _check_format(template: str, *args: Any) -> None:
    """str.format's result sized first, as a % format's is (a width given by an argument,
    `{0:{1}}`, is refused: its size is not the format's own)."""
    longest = _longest_text(_format_values(args))
    length = len(template)
    for _, field, spec, _ in string.Formatter().parse(template):
        if field is None:
            continue
        if spec and "{" in spec:
            raise ValueTooLarge("a format field whose width is an argument")
        widths = [int(digits) for digits in _DIGITS.findall(spec or "")]
        if any(width > MAX_ARGUMENT for width in widths):
            raise ValueTooLarge(f"a format field with a width over {MAX_ARGUMENT}")
        length += sum(widths) + longest
    _check_length(length, "a format")


def _format_values(args: tuple[Any, ...]) -> Iterator[Any]:
    """str.format's positional and keyword values (format_map's mapping among them)."""
    for value in args:
        yield from value.values() if isinstance(value, dict) else (value,)


def _integer_result_bits(name: str, left: int, right: int) -> int:
    """An upper bound of the bits of `left <name> right`, from its operands' alone: their sum
    for + - * / // % (each result is at most that), the base's times the exponent for **."""
    if name == "**":
        return max(left.bit_length() * right, 1) if right >= 0 else 0  # negative: a float
    return left.bit_length() + right.bit_length()


def _check_binop(name: str, left: Any, right: Any) -> None:
    """Every binary operator a template runs, sized from its operands before it runs."""
    if isinstance(left, int) and isinstance(right, int):
        if _integer_result_bits(name, left, right) > MAX_INT_BITS:
            raise ValueTooLarge(
                f"{name} on integers of {left.bit_length()} and "
                f"{right.bit_length()} bits: over {MAX_INT_BITS} bits"
            )
    elif name == "+":
        if isinstance(left, _TEXTS) and isinstance(right, _TEXTS):
            _check_length(len(left) + len(right), "+")
        elif isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
            _check_items(len(left) + len(right), "+")
            _check_length(_text_length((left, right)), "+")  # one walk: l + l walks l once
    elif name == "*":
        count = max(right if type(right) is int else left if type(left) is int else 0, 0)
        repeated = left if type(right) is int else right
        if isinstance(repeated, (list, tuple)):  # sized by what it holds: see add
            _check_items(len(repeated) * count, "*")
            _check_length(
                _text_length(repeated, limit=MAX_VALUE_LENGTH // max(count, 1)) * count, "*"
            )
        else:
            _check_length(_sized(repeated) * count, "*")
    elif name == "%" and isinstance(left, _TEXTS):
        _check_printf(bytes(left) if type(left) is bytearray else left, right)


def _check_items(count: int, what: str) -> None:
    if count > MAX_ITEMS:
        raise ValueTooLarge(f"{what} would build {count} items, over {MAX_ITEMS}")


def _item_count(value: Any) -> int:
    """How many items listing value makes (a string: one per character), where its length
    tells; 0 for an iterator, whose items are the steps of a generator the watchdog can stop."""
    return len(value) if isinstance(value, _LENGTHS) else 0


def _check_split(text: str | bytes, *args: Any, lines: bool = False) -> None:
    """split's, rsplit's or splitlines' pieces counted first: at most one more than the
    separators in text (a separator and a count in any order, as keywords may give them)."""
    if len(text) < MAX_ITEMS:  # fewer characters than the bound: fewer pieces too
        return
    separator = next((arg for arg in args if isinstance(arg, (str, bytes))), None)
    most = next((arg for arg in args if type(arg) is int and arg >= 0), None)
    if most is not None and most < MAX_ITEMS and not lines:
        return
    breaks: Iterable[Any] = (
        (separator,)
        if separator
        else (_LINE_BREAKS if lines else _WHITESPACE)
        if isinstance(text, str)
        else (_BYTES_LINE_BREAKS if lines else _BYTES_WHITESPACE)
    )
    pieces = 1
    for mark in breaks:  # the commonest first: past the bound, the rest is not counted
        pieces += text.count(mark)  # type: ignore[arg-type]
        _check_items(pieces, "splitting a string")


def _check_integers(values: Iterable[Any], what: str) -> None:
    for value in values:
        if type(value) is int and abs(value) > MAX_ARGUMENT:
            raise ValueTooLarge(f"{what} takes an integer over {MAX_ARGUMENT}")


def _check_join(separator: str | bytes, items: Any) -> None:
    """str.join's (or bytes') result sized first: the same long item may be listed many times
    (jinja's join prints items that are not strings), and join lists its items first."""
    _check_items(len(items), "join")
    length = len(separator) * len(items)
    for item in items:
        length += len(item) if isinstance(item, _TEXTS) else _text_length(item)
        _check_length(length, "join")


def _listed(items: Any) -> Any:
    """An iterable about to be joined, as a list (which join would build anyway) to size it."""
    return items if isinstance(items, (*_TEXTS, list, tuple, dict)) else list(items)


def _check_translate(text: str | bytes, table: Any = None, *rest: Any) -> None:
    """translate's result sized first: each character may become the longest replacement (a
    byte stays a byte)."""
    values = (
        table.values()
        if isinstance(table, dict)
        else table
        if isinstance(table, (list, tuple))
        else ()
    )
    longest = max((len(value) for value in values if isinstance(value, str)), default=1)
    _check_length(len(text) * max(longest, 1), "translate")


def _check_replace(text: str | bytes, old: Any, new: Any) -> None:
    """replace's result sized first: each match of old (every gap, for "") becomes new."""
    if isinstance(old, _TEXTS) and isinstance(new, _TEXTS) and len(new) > len(old):
        matches = len(text) + 1 if not old else text.count(old)
        _check_length(len(text) + matches * (len(new) - len(old)), "replace")


def _check_expandtabs(text: str | bytes, tabsize: Any = 8, *rest: Any) -> None:
    if type(tabsize) is int:
        tab = "\t" if isinstance(text, str) else b"\t"
        _check_length(len(text) + text.count(tab) * tabsize, "expandtabs")  # type: ignore[arg-type]


def _check_encode(text: str | bytes, *rest: Any) -> None:
    """UTF-8 is up to 4 bytes a character; 1 for ASCII, which CPython knows without a scan."""
    if isinstance(text, str):
        _check_length(len(text) * (1 if text.isascii() else 4), "encode")


def _check_hex(text: str | bytes, separator: Any = "", *rest: Any) -> None:
    """Two digits a byte, and a separator between (at most) any two."""
    if not isinstance(text, str):
        step = len(separator) if isinstance(separator, _TEXTS) else 0
        _check_length(len(text) * (2 + step), "hex")


# str and bytes methods whose result may outgrow their operands, sized by their operands.
_STR_METHOD_CHECKS = {
    "encode": _check_encode,
    "hex": _check_hex,
    "format": _check_format,
    "format_map": _check_format,
    "expandtabs": _check_expandtabs,
    "join": lambda text, items=(), *rest: _check_join(text, items),  # items already listed
    "replace": lambda text, old=None, new=None, *rest: _check_replace(text, old, new),
    "translate": _check_translate,
}
# Methods that build a sequence of new objects from one value in one call, sized by its items
# (called with the method's owner: a string or bytes to split, dict for fromkeys).
_SEQUENCE_METHOD_CHECKS: dict[str, Callable[..., None]] = {
    "split": lambda text, *args: (
        _check_split(text, *args) if isinstance(text, (str, bytes)) else None
    ),
    "rsplit": lambda text, *args: (
        _check_split(text, *args) if isinstance(text, (str, bytes)) else None
    ),
    "splitlines": lambda text, *args: (
        _check_split(text, lines=True) if isinstance(text, (str, bytes)) else None
    ),
    "fromkeys": lambda owner, keys=(), *rest: _check_items(_item_count(keys), "fromkeys"),
    # list.index's error prints the value it does not find (an object: its address)
    "index": lambda owner, value=None, *rest: (
        _check_text(value, "index") if isinstance(owner, list) else None
    ),
}


# Filters whose result may outgrow their value and arguments, sized the same way (called with
# the filter's own arguments, the value first).
def _filter_format(value: Any, *args: Any, **kwargs: Any) -> None:
    """jinja's format prints its value, then formats it with the arguments: a value that is
    not a string is a % template too (`["%(a)9999s"]|format(a=1)`)."""
    _check_printf(_text(value, "format"), kwargs or args)


def _filter_indent(value: Any, width: Any = 4, *rest: Any, **kwargs: Any) -> None:
    """Every line of value indented: by width spaces, or by width itself when a string. Its
    lines are listed first (splitlines, one C call), at every line break splitlines ends a line
    at (a count of "\n" alone would let `"\r" * n` list n lines past the item bound)."""
    width = kwargs.get("width", width)
    step = len(width) if isinstance(width, str) else width if type(width) is int else 0
    if isinstance(value, str):
        lines = 1 + sum(map(value.count, _LINE_BREAKS))  # "\r\n" twice: an upper bound
        _check_items(lines, "indent")
        _check_length(len(value) + lines * step, "indent")


def _filter_wordwrap(
    value: Any,
    width: Any = 79,
    break_long_words: Any = True,
    wrapstring: Any = None,
    *rest: Any,
    **kwargs: Any,
) -> None:
    """wrapstring joins the lines, at most one per character of value."""
    wrapstring = kwargs.get("wrapstring", wrapstring)
    if isinstance(value, str) and isinstance(wrapstring, str):
        _check_length(len(value) + (len(value) + 1) * len(wrapstring), "wordwrap")


def _filter_tojson(
    value: Any, ensure_ascii: Any = False, indent: Any = None, *rest: Any, **kwargs: Any
) -> None:
    indent = kwargs.get("indent", indent)
    step = len(indent) if isinstance(indent, str) else indent if type(indent) is int else 0
    _check_length(_text_length(value, max(step, 0)) + 2, "tojson")  # a string's quotes


def _filter_sum(value: Any, attribute: Any = None, start: Any = 0, **kwargs: Any) -> None:
    """Numbers only: sum over lists copies its growing total at each item."""
    if type(kwargs.get("start", start)) not in (int, float, bool):
        raise ValueTooLarge("sum adds numbers only")


def _filter_number(value: Any, *rest: Any, **kwargs: Any) -> None:
    """A number read from text: at most MAX_NUMBER_TEXT long, in any base."""
    if isinstance(value, _TEXTS) and len(value) > MAX_NUMBER_TEXT:
        raise ValueTooLarge(f"a number read from {len(value)} characters, over {MAX_NUMBER_TEXT}")


def _filter_round(value: Any, precision: Any = 0, *rest: Any, **kwargs: Any) -> None:
    """round() of an integer to -n digits divides it by 10 ** n in one call: n is bounded by
    the digits an integer within MAX_INT_BITS has."""
    precision = kwargs.get("precision", precision)
    if type(precision) is int and abs(precision) > MAX_ROUND_DIGITS:
        raise ValueTooLarge(f"rounding to {precision} digits, past {MAX_ROUND_DIGITS}")


def _filter_escape(value: Any, *rest: Any, **kwargs: Any) -> None:
    """Each of & < > ' " becomes up to 5 characters: counted first, not measured after a call
    of seconds."""
    if isinstance(value, str):
        _check_length(len(value) + 4 * sum(map(value.count, "&<>'\"")), "escaping")
    else:
        _check_length(_text_length(value) * 5, "escaping")


# Filters that print their value first (str() of it, in one C call), whatever it is: a value
# that is not a string is sized as text before (the rest of each is sized after, a fixed
# multiple of that text: case mapping, trimming, escaping).
_PRINTING_FILTERS = frozenset(
    (
        "capitalize",
        "center",
        "format",
        "forceescape",
        "lower",
        "pprint",
        "replace",
        "safe",
        "string",
        "striptags",
        "title",
        "trim",
        "truncate",
        "upper",
        "urlencode",
        "urlize",
        "wordcount",
        "xmlattr",
    )
)

# Filters that print their arguments too: join's separator, replace's old and new, urlize's
# target and rel, format's values. (The others take numbers, flags, names of attributes, or
# text they fail on when it is not a string.)
_ARGUMENT_PRINTING_FILTERS = frozenset(("format", "join", "replace", "urlize"))

# Filters that list their value (or the pieces of a string) in one C call, sized by the items
# the value has, a string's characters among them. (batch, unique, map, select and the like
# are generators: a step per item, which the watchdog can stop.)
_LISTING_FILTERS = frozenset(
    (
        "list",
        "sort",
        "slice",
        "reverse",
        "dictsort",
        "groupby",
        "wordcount",
        "wordwrap",
        "title",
        "urlize",
        "striptags",
    )
)

_FILTER_CHECKS: dict[str, Callable[..., None]] = {
    "format": _filter_format,
    "indent": _filter_indent,
    "wordwrap": _filter_wordwrap,
    "tojson": _filter_tojson,
    "sum": _filter_sum,
    "int": _filter_number,
    "float": _filter_number,
    "round": _filter_round,
    "e": _filter_escape,
    "escape": _filter_escape,
    "forceescape": _filter_escape,
    "xmlattr": _filter_escape,  # escapes each value it prints
    "join": lambda value, separator="", *rest, **kwargs: _check_join(
        _text(kwargs.get("d", separator), "join"), value
    ),  # listed
    # jinja's replace prints its value and both arguments, then replaces
    "replace": lambda value, old=None, new=None, *rest, **kwargs: _check_replace(
        _text(value, "replace"), _text(old, "replace"), _text(new, "replace")
    ),
}


def _bounded_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """function, refusing integer arguments past MAX_ARGUMENT (the value filtered aside)."""
    skip = 1 + (_PassArg.from_obj(function) is not None)  # context or environment, then value

    @functools.wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        if len(args) > skip or kwargs:  # arguments beside the value (most filters take none)
            _check_integers(args[skip:], f"the filter {name}")
            _check_integers(kwargs.values(), f"the filter {name}")
            if name in _ARGUMENT_PRINTING_FILTERS:
                for argument in chain(args[skip:], kwargs.values()):
                    _check_text(argument, f"the filter {name}")
        if name in _LISTING_FILTERS and len(args) >= skip:
            _check_items(_item_count(args[skip - 1]), f"the filter {name}")
        if name in _PRINTING_FILTERS and len(args) >= skip:
            _check_text(args[skip - 1], f"the filter {name}")
        if name in _FILTER_CHECKS and len(args) >= skip:
            if name == "join":
                args, kwargs = _join_attributes(args, kwargs, skip)
            _FILTER_CHECKS[name](*args[skip - 1 :], **kwargs)
        return _checked(function(*args, **kwargs), f"the filter {name}")

    return bounded


def _join_attributes(
    args: tuple[Any, ...], kwargs: dict[str, Any], skip: int
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """jinja join's arguments with its items listed, each its attribute when one is named
    (what join would join), so that what is sized is what is joined."""
    items = _listed(args[skip - 1])
    rest, kwargs = list(args[skip:]), dict(kwargs)
    attribute = kwargs.pop("attribute", rest.pop(1) if len(rest) > 1 else None)
    if attribute is not None:
        items = list(map(make_attrgetter(args[0].environment, attribute), items))
    return (*args[: skip - 1], items, *rest), kwargs


def _check_name(name: Any, kind: str) -> None:
    """A filter or test is named by a string (`map(name)`, `select(name)`): jinja's error for
    a name of any other type prints its repr, an object's address in the dead letter."""
    if not isinstance(name, (str, Undefined)):
        raise TemplateRuntimeError(f"No {kind} is named by a {type(name).__name__}.")


class _BoundedFilters(AllowedNames):
    """The environment's allowed filters (template_names.FILTERS), each handed out bounded
    (compiled templates look them up by name at each render; transformers adds its own after
    the environment is built)."""

    def __init__(self, filters: dict[str, Callable[..., Any]]):
        self._bounded: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {}
        super().__init__(FILTERS, filters)

    def __getitem__(self, name: str) -> Callable[..., Any]:
        function = super().__getitem__(name)
        known = self._bounded.get(name)
        if known is None or known[0] is not function:
            known = self._bounded[name] = (function, _bounded_filter(name, function))
        return known[1]

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        """The filter bounded too where jinja looks it up so: folding a constant at compile
        time (`7|round(-1000000)`), outside the render's budget."""
        _check_name(name, "filter")
        return self[name] if name in self else default


def _printing_test(test: Callable[..., Any]) -> Callable[..., Any]:
    """A test that prints its value first (`is lower`, `is upper`: str(value)), sized first."""

    @functools.wraps(test)
    def checked(value: Any, *args: Any, **kwargs: Any) -> Any:
        _check_text(value, f"the test {test.__name__}")
        return test(value, *args, **kwargs)

    return checked


def _message_as_text(raise_exception: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' raise_exception, given its message as checked text: the dead letter
    prints it, so an object's address would make it differ on every run."""

    @functools.wraps(raise_exception)
    def checked(message: Any, *args: Any, **kwargs: Any) -> Any:
        return raise_exception(_text(message, "raise_exception's message"), *args, **kwargs)

    return checked


class _CheckedNames(AllowedNames):
    """An environment's allowed globals or tests, each one that prints a value stored behind
    its check, whenever it is set (transformers sets raise_exception after the environment is
    built)."""

    def __init__(
        self,
        allowed: frozenset[str],
        values: dict[str, Any],
        checks: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]],
        kind: str,
    ):
        self._checks, self._kind = checks, kind
        super().__init__(allowed, values)

    def __setitem__(self, name: str, value: Any) -> None:
        check = self._checks.get(name)
        super().__setitem__(name, value if check is None or not callable(value) else check(value))

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        """What jinja looks a test up by (`select(name)`)."""
        _check_name(name, self._kind)
        return super().get(name, default)


# The tests and globals that turn a value into text (jinja's other tests and globals compare,
# count or hold values, never print them).
_TEST_CHECKS = {"lower": _printing_test, "upper": _printing_test}
_GLOBAL_CHECKS = {"raise_exception": _message_as_text}


class _KeyTypeUndefined(Undefined):
    """jinja's Undefined, whose error names a missing key that is not a string or number by
    its type: jinja names it by its repr, which for an object holds its address (`{}[cycler(
    1)].x`), a dead letter that would differ on every run."""

    __slots__ = ()

    @property
    def _undefined_message(self) -> str:
        name = self._undefined_name
        if self._undefined_hint is None and name is not None:
            if type(name) is not str and type(name) not in _REPR_LEAVES:
                return f"{object_type_repr(self._undefined_obj)} has no element of its kind"
        return super()._undefined_message


class _BoundedCodeGenerator(CodeGenerator):
    """Writes `a ~ b` and `a + b` as calls of the environment that size their result (jinja
    intercepts `+` only through call_binop, a slower call on a step templates take often)."""

    @optimizeconst
    def visit_Concat(self, node: Concat, frame: Frame) -> None:
        # templates render with autoescape off, so jinja's str_join is what this replaces
        self.write("environment.join_values((")
        for argument in node.nodes:
            self.visit(argument, frame)
            self.write(", ")
        self.write("))")

    def _output_child_pre(self, node: Any, frame: Frame, finalize: Any) -> None:
        """`{{ value }}` printed through the environment's to_text, which sizes it first."""
        if frame.eval_ctx.volatile or frame.eval_ctx.autoescape or finalize.src is not None:
            super()._output_child_pre(node, frame, finalize)
        else:
            self.write("environment.to_text(")

    @optimizeconst
    def visit_Add(self, node: Add, frame: Frame) -> None:
        self.write("environment.add(")
        self.visit(node.left, frame)
        self.write(", ")
        self.visit(node.right, frame)
        self.write(")")


def _returned_as_is(sample: Any) -> frozenset[str]:
    """The attributes of sample's type that jinja's sandboxed getattr hands out as they are
    (safe for the type, not str.format): asked of jinja itself, once. Its answer depends on
    the type alone for these builtins (isinstance checks and the name)."""
    sandbox = ImmutableSandboxedEnvironment()
    return frozenset(
        name
        for name in dir(type(sample))
        if sandbox.is_safe_attribute(sample, name, None)
        and sandbox.wrap_str_format(getattr(sample, name)) is None
    )


# What a template is given is plain JSON types (transformers rebuilds messages and tools so):
# reading their keys and safe methods is most of a template's steps.
_PLAIN_ATTRIBUTES = {kind: _returned_as_is(kind()) for kind in (str, dict, list)}
_DICT_ATTRIBUTES = frozenset(dir(dict))  # any other name of a dict is a key or nothing
# A `namespace()` (transformers' subclass among them) and a loop's `loop`, read at most steps
# too: jinja judges their attributes by the name alone, unless a subclass makes one a function,
# generator or mutable collection, which these names would show (each is refused on one).
_NAMED_ATTRIBUTES = (Namespace, LoopContext)
_PROBES = ("clear", "mro", "func_code", "im_func", "gi_code", "cr_code", "ag_code")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """ImmutableSandboxedEnvironment whose joins, repetitions, powers, formats and integer
    arguments are bounded before they run, and whose names are the pure ones (template_names)."""

    code_generator_class = _BoundedCodeGenerator
    # all of them (+ is written as add, below): none runs unsized, none is folded at compile time
    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("undefined", _KeyTypeUndefined)
        super().__init__(*args, **kwargs)
        # only names whose result is the request's (template_names.py)
        self.filters = _BoundedFilters(self.filters)
        self.tests = _CheckedNames(TESTS, self.tests, _TEST_CHECKS, "test")
        self.globals = _CheckedNames(GLOBALS, self.globals, _GLOBAL_CHECKS, "global")
        self._by_name: dict[type, bool] = {}  # per environment, as transformers' namespace is

    def getattr(self, obj: Any, attribute: str) -> Any:
        """jinja's sandboxed getattr, answered at once for a plain dict's key, a plain str's,
        dict's or list's safe method and a namespace's or loop's attribute, where jinja fails a
        getattr first or checks the attribute's safety anew each time (a third of a chat
        template's time); the same value either way (test_bounded_sandbox_getattr.py)."""
        if type(attribute) is str:
            kind = type(obj)
            if kind is dict and attribute not in _DICT_ATTRIBUTES:
                try:
                    return obj[attribute]
                except KeyError:
                    return self.undefined(obj=obj, name=attribute)
            safe = _PLAIN_ATTRIBUTES.get(kind)
            if safe is not None and attribute in safe:
                return getattr(obj, attribute)
            if not attribute.startswith("_") and self._judged_by_name(obj):
                try:
                    value = getattr(obj, attribute)
                except AttributeError:  # neither has items to fall back on
                    return self.undefined(obj=obj, name=attribute)
                wrapped = self.wrap_str_format(value)
                return value if wrapped is None else wrapped
        return super().getattr(obj, attribute)

    def _judged_by_name(self, obj: Any) -> bool:
        """Whether jinja's getattr on obj returns any attribute not named _x, with no items to
        fall back on: asked of jinja once per type."""
        kind = type(obj)
        known = self._by_name.get(kind)
        if known is None:
            known = self._by_name[kind] = (
                isinstance(obj, _NAMED_ATTRIBUTES)
                and not hasattr(kind, "__getitem__")
                and all(self.is_safe_attribute(obj, name, None) for name in _PROBES)
            )
        return known

    def call_binop(self, context: Context, operator_name: str, left: Any, right: Any) -> Any:
        _check_binop(operator_name, left, right)
        return _checked(
            self.binop_table[operator_name](left, right), f"the operator {operator_name}"
        )

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        for value in args:  # inline: a step templates take often
            if type(value) is int and abs(value) > MAX_ARGUMENT:
                raise ValueTooLarge(f"a call takes an integer over {MAX_ARGUMENT}")
        if kwargs:
            _check_integers(kwargs.values(), "a call")
        method = getattr(__obj, "__name__", None)
        if method in _SEQUENCE_METHOD_CHECKS:
            _SEQUENCE_METHOD_CHECKS[method](
                getattr(__obj, "__self__", None), *args, *kwargs.values()
            )
        elif method in _STR_METHOD_CHECKS:
            # the sandbox hands out str.format wrapped; the bound method is under __wrapped__
            text = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
            if isinstance(text, _TEXTS):
                if method == "join" and args:
                    args = (_listed(args[0]), *args[1:])
                _STR_METHOD_CHECKS[method](text, *args, *kwargs.values())
        return _checked(super().call(__context, __obj, *args, **kwargs), "a call")

    def handle_exception(self, source: str | None = None) -> Any:
        """A render's error raised as it is. jinja rewrites its traceback into the template's
        lines, compiling a code object per frame, and no dead letter shows a traceback (its
        text is the error's, unchanged); a template that takes tool-call arguments only as
        strings fails once per such request (render_chat tries objects first). A syntax error
        is jinja's to translate: its text gains the template's line."""
        error = sys.exc_info()[1]
        if error is None or isinstance(error, TemplateSyntaxError):
            return super().handle_exception(source)
        raise error

    def concat(self, pieces: Iterable[str]) -> str:  # type: ignore[override]
        """What a template's output, a macro's, a call block's or a `{% set %}` block's pieces
        join to (jinja's compiled code calls this for each), sized before it is built: pieces
        may all be one string (`{{ eos_token }}` per turn), so what they hold does not bound
        the join; their lengths are summed as they come, and past the bound none is joined."""
        held: list[str] = []
        total = 0
        for piece in pieces:
            total += len(piece)
            if total > MAX_VALUE_LENGTH:
                _check_length(total, "the output")
            held.append(piece)
        return "".join(held)

    @staticmethod
    def join_values(values: tuple[Any, ...]) -> str:
        """`a ~ b ~ ...`: what jinja's str_join does, sized first."""
        _check_length(
            sum(len(value) if type(value) is str else _text_length(value) for value in values), "~"
        )
        return _checked("".join(map(str, values)), "~")

    @staticmethod
    def to_text(value: Any) -> str:
        """str(value) for `{{ value }}`, sized first."""
        return value if type(value) is str else _text(value, "printing a value")

    @staticmethod
    def add(left: Any, right: Any) -> Any:
        """`a + b`, its result sized: at most its two operands' size, each within the bound.
        Lists are sized by what they hold, through nested lists (`l = l + l` doubles that,
        not their length): so one comparison, containment or sort over any list a template
        builds walks at most the bound, where `[0] * n + [1] in [[0] * n] * n` would walk n²."""
        if type(left) is str and type(right) is str:  # most of a template's additions
            _check_length(len(left) + len(right), "+")
            return left + right
        _check_binop("+", left, right)
        return _checked(left + right, "+")
