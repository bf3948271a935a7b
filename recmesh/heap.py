"""Freed memory given back to the system at the end of a pass over a log.

glibc's allocator keeps what a process frees in its heaps for the next
allocation. A pass over an event log makes NumPy temporaries of tens of MB
(sorts, gathers, arrays grown by appending); once its first large array is
freed, glibc raises its mmap threshold (up to 32 MB), so the next ones come
from the heap, and when they are freed the heap keeps their pages. Measured
on the 4 M-event log (`recmesh bench train`'s), a process held 180 MB of
such pages after loading the log, 290 MB more after counting its
interactions, and a forked child inherits them (in proportional set size,
counted whole). A fixed mmap threshold (MALLOC_MMAP_THRESHOLD_=1 MiB) gave
them back too, but made the model family's step 3x slower (each step's
arrays mapped and zeroed anew), so the passes that make such temporaries call
`give_back` before they return: malloc_trim(0), which returns the free pages
of every heap (tens of ms on a heap of 1 GB). Python objects live in
pymalloc's arenas, which it gives back itself when they empty.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS): nothing to do
        return None
    return trim


def give_back() -> None:
    """Return the heaps' free pages to the system (glibc); a no-op elsewhere."""
    trim = _trim()
    if trim is not None:
        trim(0)
