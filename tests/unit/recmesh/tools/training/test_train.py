"""Training rows: replayed in chunks spilled to disk, written to files, a subset in use."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from recmesh.features.repository import FeatureSet
from recmesh.tools.training import train as tt
from recmesh.tools.training.family import auc
from recmesh.tools.training.train import TrainConfig, build_dataset, demo_source, rows_before

SMALL = TrainConfig(sessions=150, hours=0.5)


@pytest.fixture(scope="module")
def world() -> tuple[list, dict, dict]:  # type: ignore[type-arg]
    return demo_source(SMALL)


def test_rows_spilled_in_chunks_to_files_are_the_rows_built_in_memory(
    tmp_path: Path,
    demo_feature_set: FeatureSet,
    world: tuple[list, dict, dict],  # type: ignore[type-arg]
) -> None:
    events, users, items = world
    whole = build_dataset(demo_feature_set, events, users, items)
    lines: list[str] = []
    chunked = build_dataset(demo_feature_set, events, users, items, rows_dir=tmp_path, chunk_rows=97,
                            say=lines.append)  # fmt: skip
    assert len(whole.y) > 5 * 97  # several chunks went to disk
    assert chunked.transforms == whole.transforms  # planned from the same statistics
    assert isinstance(chunked.x, np.memmap) and Path(str(chunked.x.filename)).parent == tmp_path
    for name in ("x", "y", "t", "users"):
        assert np.array_equal(np.asarray(getattr(chunked, name)), getattr(whole, name)), name
    assert chunked.user_ids == whole.user_ids
    assert (chunked.w is None) == (whole.w is None)
    assert not list(tmp_path.glob(".examples-*"))  # the spilled examples are gone
    assert lines and lines[-1].startswith("  rows [##########]")


def test_rows_before_leaves_out_the_listed_users_rows_from_their_cut_without_copying(
    demo_feature_set: FeatureSet,
    world: tuple[list, dict, dict],  # type: ignore[type-arg]
) -> None:
    events, users, items = world
    ds = build_dataset(demo_feature_set, events, users, items)
    user = ds.user_ids[3]
    mine = np.flatnonzero(ds.users == 3)
    cut = int(np.median(ds.t[mine]))
    probe = rows_before(ds, {user: cut})
    assert probe.x is ds.x
    expected = ~((ds.users == 3) & (ds.t >= cut))
    assert np.array_equal(probe.in_use, expected) and 0 < (~expected).sum() < len(mine)
    # The split and the training rows are those of the rows copied out, in order.
    cfg = TrainConfig()
    rows = tt._split_rows(probe, cfg, demo_feature_set)
    copied = tt.Dataset(ds.transforms, ds.x[expected], ds.y[expected], ds.t[expected])
    old = tt._split_rows(copied, cfg, demo_feature_set)
    assert rows.split == old.split
    assert np.array_equal(ds.x[rows.tr], copied.x[old.tr]) and np.array_equal(ds.x[rows.ho], copied.x[old.ho])
    # A second cut narrows the rows in use further, never widens them.
    narrower = rows_before(probe, {ds.user_ids[4]: int(ds.t.min())})
    assert not (narrower.in_use & ~probe.in_use).any() and (~narrower.in_use & probe.in_use).any()


def test_the_blend_probe_is_the_full_variant_trained_on_the_rows_in_use_only(
    demo_feature_set: FeatureSet,
    world: tuple[list, dict, dict],  # type: ignore[type-arg]
) -> None:
    events, users, items = world
    ds = build_dataset(demo_feature_set, events, users, items)
    cfg = TrainConfig(epochs=2)
    whole = tt.train_probe(cfg, demo_feature_set, ds, progress=lambda _: None)
    rows = tt._split_rows(ds, cfg, demo_feature_set)
    assert whole.rows == int(rows.tr.sum()) and whole.variant.level == 0
    assert whole.variant.dense == whole.family.layout.dense  # every input: the served full variant's
    scores = whole.score(np.asarray(ds.x[rows.ho]))
    assert scores.shape == (int(rows.ho.sum()),)
    assert auc(ds.y[rows.ho], scores) > 0.6  # it ranks: the blend's tuning reads its order
    # Without some users' later rows: fewer rows trained on, and never theirs.
    cut = {u: int(np.median(ds.t)) for u in ds.user_ids[:20]}
    without = tt.train_probe(cfg, demo_feature_set, rows_before(ds, cut), progress=lambda _: None)
    assert without.rows < whole.rows


def test_a_rows_file_is_written_in_order_and_complete(tmp_path: Path) -> None:
    col = tt._Column((5, 2), np.float32, tmp_path / "x.npy")
    col.put(0, [[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="written in order"):
        col.put(3, [[0, 0]])
    col.put(2, [[5, 6], [7, 8], [9, 10]])
    done = col.done()
    assert isinstance(done, np.memmap) and not done.flags.writeable
    assert np.array_equal(done, np.arange(1, 11, dtype=np.float32).reshape(5, 2))
    short = tt._Column((3,), np.int64, tmp_path / "t.npy")
    short.put(0, [1])
    with pytest.raises(ValueError, match="1 rows written of 3"):
        short.done()
