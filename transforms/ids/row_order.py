"""The one order of published rows: by published time, then by what the rows publish, and only
then by what they keep private.

Rows sharing a published timestamp (every row of a granule with --timestamp-granularity-ms)
must not come out in their raw time order (that publishes the finer times), nor in an order a
publisher may choose freely (a channel of log2(k!) bits per k tied rows). So they sort by a key
the gate can recompute from the published rows alone: input_length, then output_length as
published. Only rows equal in both fall back to a private tie-break (the request's content
fingerprint), whose order the gate cannot check (docs/ORDERING.md: the residual channel).

Block ids and sessions are numbered first-seen in this same order (dense_ids sorts occurrences
by published time, this key, then the fingerprint), so the rows' order and their ids agree in
every engine. The key is per row, never across rows: numbering stays a sort per time bucket.
"""

from __future__ import annotations

import numpy as np

# Each length is saturated to 32 bits (kvtrace writes none above records.MAX_COUNT = 2^31 - 1):
# the two share one uint64 that occurrences carry beside their fingerprint.
LENGTH_BITS = 32
_LARGEST = np.uint64((1 << LENGTH_BITS) - 1)


def tie_key(input_length: np.ndarray, output_length: np.ndarray) -> np.ndarray:
    """Each row's place among rows of its published time, as published: input_length, then
    output_length (the published, coarsened one), packed into a uint64 ordered as the pair."""

    def saturated(values: np.ndarray) -> np.ndarray:
        return np.minimum(np.maximum(np.asarray(values, np.int64), 0).astype(np.uint64), _LARGEST)

    return (saturated(input_length) << np.uint64(LENGTH_BITS)) | saturated(output_length)


def published_order(
    timestamp: np.ndarray, input_length: np.ndarray, output_length: np.ndarray, *private: np.ndarray
) -> np.ndarray:
    """The rows' positions in published order: time, the tie key, then the private columns
    given (first most significant) for rows the published ones leave tied."""
    return np.lexsort((*reversed(private), tie_key(input_length, output_length), timestamp))


def in_published_order(
    timestamp: np.ndarray, input_length: np.ndarray, output_length: np.ndarray
) -> bool:
    """Whether consecutive rows never go back in (time, tie key): what the gate can check of
    published_order from the published rows alone."""
    key = tie_key(input_length, output_length)
    later, same = np.diff(timestamp) > 0, np.diff(timestamp) == 0
    return bool((later | (same & (key[1:] >= key[:-1]))).all())
