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
import mmap
import os
import tempfile
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt


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


def read_runs(fd: int, offset: int, size: int, index: npt.NDArray[np.int64]) -> bytes:
    """The `size`-byte records at `index` of a file from byte `offset` on, read
    with pread, a run of consecutive records in one read (no mapping: nothing
    of the file stays in the process); fewer bytes than asked when the file
    is shorter. The one reader of records at random: Spill.take, the trainers'
    rows (recmesh.tools.training.family.take_rows)."""
    starts = np.flatnonzero(np.r_[True, index[1:] != index[:-1] + 1])
    counts = (np.diff(np.r_[starts, len(index)]) * size).tolist()
    offsets = (offset + index[starts] * size).tolist()
    return b"".join([os.pread(fd, n, at) for n, at in zip(counts, offsets, strict=True)])


class Spill:
    """An array of one dtype written front to back into an unlinked temporary
    file, then read through a read-only mapping: the process holds the pages
    read since the last `drop`, not the array. For arrays read in order or
    whole (a loaded log's event ids, times and codes, `EventTable.let_go`
    after each pass): a read at random maps far more than its page
    (one batch of 256 random rows of a 185 MB file mapped 173 MB of it: the
    page cache's large folios, `MADV_RANDOM` no help), which is why the
    trainers gather their batches otherwise. The page cache keeps the pages
    dropped, so reading them again costs a minor fault, not a disk read,
    while memory allows."""

    def __init__(self, dtype: npt.DTypeLike) -> None:
        self.dtype = np.dtype(dtype)
        self._file = tempfile.TemporaryFile()  # noqa: SIM115 (open until closed: `take` reads it)
        weakref.finalize(self, self._file.close)  # closed with the spill (its mapping stays readable)
        self._map: mmap.mmap | None = None
        self.rows = 0

    def write(self, values: Any) -> None:
        block = np.ascontiguousarray(values, self.dtype)
        self._file.write(block.tobytes())
        self.rows += block.size

    def mapping(self) -> mmap.mmap | bytes:
        """The bytes written, mapped read-only (slicing one gives bytes)."""
        if self._map is None and not self._file.closed:
            self._file.flush()
            if self.rows:
                self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        return self._map if self._map is not None else b""

    def mapped(self) -> npt.NDArray[Any]:
        """The values written, as a read-only array."""
        return np.frombuffer(self.mapping(), self.dtype)

    def take(self, index: npt.NDArray[np.integer[Any]]) -> npt.NDArray[Any]:
        """The values at `index` (flat positions of the values written), read
        from the file with pread, a run of consecutive positions in one read,
        not through the mapping: no page of the file stays in the process. For
        reads at random (see the class docstring)."""
        index = np.asarray(index, np.int64).ravel()
        if not len(index):
            return np.zeros(0, self.dtype)
        if index.min() < 0 or index.max() >= self.rows:
            raise IndexError(f"values {index.min()}..{index.max()} of {self.rows}")
        self.mapping()  # written out
        return np.frombuffer(read_runs(self._file.fileno(), 0, self.dtype.itemsize, index), self.dtype)

    def close(self) -> None:
        """Let go of the file and its mapping (a table abandoned half-read)."""
        self._file.close()
        if self._map is not None:
            self._map.close()
            self._map = None

    def drop(self) -> None:
        """Let go of the pages read so far (the array stays readable)."""
        if self._map is not None:
            self._map.madvise(mmap.MADV_DONTNEED)
