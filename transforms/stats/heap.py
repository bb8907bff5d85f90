"""Keep the analysis's memory near the size of its arrays (glibc's allocator otherwise keeps
freed memory for reuse: 10M rows peaked at 10.3 GB with 5 GB of live arrays)."""

from __future__ import annotations

import ctypes

# glibc's mallopt parameter: allocations from this size up get their own mapping, returned to
# the OS as soon as they are freed. glibc's default raises it as large arrays come and go, up to
# 32 MiB, and every freed temporary below it stays in the heap.
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 64 << 10


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: its allocator decides
        return None


def map_arrays_apart() -> None:
    """Arrays from 64 KiB up in their own mappings, for the rest of the process."""
    if (libc := _libc()) is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def return_freed_heap() -> None:
    """Hand the heap's free pages (small arrays freed by the last step) back to the OS."""
    if (libc := _libc()) is not None:
        libc.malloc_trim(0)
