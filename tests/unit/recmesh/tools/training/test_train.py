"""Training rows: replayed in chunks spilled to disk, written to files, a subset in use."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from recmesh.features.repository import FeatureSet
from recmesh.modeldir import current_model
from recmesh.tools.training import family
from recmesh.tools.training import train as tt
from recmesh.tools.training.family import auc
from recmesh.tools.training.train import Dataset, TrainConfig, build_dataset, demo_source

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


CFG = TrainConfig(epochs=2)


@dataclass(frozen=True)
class Trained:
    ds: Dataset
    fitted: tt.Fitted
    model_dir: Path


@pytest.fixture(scope="module")
def trained(
    demo_feature_set: FeatureSet,
    world: tuple[list, dict, dict],  # type: ignore[type-arg]
    tmp_path_factory: pytest.TempPathFactory,
) -> Trained:
    """The demo world's rows and the family trained on them, once for the module."""
    ds = build_dataset(demo_feature_set, *world)
    model_dir = tmp_path_factory.mktemp("whole")
    return Trained(ds, tt.train(CFG, model_dir, demo_feature_set, ds, progress=lambda _: None), model_dir)


def test_the_blend_probe_is_the_models_full_variant_never_trained_on_the_unseen_rows(
    demo_feature_set: FeatureSet, trained: Trained, tmp_path: Path
) -> None:
    ds, whole, cfg = trained.ds, trained.fitted, CFG
    rows = tt._split_rows(ds, cfg, demo_feature_set)
    probe = whole.probe
    assert probe.rows == len(rows.tr) and probe.variant.level == 0
    assert rows.tr.dtype == rows.ho.dtype == np.int32  # 4 bytes a row, not 8
    assert probe.variant.dense == probe.family.layout.dense  # every input: the served full variant's
    scores = probe.score(np.asarray(ds.x[rows.ho]))
    assert abs(auc(ds.y[rows.ho], scores) - whole.card["metrics"]["auc_holdout"]) <= 5e-5  # the served model
    assert "not_trained_on" not in whole.card["training_data"]
    # Some users' later rows unseen: never trained on, still in the holdout.
    cut = {u: int(np.quantile(ds.t, 0.5)) for u in ds.user_ids[:20]}
    without = tt.train(cfg, tmp_path / "without", demo_feature_set, ds, progress=lambda _: None, unseen=cut)
    kept = tt._split_rows(ds, cfg, demo_feature_set, cut)
    dropped = np.setdiff1d(rows.tr, kept.tr)
    assert len(dropped) and not len(np.setdiff1d(kept.tr, rows.tr))
    assert np.array_equal(kept.ho, rows.ho) and kept.split == rows.split
    assert (ds.t[dropped] >= int(np.quantile(ds.t, 0.5))).all()
    assert without.probe.rows == len(kept.tr) == probe.rows - len(dropped)
    assert kept.left_out == len(dropped) and kept.used == rows.used - len(dropped)
    left = without.card["training_data"]["not_trained_on"]
    assert left["users"] == 20 and left["rows"] == len(dropped)
    assert without.card["training_data"]["holdout_rows"] == whole.card["training_data"]["holdout_rows"]


