"""Reading py-spy's collapsed stacks into top frames (recmesh.tools.bench.profile)."""

from __future__ import annotations

from pathlib import Path

import pytest

from recmesh.tools.bench.profile import top_frames


def test_top_frames_by_own_and_total_time(tmp_path: Path) -> None:
    folded = tmp_path / "ranker.folded"
    folded.write_text(
        "process 1:python -m services.ranker;thread (0x1);run (/work/main/recmesh/eventloop.py:40);"
        "fuse (/work/main/services/ranker/fusion.py:10) 6\n"
        "process 1:python -m services.ranker;thread (0x1);run (/work/main/recmesh/eventloop.py:41);"
        "select (/usr/lib/python3.11/selectors.py:468) 3\n"
        "process 1:python -m services.ranker;thread (0x1);run (/work/main/recmesh/eventloop.py:40);"
        "fuse (/work/main/services/ranker/fusion.py:12);sorted (x/site-packages/foo/bar.py:3) 1\n"
        "not a stack line\n"
    )
    frames = top_frames(folded, n=3)
    assert frames.samples == 10
    assert frames.own[0] == ("fuse (services/ranker/fusion.py)", 0.6), "lines of one function are one row"
    assert ("select (/usr/lib/python3.11/selectors.py)", 0.3) in frames.own
    assert ("sorted (foo/bar.py)", 0.1) in frames.own, "paths after site-packages/"
    total = dict(frames.total)
    assert total == {"run (recmesh/eventloop.py)": 1.0, "fuse (services/ranker/fusion.py)": 0.7}, (
        "total time counts our frames once per stack"
    )


def test_py_spy_is_found_beside_the_interpreter_without_an_activated_venv(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import sys

    from recmesh.errors import FailedPrecondition
    from recmesh.tools.bench.profile import py_spy

    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    fake_python = tmp_path / "venv" / "bin" / "python"
    fake_python.parent.mkdir(parents=True)
    monkeypatch.setattr(sys, "executable", str(fake_python))
    with pytest.raises(FailedPrecondition, match="needs py-spy"):
        py_spy()
    (fake_python.parent / "py-spy").touch()
    assert py_spy() == str(fake_python.parent / "py-spy")


def test_full_filenames_are_shown_from_their_root_so_our_frames_are_told_apart() -> None:
    """py-spy's own shortening writes services/ranker/pipeline.py as ranker/pipeline.py;
    recorded with full filenames, each path is cut at the longest root that holds it."""
    import sysconfig

    from recmesh.tools.bench.profile import ROOTS, _frame

    checkout = str(Path(__file__).resolve().parents[5])
    stdlib = sysconfig.get_paths()["stdlib"]
    assert checkout in ROOTS and stdlib in ROOTS
    assert _frame(f"rank ({checkout}/services/ranker/pipeline.py:9)") == "rank (services/ranker/pipeline.py)"
    assert _frame(f"select ({stdlib}/selectors.py:468)") == "select (selectors.py)"
    assert (
        _frame("x (/elsewhere/.venv/lib/python3.11/site-packages/grpc/aio/_call.py:3)")
        == "x (grpc/aio/_call.py)"
    )
    assert _frame("y (/other/checkout/services/feature/store.py:1)") == "y (services/feature/store.py)"
