"""How large a Parquet row is, at least, known from its Arrow form before it is decoded into
Python values. A dictionary-encoded string is stored once and may be referenced by every row (a
2 KB file can hold 128 rows of 4 MB each): its size per row is the size of the entry each row
references, found by index without building the strings.

A lower bound of what a JSON line of the row costs a reader, so that a row refused on it is
refused as a JSON line too: each string counts its UTF-8 bytes and its two quotes (a fixed-size
binary its type's width), a null four (`null`: a list of nulls holds no Arrow buffer, yet is not
free as JSON or Python), every other scalar one byte (a digit), and every container (a list, a
struct, a map) CONTAINER_BYTES at least, however empty: it becomes a Python list or dict of ~64
bytes, which its 2 bytes of JSON do not pay for. A list whose values all cost the same at least
(numbers, nulls) is sized from its offsets alone: sizing allocates per row, not per value.

How large a value of a Parquet physical type is once Arrow decodes it dense is known from the
type alone for the fixed-size types (fixed_value_bytes): their width, never assumed."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

NULL_JSON_BYTES = len("null")
# What a container counts at least: a JSON line may hold 2 x --max-record-bytes / 64 containers
# (records.CONTAINERS_BOUND_MULTIPLE, PARSED_CONTAINER_BYTES: a parsed one is a ~64-byte Python
# list or dict), so a row of containers alone is refused past the same count, before any becomes
# a Python value (an empty list is 2 bytes of JSON: counted as that, 4 M of them were decoded).
CONTAINER_BYTES = 32
# The width of each fixed-size Parquet physical type's values, as Arrow holds them decoded.
_PHYSICAL_WIDTHS = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}


def fixed_value_bytes(physical_type: str, type_length: int) -> int | None:
    """The bytes one value of a Parquet physical type takes decoded, from the type alone (a
    FIXED_LEN_BYTE_ARRAY: its declared length); None for BYTE_ARRAY, whose values vary."""
    if physical_type == "FIXED_LEN_BYTE_ARRAY":
        return max(type_length, 0)
    if physical_type == "BYTE_ARRAY":
        return None
    return _PHYSICAL_WIDTHS[physical_type]


def column_json_bytes(batch: pa.RecordBatch) -> np.ndarray:
    """Per row of the batch and per column (rows x columns), the fewest bytes its value takes
    as JSON, each container counted CONTAINER_BYTES at least (int64): a row's size is its
    row's sum; each column's, what places the row in that column's stored bytes."""
    sizes = np.zeros((batch.num_rows, batch.num_columns), dtype=np.int64)
    for index, column in enumerate(batch.columns):
        sizes[:, index] = _value_bytes(column)
    return sizes


def largest_value_bytes(array: pa.Array) -> int:
    """The most bytes any one element of the array takes as JSON, at least (0 if empty)."""
    return int(_value_bytes(array).max(initial=0))