def test_the_split_read_a_chunk_of_rows_at_a_time_is_the_split_of_the_whole_columns(
    demo_feature_set: FeatureSet, world: tuple[list, dict, dict], tmp_path: Path,  # type: ignore[type-arg]
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    ds = build_dataset(demo_feature_set, *world, rows_dir=tmp_path, chunk_rows=500)
    assert isinstance(ds.t, np.memmap)
    t, users = np.array(ds.t), np.array(ds.users)
    cut = {u: int(np.quantile(t, 0.6)) for u in ds.user_ids[::3]}
    monkeypatch.setattr(tt, "SPLIT_CHUNK", 101)  # many chunks, users' rows across them
    monkeypatch.setattr(family, "QUANTILE_BINS", 8)  # the quantiles narrowed over several passes
    monkeypatch.setattr(family, "QUANTILE_GATHER", 10)
    got = tt._split_rows(ds, CFG, demo_feature_set, cut)
    # the same split from the whole columns at once (as before chunks)
    split = int(np.quantile(t, 1 - CFG.holdout_fraction))
    limit = np.asarray([cut.get(u, np.iinfo(np.int64).max) for u in ds.user_ids], np.int64)
    tr, ho = (t <= split) & (t < limit[users]), t > split
    used = tr | ho
    assert got.split == split and len(t) > 10 * 101
    assert np.array_equal(got.tr, np.flatnonzero(tr)) and np.array_equal(got.ho, np.flatnonzero(ho))
    assert np.array_equal(got.newest, np.flatnonzero(tr & (t > np.quantile(t[tr], 0.9))))
    assert (got.from_ms, got.to_ms) == (int(t[used].min()), int(t[used].max()))
    assert got.used == int(used.sum()) and got.left_out == int((~used).sum()) > 0
    assert got.positive_rate == float(np.array(ds.y)[used].mean())
    # each part's row numbers a file beside the rows (nothing kept per row), the labels the rows' own
    for part, name in ((got.tr, "train"), (got.ho, "holdout"), (got.newest, "newest")):
        assert isinstance(part, np.memmap) and Path(str(part.filename)) == tmp_path / f"part-{name}.npy"
        assert part.dtype == np.int32
    assert got.y is ds.y and got.w is ds.w
    again = tt._split_rows(ds, CFG, demo_feature_set)  # a second split: the first keeps its own files
    assert np.array_equal(got.tr, np.flatnonzero(tr)) and len(again.tr) > len(got.tr)


def test_the_offline_only_baseline_is_a_version_beside_the_model_never_current(
    demo_feature_set: FeatureSet, trained: Trained
) -> None:
    ds, card, tmp_path = trained.ds, trained.fitted.card, trained.model_dir
    base = card["offline_only_version"]
    assert current_model(tmp_path) == tmp_path / "ctr" / card["version"] != tmp_path / "ctr" / base
    base_card = json.loads((tmp_path / "ctr" / base / "card.json").read_text())
    assert base_card["origin"] == tt.OFFLINE_ONLY
    assert base_card["feature_set_version"] == card["feature_set_version"]
    assert base_card["metrics"]["auc_holdout"] == card["metrics"]["auc_holdout_offline_only"]
    assert [v["level"] for v in base_card["variants"]] == [0]
    assert not base_card["variants"][0]["cross_features"]
    assert base_card["input"] == card["input"], "it reads the model's input row"
    # What it scores does not move with the real-time features' columns, and the model's does.
    kinds = {t.feature: getattr(demo_feature_set.by_name.get(t.feature), "kind", None) for t in ds.transforms}
    realtime = [card["input"]["columns"].index(c) for t in ds.transforms if kinds[t.feature] == "realtime"
                for c in t.columns]  # fmt: skip
    assert realtime
    rows = np.asarray(ds.x[:256], np.float32)
    moved = rows.copy()
    moved[:, realtime] += np.random.default_rng(0).normal(0, 3, (len(rows), len(realtime))).astype(np.float32)

    def scores(version: str, x: np.ndarray) -> np.ndarray:
        session = ort.InferenceSession(str(tmp_path / "ctr" / version / "model.onnx"))
        return np.asarray(session.run(None, {"features": x})[0])

    assert np.array_equal(scores(base, rows), scores(base, moved))
    assert not np.allclose(scores(card["version"], rows), scores(card["version"], moved))


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


def test_with_two_jobs_the_baseline_trains_in_a_second_process_and_is_the_same_model(
    demo_feature_set: FeatureSet, trained: Trained, tmp_path: Path
) -> None:
    """--jobs 2: the offline-only baseline trains in a forked process beside the
    family; both exports are the ones one process makes, byte for byte."""
    lines = tmp_path / "progress.txt"

    def say(line: str) -> None:
        with lines.open("a") as out:
            out.write(f"{os.getpid()} {line}\n")

    two = tt.train(CFG, tmp_path / "two", demo_feature_set, trained.ds, progress=say, jobs=2)
    said = [line.split(" ", 1) for line in lines.read_text().splitlines()]
    of_baseline = ("training baseline", "  holdout AUC")
    baseline = [int(pid) for pid, text in said if text.startswith(of_baseline)]
    assert len(baseline) == 2 and os.getpid() not in baseline  # the baseline's lines: another process's
    one = trained.fitted.card
    assert two.card["version"] == one["version"]
    assert two.card["offline_only_version"] == one["offline_only_version"]
    assert two.card["metrics"] == one["metrics"]
    for version in (one["version"], one["offline_only_version"]):
        want = (trained.model_dir / "ctr" / version / "model.onnx").read_bytes()
        assert (tmp_path / "two" / "ctr" / version / "model.onnx").read_bytes() == want, version
