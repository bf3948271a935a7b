"""recmesh.heap: arrays spilled to files and read through mappings whose pages
can be let go of; the heaps' free pages given back."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from recmesh.heap import Spill, give_back


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_spill_reads_back_what_was_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    rows = Spill(np.uint16)
    rows.write(np.arange(6, dtype=np.uint16))
    rows.write([6, 7, 8])
    got = rows.mapped()
    assert got.shape == (9,) and got.tolist() == list(range(9))
    assert not got.flags.writeable
    rows.drop()
    assert got.tolist() == list(range(9))  # read again from the page cache
    assert rows.mapped() is not got and rows.mapped().tolist() == got.tolist()  # one mapping, mapped once
    assert list(tmp_path.iterdir()) == []  # unlinked: nothing left behind
    empty = Spill(np.int64)
    assert empty.mapped().shape == (0,) and empty.mapping() == b""
    raw = Spill(np.uint8)
    raw.write(np.frombuffer("é1e2".encode(), np.uint8))
    assert raw.mapping()[0:3].decode() == "é1"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_dropping_a_spills_pages_gives_the_memory_back() -> None:
    big = Spill(np.float64)
    for _ in range(8):
        big.write(np.ones(1 << 20))  # 64 MB in all
    arr = big.mapped()
    give_back()
    before = _rss_mb()
    assert float(arr.sum()) == 8 * (1 << 20)  # every page read: mapped into the process
    read = _rss_mb()
    big.drop()
    dropped = _rss_mb()
    assert read - before > 48, (before, read)
    assert dropped - before < 8, (before, read, dropped)
    assert float(arr[::4096].sum()) == 2048.0  # still readable


def test_a_spill_reads_values_at_random_from_its_file() -> None:
    """take: runs of consecutive positions and lone ones, in any order, what
    the mapping holds; out of range refused; nothing of the file mapped in."""
    rows = Spill(np.int32)
    for start in range(0, 1 << 22, 1 << 20):  # 16 MB
        rows.write(np.arange(start, start + (1 << 20), dtype=np.int32))
    index = np.r_[np.arange(10, 50), 7, 3, (1 << 22) - 1, np.arange(5_000_000 // 2, 5_000_000 // 2 + 3)]
    got = rows.take(index)
    assert got.dtype == np.int32 and got.tolist() == index.tolist()
    assert rows.take(np.zeros(0, np.int64)).shape == (0,)
    with pytest.raises(IndexError, match="of 4194304"):
        rows.take(np.asarray([1 << 22]))
    if sys.platform.startswith("linux"):
        give_back()
        before = _rss_mb()
        spread = np.random.default_rng(0).integers(0, 1 << 22, 4096)
        assert rows.take(np.sort(spread)).tolist() == np.sort(spread).tolist()
        assert _rss_mb() - before < 4  # read with pread: no page of the 16 MB file stays in the process
