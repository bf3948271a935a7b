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