def _value_bytes(array: pa.Array) -> np.ndarray:
    """Per element of the array, the fewest bytes its value takes as JSON, each container
    CONTAINER_BYTES at least."""
    kind = array.type
    if pa.types.is_dictionary(kind):
        entries = _value_bytes(array.dictionary)
        if not len(entries):  # every element null
            return np.full(len(array), NULL_JSON_BYTES, dtype=np.int64)
        index = kind.index_type  # an integer type; numpy's by name (not pandas': its import)
        width = np.dtype(f"{'u' if pa.types.is_unsigned_integer(index) else 'i'}{index.byte_width}")
        indices = np.where(_valid(array), _buffer(array.indices, 1, width, len(array)), 0)
        if len(indices) and not 0 <= indices.min() <= indices.max() < len(entries):
            # Arrow does not check a dictionary page's indices: a damaged one indexes past it
            raise ValueError(f"a dictionary index outside its {len(entries)} entries (damaged)")
        return _nulls_as_json(array, entries[indices])
    if pa.types.is_string(kind) or pa.types.is_binary(kind):
        return _nulls_as_json(array, np.diff(_buffer(array, 1, np.int32, len(array) + 1)) + 2)
    if pa.types.is_fixed_size_binary(kind):
        return _nulls_as_json(array, np.full(len(array), kind.byte_width + 2, dtype=np.int64))
    if pa.types.is_large_string(kind) or pa.types.is_large_binary(kind):
        return _nulls_as_json(array, np.diff(_buffer(array, 1, np.int64, len(array) + 1)) + 2)
    if pa.types.is_struct(kind):
        fields = [_value_bytes(child) for child in array.flatten()]
        return _nulls_as_json(
            array, _as_container(np.sum(fields, axis=0) if fields else np.zeros(len(array), int))
        )
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind):
        offsets = _buffer(
            array, 1, np.int64 if pa.types.is_large_list(kind) else np.int32, len(array) + 1
        )
        if (each := _least_bytes_each(array.values.type)) is not None:
            return _nulls_as_json(array, _as_container(np.diff(offsets) * each))
        if (nested := _lists_of_alike_bytes(array.values, offsets)) is not None:
            return _nulls_as_json(array, _as_container(nested))
        values = np.concatenate([[0], np.cumsum(_value_bytes(array.values))])
        return _nulls_as_json(array, _as_container(values[offsets[1:]] - values[offsets[:-1]]))
    if pa.types.is_null(kind):
        return np.full(len(array), NULL_JSON_BYTES, dtype=np.int64)
    if pa.types.is_fixed_size_list(kind):
        start, size = array.offset * kind.list_size, kind.list_size  # a null holds size too
        values = _value_bytes(array.values)[start : start + len(array) * size]
        values = values.reshape(len(array), size)
        return _nulls_as_json(array, _as_container(values.sum(axis=1)))
    return _nulls_as_json(array, np.ones(len(array), dtype=np.int64))  # a number, a union...


def _lists_of_alike_bytes(lists: pa.Array, offsets: np.ndarray) -> np.ndarray | None:
    """For each range [offsets[i], offsets[i + 1]) of lists whose values all cost the same at
    least (numbers, nulls: a list of lists of them), the fewest bytes the range's lists take,
    from offsets alone: their values' bytes, or CONTAINER_BYTES per list (a null one, `null`'s),
    whichever is more (each list counts the more of the two; summed, at least the more of the
    sums). None for other values. Per range, not per list: millions of empty lists in one row
    are sized without an array of millions."""
    kind = lists.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
        return None
    if (each := _least_bytes_each(kind.value_type)) is None:
        return None
    width = np.int64 if pa.types.is_large_list(kind) else np.int32
    starts = np.frombuffer(lists.buffers()[1], dtype=width)[lists.offset + offsets]
    values = np.diff(starts.astype(np.int64)) * each
    per_list = NULL_JSON_BYTES if lists.null_count else CONTAINER_BYTES
    return np.maximum(values, np.diff(offsets) * per_list)


def _as_container(contents: np.ndarray) -> np.ndarray:
    """Sizes of containers from those of their contents: CONTAINER_BYTES at least each."""
    return np.maximum(contents, CONTAINER_BYTES)


def _least_bytes_each(kind: pa.DataType) -> int | None:
    """The fewest JSON bytes any value of the type takes, null or not, when the type alone says
    (a number: a digit; null: `null`); None when values differ by more than their type."""
    if pa.types.is_null(kind):
        return NULL_JSON_BYTES
    if (
        pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_temporal(kind)
        or pa.types.is_decimal(kind)
    ):
        return 1
    return None


# Read from the arrays' buffers with numpy: pyarrow's compute functions would do, but loading
# their kernels costs ~45 MB of resident memory, more than a record at a small bound.


def _buffer(array: pa.Array, index: int, dtype: np.dtype, count: int) -> np.ndarray:
    """count values of one of the array's buffers (offsets, indices) from the array's offset."""
    values = np.frombuffer(array.buffers()[index], dtype=dtype)
    return values[array.offset : array.offset + count].astype(np.int64)


def _valid(array: pa.Array) -> np.ndarray:
    bitmap = array.buffers()[0]
    if not array.null_count or bitmap is None:
        return np.ones(len(array), dtype=bool)
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    return bits[array.offset : array.offset + len(array)].astype(bool)


def _nulls_as_json(array: pa.Array, sizes: np.ndarray) -> np.ndarray:
    """sizes with each null element's as `null`'s."""
    if array.null_count:
        sizes = np.where(_valid(array), sizes, NULL_JSON_BYTES)
    return sizes.astype(np.int64, copy=False)
