"""The published format has one home: a contributor adding a trace column, or renaming a file
kvtrace publishes, edits transforms/trace_format.py (and tests). Read from the source: the
fields' and files' names, and the default block size, are written nowhere else."""

from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

import numpy as np

from kvtrace.transforms import trace_format
from kvtrace.transforms.trace_format import (
    DEFAULT_BLOCK_SIZE,
    MANIFEST_SCHEMA,
    OPTIONAL_FIELDS,
    OUTPUT_IDS_FIELD,
    OUTPUT_LENGTH_FIELD,
    ROW_FIELDS,
    TraceColumns,
    columns_of_jsonl,
    jsonl_bytes,
    parquet_bytes,
)

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "transforms" / "trace_format.py"
PACKAGES = ("transforms", "pipelines", "kvtrace")
PUBLISHED_NAMES = frozenset(ROW_FIELDS + OPTIONAL_FIELDS) | {
    trace_format.MANIFEST,
    trace_format.STATS,
    trace_format.STREAM_TOTALS,
    trace_format.TRACE_FILE_PREFIX,
    trace_format.TRACE_SHARDS,
}

# Modules whose literals spell the same words for something else, each with what it names.
OTHER_VOCABULARIES = {
    "transforms/read/bailian.py": "Alibaba's Bailian trace format, read as input",
    "transforms/read/captures.py": "engine captures' fields, and a parsed request's as records.py",
    "transforms/read/records.py": "the request log's fields",
    "transforms/read/response_end.py": "the request log's streamed chunks' fields",
    "transforms/read/shapes.py": "the request log's fields",
    "transforms/encode/hashed_batch.py": "REQUEST's columns: a request before it is a row",
    "transforms/encode/timestamp_kinds.py": "REQUEST's columns",
    "transforms/ids/dense_ids.py": "REQUEST's columns",
    "transforms/write/coarsen.py": "ROW's and REQUEST's columns",
    "transforms/write/totals.py": "REQUEST's columns",
    "transforms/write/rows.py": "ROW's columns: a row before it is published",
    "transforms/write/shards.py": "ROW's columns, handed to TraceColumns",
}


@functools.cache  # parsed once for the tests that read them
def _sources() -> dict[str, ast.Module]:
    return {
        path.relative_to(ROOT).as_posix(): ast.parse(path.read_text())
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != HOME
    }


def _docstrings(tree: ast.Module) -> set[int]:
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def _restated(tree: ast.Module) -> list[tuple[int, str]]:
    """Where a module writes a published name: as a whole string, or as a JSON key in text."""
    docstrings, found = _docstrings(tree), []
    for node in ast.walk(tree):
        if (
            not isinstance(node, ast.Constant)
            or not isinstance(node.value, str)
            or id(node) in docstrings
        ):
            continue
        if node.value in PUBLISHED_NAMES:
            found.append((node.lineno, node.value))
        found += [
            (node.lineno, name)
            for name in ROW_FIELDS + OPTIONAL_FIELDS
            if f'"{name}":' in node.value
        ]
    return found


def test_published_names_are_written_in_trace_format_only():
    restated = sorted(
        f"{path}:{line}: {name!r}"
        for path, tree in _sources().items()
        if path not in OTHER_VOCABULARIES
        for line, name in _restated(tree)
    )
    assert not restated, "import these names from transforms/trace_format.py"


def test_every_listed_exception_is_still_needed():
    sources = _sources()
    stale = [
        path for path in OTHER_VOCABULARIES if path not in sources or not _restated(sources[path])
    ]
    assert not stale


def test_the_scan_finds_a_restated_field():
    """The scan itself can fail: a field as a key, a name, and inside JSON text."""
    tree = ast.parse(
        'ROW = {"input_length": 1}\nLINE = f\'{{"hash_ids": [{x}]}}\'\nNAME = "manifest.json"\n'
    )
    assert sorted(_restated(tree)) == [(1, "input_length"), (2, "hash_ids"), (3, "manifest.json")]


def _block_size_defaults(tree: ast.Module) -> list[int]:
    """Lines where the default block size is written as a number: a block_size parameter's
    default, field or keyword, a fallback (`x or 512`), or a help text's "default 512"."""

    def literal(node: ast.AST | None) -> bool:
        return (
            isinstance(node, ast.Constant)
            and node.value == DEFAULT_BLOCK_SIZE
            and not isinstance(node.value, bool)
        )

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = node.args.posonlyargs + node.args.args
            paired = list(
                zip(arguments[len(arguments) - len(node.args.defaults) :], node.args.defaults)
            )
            paired += list(zip(node.args.kwonlyargs, node.args.kw_defaults))
            lines += [d.lineno for a, d in paired if "block_size" in a.arg and literal(d)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if "block_size" in node.target.id and literal(node.value):
                lines.append(node.lineno)
        elif isinstance(node, ast.keyword) and node.arg and "block_size" in node.arg:
            if literal(node.value):
                lines.append(node.value.lineno)
        elif isinstance(node, ast.BoolOp) and any(literal(v) for v in node.values):
            lines.append(node.lineno)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.search(rf"(default|else)\D{{0,3}}\b{DEFAULT_BLOCK_SIZE}\b", node.value)
        ):
            lines.append(node.lineno)
    return lines


def test_the_default_block_size_is_referenced_never_written():
    written = sorted(
        f"{path}:{line}" for path, tree in _sources().items() for line in _block_size_defaults(tree)
    )
    assert not written, "use trace_format.DEFAULT_BLOCK_SIZE"


def test_the_block_size_scan_finds_a_written_default():
    tree = ast.parse(
        "def f(block_size: int = 512): ...\n"
        "class C:\n    block_size: int = 512\n"
        "g(block_size=512)\nsize = given or 512\nHELP = 'tokens (default 512)'\n"
    )
    assert sorted(_block_size_defaults(tree)) == [1, 3, 4, 5, 6]


def _columns_with_every_field() -> TraceColumns:
    one = np.array([1], np.int64)
    return TraceColumns(
        one,
        one * 600,
        one * 10,
        np.array([2]),
        np.array([0, 1]),
        one * 3,
        one * 40,
        np.array([1]),
        np.array([2]),
        np.array([0]),
    )


def test_jsonl_and_parquet_rows_hold_the_declared_fields():
    """The declared names are the ones both serializations write: a column added to one and
    not the other (or not declared) fails here."""
    columns = _columns_with_every_field()
    row = json.loads(jsonl_bytes(columns))
    assert list(row)[: len(ROW_FIELDS)] == list(ROW_FIELDS)
    assert set(row) == set(ROW_FIELDS + OPTIONAL_FIELDS)
    assert set(columns.schema().names) == set(ROW_FIELDS + OPTIONAL_FIELDS)
    assert parquet_bytes(columns_of_jsonl(jsonl_bytes(columns))) == parquet_bytes(columns)


def test_the_manifest_declares_its_field_named_keys_by_the_fields():
    properties = MANIFEST_SCHEMA["properties"]
    assert properties[OUTPUT_IDS_FIELD] == {"type": "boolean"}
    assert OUTPUT_LENGTH_FIELD in properties["granularity"]["properties"]
