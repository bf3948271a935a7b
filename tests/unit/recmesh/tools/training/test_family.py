"""The embedding model family: ONNX exports match the NumPy model per variant,
training is deterministic, prefixes and masks really shrink each variant.

The family is generic over its inputs' layout (vectorize.Transform roles), so
these tests build a small synthetic set of transforms rather than the demo's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import pytest

from recmesh.features.vectorize import Transform
from recmesh.tools.training import family
from recmesh.tools.training.family import (
    Layout,
    Variant,
    auc,
    choose_level2_dim,
    make_variants,
    offline_only,
    pick_level1,
    read_column,
    take_rows,
    to_onnx,
    train_family,
    trained_configs,
    variant_weights,
)

F32 = npt.NDArray[np.float32]
CATS = ("news", "food", "music", "sports", "travel", "tech")
BUCKETS = 512
TRANSFORMS = (
    Transform("value", "ctr", "item", "i_ctr"),
    Transform("value", "n1", "user", "u_noise1"),
    Transform("log1p", "n2", "item", "i_noise2"),
    Transform("value", "n3", "user", "u_noise3"),
    Transform("value", "n4", "item", "i_noise4"),
    Transform("share", "cat_clicks", "user", "u_share", of="category"),  # dense, reads both sides
    Transform("one_hot", "category", "item", "i_category", vocabulary=CATS, role="item_attr"),
    Transform("distribution", "cat_clicks", "user", "u_intent", vocabulary=CATS, role="intent"),
    Transform("hash_bucket", "item_id", "item", "i_id_bucket", buckets=BUCKETS, role="item_id"),
)
LAYOUT = Layout.of(TRANSFORMS)


def col(name: str) -> int:
    return LAYOUT.columns.index(name)


def synthetic(n: int, seed: int) -> tuple[F32, F32]:
    """Rows in LAYOUT: dense noise, valid ids, a one-hot category and category
    shares; the label depends on a dense column and on the user's share of the
    item's category."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, len(LAYOUT.columns))).astype(np.float32)
    cats = rng.integers(0, len(CATS), n)
    x[:, col("i_id_bucket")] = rng.integers(0, BUCKETS, n)
    attr = list(LAYOUT.attr_cols)
    x[:, attr] = 0.0
    x[np.arange(n), np.array(attr)[cats]] = 1.0
    shares = rng.dirichlet(np.ones(len(CATS)), n).astype(np.float32)
    x[:, list(LAYOUT.intent_cols)] = shares
    match = shares[np.arange(n), cats]
    x[:, col("u_share")] = match
    logit = 3 * (x[:, col("i_ctr")] - 0.5) + 8 * (match - match.mean())
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return x, y


def test_layout_follows_the_roles() -> None:
    assert LAYOUT.columns[:6] == ("i_ctr", "u_noise1", "i_noise2", "u_noise3", "i_noise4", "u_share")
    assert LAYOUT.dense == LAYOUT.columns[:6] and LAYOUT.cross_dense == ("u_share",)
    assert LAYOUT.attr_cols == tuple(range(6, 12)) and LAYOUT.intent_cols == tuple(range(12, 18))
    assert (LAYOUT.id_col, LAYOUT.buckets) == (18, BUCKETS) and LAYOUT.has_cross
    assert LAYOUT.columns[6] == "i_category=news" and LAYOUT.columns[12] == "u_intent=news"


def test_auc_matches_definition() -> None:
    y = np.array([0, 0, 1, 1], np.float32)
    assert auc(y, np.array([0.1, 0.4, 0.35, 0.8], np.float32)) == 0.75
    assert auc(y, np.array([0.5, 0.5, 0.5, 0.5], np.float32)) == 0.5
    assert np.isnan(auc(np.ones(3, np.float32), np.array([0.1, 0.2, 0.3], np.float32)))


def test_level1_keeps_the_more_predictive_half() -> None:
    x, y = synthetic(3000, 0)
    level1 = pick_level1(x, y, LAYOUT)
    assert len(level1) == len(LAYOUT.dense) // 2
    assert {"i_ctr", "u_share"} <= set(level1)  # the planted signal
    assert list(level1) == [c for c in LAYOUT.dense if c in level1]  # layout order


def _variants(x: F32, y: F32) -> tuple[Variant, ...]:
    return make_variants(LAYOUT, pick_level1(x, y, LAYOUT))


def test_training_is_deterministic_and_every_export_matches_numpy() -> None:
    x, y = synthetic(3000, 0)
    variants = _variants(x, y)
    configs = trained_configs(variants)
    a = train_family(x, y, LAYOUT, configs, epochs=2, seed=3)
    b = train_family(x, y, LAYOUT, configs, epochs=2, seed=3)
    for key, value in a.params.items():
        assert np.array_equal(value, b.params[key]), key
    c = train_family(x, y, LAYOUT, configs, epochs=2, seed=4)
    assert not np.array_equal(a.params["w_dense"], c.params["w_dense"])  # the seed matters
    probe = x[:64].copy()
    probe[0, col("i_id_bucket")] = 1e9  # out-of-range ids are clipped, never an error
    probe[1, col("i_id_bucket")] = -5
    for variant in (*variants, offline_only(LAYOUT, {"i_ctr"})):
        session = ort.InferenceSession(
            to_onnx(a, variant).SerializeToString(), providers=["CPUExecutionProvider"]
        )
        got = session.run(None, {"features": probe})[0]
        assert got.shape == (64,)
        np.testing.assert_allclose(got, a.predict(probe, variant), rtol=1e-4, atol=1e-5)
    assert auc(y, a.predict(x, variants[0])) > 0.65  # learns the planted signal (chance is 0.5)


def test_variants_carry_only_what_they_use() -> None:
    x, y = synthetic(500, 1)
    variants = _variants(x, y)
    model = train_family(x, y, LAYOUT, trained_configs(variants), epochs=1)
    full, sampled, small, nocross = (variant_weights(model, v) for v in variants)
    assert [v.dim for v in variants] == [128, 128, 32, 8]
    assert [v.cross for v in variants] == [True, True, True, False]
    assert full["e_item"].shape == (BUCKETS, 128) and small["e_item"].shape == (BUCKETS, 32)
    assert full["e_cat"].shape == (len(CATS), 128) and nocross["e_cat"].shape == (len(CATS), 8)
    assert full["u_cat"].shape == (len(CATS), 128) and small["u_cat"].shape == (len(CATS), 32)
    assert nocross["e_item"].shape == (BUCKETS, 8) and "u_cat" not in nocross and "w_cross" not in nocross
    assert sampled["w_dense"].shape[0] == len(variants[1].dense) == full["w_dense"].shape[0] // 2
    # Level 3 also drops the dense columns that read both sides.
    assert "u_share" in variants[2].dense and "u_share" not in variants[3].dense
    assert nocross["w_dense"].shape[0] == len(variants[2].dense) - 1
    # A prefix is a slice of the one trained table, not a separate model.
    assert np.array_equal(small["e_item"], full["e_item"][:, :32])
    assert np.array_equal(nocross["e_cat"], full["e_cat"][:, :8])
    # The graphs shrink with them.
    sizes = [len(to_onnx(model, v).SerializeToString()) for v in variants]
    assert sizes[0] > sizes[1] > sizes[2] > sizes[3]


def test_trained_configs_add_the_level1_prefixes() -> None:
    x, y = synthetic(500, 2)
    variants = _variants(x, y)
    configs = trained_configs(variants)
    assert [(c.level, c.dim) for c in configs] == [(0, 128), (1, 128), (2, 32), (2, 16), (2, 8), (3, 8)]
    assert all(c.dense == variants[1].dense for c in configs[1:5])


def test_level2_serves_the_smallest_prefix_the_data_supports() -> None:
    assert choose_level2_dim({128: 0.880, 32: 0.879, 16: 0.877, 8: 0.84}) == 16
    assert choose_level2_dim({128: 0.880, 32: 0.86, 16: 0.85, 8: 0.84}) == 128
    assert choose_level2_dim({128: float("nan"), 32: float("nan")}) == 128  # one class: keep the full size


def test_the_history_embedding_learns_item_to_item_and_exports() -> None:
    """Items fall in 8 clusters of buckets; a user's recent items come from one
    cluster and they pick items of it. Only the history vector can see that:
    with it the family learns it, without it it cannot; the ONNX graph
    matches NumPy, short histories (-1 past the end) included."""
    history = Transform(
        "id_sequence", "recent", "user", "u_recent", buckets=BUCKETS, length=5, role="history"
    )
    transforms = (TRANSFORMS[0], TRANSFORMS[-1], history)
    layout = Layout.of(transforms)
    assert layout.history_cols == (2, 3, 4, 5, 6) and layout.has_history and layout.has_cross
    rng = np.random.default_rng(7)
    n, per = 6000, BUCKETS // 8
    cluster = rng.integers(0, 8, n)
    x = np.full((n, len(layout.columns)), -1.0, np.float32)
    x[:, 0] = rng.random(n)
    same = rng.random(n) < 0.5
    item_cluster = np.where(same, cluster, (cluster + rng.integers(1, 8, n)) % 8)
    x[:, 1] = item_cluster * per + rng.integers(0, per, n)
    lengths = rng.integers(1, 6, n)
    for r in range(n):
        x[r, 2 : 2 + lengths[r]] = cluster[r] * per + rng.integers(0, per, lengths[r])
    y = (rng.random(n) < np.where(same, 0.8, 0.1)).astype(np.float32)
    variants = make_variants(layout, pick_level1(x, y, layout))
    configs = trained_configs(variants)
    model = train_family(
        x[:5000], y[:5000], layout, configs, epochs=20, batch_size=512, lr=0.03, l2_embedding=1e-4, seed=1
    )
    with_history, without = variants[1], variants[3]
    assert with_history.cross and not without.cross
    assert auc(y[5000:], model.predict(x[5000:], with_history)) > 0.65
    assert auc(y[5000:], model.predict(x[5000:], without)) < 0.58
    session = ort.InferenceSession(
        to_onnx(model, with_history).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    np.testing.assert_allclose(
        session.run(None, {"features": x[:64]})[0], model.predict(x[:64], with_history), rtol=1e-4, atol=1e-5
    )


def test_offline_only_drops_realtime_columns_and_the_cross() -> None:
    base = offline_only(LAYOUT, {"i_ctr", "u_share"})
    assert base.dense == ("u_noise1", "i_noise2", "u_noise3", "i_noise4") and not base.cross


def test_a_layout_without_attribute_or_intent_has_no_cross() -> None:
    transforms = (*TRANSFORMS[:5], TRANSFORMS[-1])
    layout = Layout.of(transforms)
    assert not layout.has_cross and layout.attr_cols == () and layout.intent_cols == ()
    rng = np.random.default_rng(5)
    x = rng.random((400, len(layout.columns))).astype(np.float32)
    x[:, layout.id_col or 0] = rng.integers(0, BUCKETS, 400)
    y = (x[:, 0] > 0.5).astype(np.float32)
    variants = make_variants(layout, pick_level1(x, y, layout))
    assert not any(v.cross for v in variants)
    model = train_family(x, y, layout, trained_configs(variants), epochs=1)
    assert "e_cat" not in variant_weights(model, variants[0])
    session = ort.InferenceSession(
        to_onnx(model, variants[3]).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    np.testing.assert_allclose(
        session.run(None, {"features": x[:16]})[0], model.predict(x[:16], variants[3]), rtol=1e-4, atol=1e-5
    )


def test_masked_columns_do_not_change_a_variants_score() -> None:
    """A variant reads only its own dense columns (and the cross only when it has
    one): changing the others leaves its scores alone, while the full model moves."""
    x, y = synthetic(600, 3)
    variants = _variants(x, y)
    model = train_family(x, y, LAYOUT, trained_configs(variants), epochs=1)
    full, nocross = variants[0], variants[3]
    dropped = [c for c in LAYOUT.dense if c not in nocross.dense]
    assert dropped
    changed = x[:32].copy()
    for c in dropped:
        changed[:, col(c)] += 10.0
    np.testing.assert_array_equal(model.predict(changed, nocross), model.predict(x[:32], nocross))
    assert not np.allclose(model.predict(changed, full), model.predict(x[:32], full))
    shuffled = x[:32].copy()
    shuffled[:, list(LAYOUT.intent_cols)] = shuffled[::-1][:, list(LAYOUT.intent_cols)]
    np.testing.assert_array_equal(model.predict(shuffled, nocross), model.predict(x[:32], nocross))
    assert not np.allclose(model.predict(shuffled, full), model.predict(x[:32], full))


def test_auc_averages_tied_ranks_as_the_pairwise_definition_does() -> None:
    rng = np.random.default_rng(5)
    y = (rng.random(400) < 0.3).astype(np.float32)
    score = rng.integers(0, 12, 400).astype(np.float32)  # many ties
    pos, neg = score[y == 1], score[y == 0]
    pairwise = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (
        len(pos) * len(neg)
    )
    assert np.isclose(auc(y, score), pairwise)


def _ranked_auc(y: F32, score: F32) -> float:
    """The ranks' AUC (Mann-Whitney over averaged ranks of every row), as auc
    computed it before it placed positives among the negatives."""
    order = np.argsort(score, kind="mergesort")
    ordered = score[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(score)] - 1
    ranks = np.empty(len(score), np.float64)
    ranks[order] = np.repeat((starts + ends) / 2 + 1, ends - starts + 1)
    pos = y == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def test_auc_is_the_ranks_auc_bit_for_bit_a_chunk_of_positives_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """auc sorts each class apart and counts, for each positive, the negatives
    below and level with it: the very float the averaged ranks give, with ties
    of every kind and the positives taken several chunks at a time."""
    monkeypatch.setattr(family, "AUC_CHUNK", 37)
    rng = np.random.default_rng(11)
    for n, levels in ((2, 0), (50, 3), (999, 0), (5000, 20), (20000, 2)):
        y = (rng.random(n) < 0.3).astype(np.float32)
        y[:2] = (0, 1)
        score = rng.random(n).astype(np.float32)
        if levels:
            score = np.round(score * levels).astype(np.float32)
        assert auc(y, score) == _ranked_auc(y, score), (n, levels)


def test_labels_weights_and_row_numbers_as_files_train_the_same_model_bit_for_bit(tmp_path: Path) -> None:
    """train._split_rows writes each part's row numbers beside the rows and
    leaves the labels and weights in theirs: the family reads a group's labels,
    weights and row numbers from the files (gather, read_blocks, take_rows) and
    trains the model the arrays in memory train, to the bit; predictions and the
    level-1 choice over a part given as a file are the same too."""
    x, y = synthetic(3000, 1)
    w = np.random.default_rng(2).random(3000).astype(np.float32) + 0.5
    rows = np.flatnonzero(np.arange(3000) % 3 != 0).astype(np.int32)
    for name, values in (("x", x), ("y", y), ("w", w), ("rows", rows)):
        np.save(tmp_path / f"{name}.npy", values)
    fx, fy, fw, frows = (np.load(tmp_path / f"{name}.npy", mmap_mode="r") for name in ("x", "y", "w", "rows"))
    configs = trained_configs(_variants(x, y))
    a = train_family(fx, fy, LAYOUT, configs, epochs=2, seed=3, weights=fw, rows=frows)
    b = train_family(x, y, LAYOUT, configs, epochs=2, seed=3, weights=w, rows=rows)
    for key, value in a.params.items():
        assert value.tobytes() == b.params[key].tobytes(), key
    v = configs[0]
    assert a.predict(fx, v, frows).tobytes() == a.predict(x, v, rows).tobytes()
    assert pick_level1(fx, fy, LAYOUT, frows) == pick_level1(x, y, LAYOUT, rows)
    assert np.array_equal(family.gather(fy, frows), y[rows])
    sample = np.r_[0, 5, 6, 7, 1999]
    assert np.array_equal(family.gather_sorted(frows, sample), rows[sample])
    blocks = [3, 0, 15, 7]  # the last block short: 2,000 rows in blocks of 128
    want = np.concatenate([rows[b * 128 : (b + 1) * 128] for b in blocks])
    got = family.read_blocks(frows, blocks, 128)
    assert np.array_equal(got, want) and got.dtype == np.int32 and not isinstance(got, np.memmap)


def test_training_from_a_mapped_file_and_a_row_subset_is_the_training_in_memory(tmp_path: Path) -> None:
    """x may be a file mapped in (the rows `recmesh train` writes to disk) and the
    rows a subset of it: the model is the one trained on the copied rows, and
    predictions over a subset match, whatever the chunking."""
    x, y = synthetic(3000, 1)
    w = np.random.default_rng(2).random(3000).astype(np.float32) + 0.5
    rows = np.flatnonzero(np.arange(3000) % 3 != 0)
    np.save(tmp_path / "x.npy", x)
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    configs = trained_configs(_variants(x, y))
    a = train_family(mapped, y, LAYOUT, configs, epochs=2, seed=3, weights=w, rows=rows)
    b = train_family(x[rows], y[rows], LAYOUT, configs, epochs=2, seed=3, weights=w[rows])
    for key, value in a.params.items():
        np.testing.assert_allclose(value, b.params[key], rtol=1e-5, atol=1e-6, err_msg=key)
    v = configs[0]
    np.testing.assert_allclose(a.predict(mapped, v, rows), a.predict(x[rows], v), rtol=1e-6)
    assert pick_level1(mapped, y, LAYOUT, rows) == pick_level1(x[rows], y[rows], LAYOUT)


def test_rows_of_a_mapped_file_are_read_not_mapped(tmp_path: Path) -> None:
    """take_rows gives x[index] for any index (runs, repeats, out of order, none),
    reading a whole mapped .npy file's rows with pread into memory of its own;
    a view of a mapping (not the whole file) is indexed as it is."""
    x = np.random.default_rng(0).random((5000, 7), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    rng = np.random.default_rng(1)
    for index in (rng.permutation(5000)[:1024], np.arange(100, 3000), np.r_[7, 8, 9, 3, 3, 4999, 0],
                  np.zeros(0, np.int64)):  # fmt: skip
        got = take_rows(mapped, index)
        np.testing.assert_array_equal(got, x[index])
        assert not isinstance(got, np.memmap) and got.dtype == np.float32 and got.shape == (len(index), 7)
    for wrong in (np.r_[0, 5000], np.r_[-1, 3]):
        with pytest.raises(IndexError, match="of a 5000-row file"):
            take_rows(mapped, wrong)
    view = mapped[10:]
    np.testing.assert_array_equal(take_rows(view, np.r_[0, 5]), x[[10, 15]])
    np.testing.assert_array_equal(take_rows(x, np.r_[4, 2]), x[[4, 2]])


def test_int32_rows_train_the_same_model_bit_for_bit_as_int64_rows() -> None:
    """The training part as int32 (half the memory a row) gives the very model
    int64 indices give, weighted or not."""
    x, y = synthetic(2500, 4)
    w = np.random.default_rng(5).random(2500).astype(np.float32) + 0.5
    rows = np.flatnonzero(np.arange(2500) % 4 != 1)
    configs = trained_configs(_variants(x, y))
    for weights in (None, w):
        a = train_family(x, y, LAYOUT, configs, epochs=2, seed=6, weights=weights, rows=rows.astype(np.int64))
        b = train_family(x, y, LAYOUT, configs, epochs=2, seed=6, weights=weights, rows=rows.astype(np.int32))
        for key, value in a.params.items():
            assert value.tobytes() == b.params[key].tobytes(), key


def test_an_epoch_reads_every_row_once_a_group_of_shuffled_blocks_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """_groups: each row of the training part once an epoch; a group is
    GROUP_BLOCKS blocks of BLOCK_ROWS consecutive rows, in ascending order (read
    in a few long reads), and the blocks come from all over the part, in a new
    order every epoch."""
    monkeypatch.setattr(family, "BLOCK_ROWS", 10)
    monkeypatch.setattr(family, "GROUP_BLOCKS", 4)
    rows = np.flatnonzero(np.arange(1003) % 7 != 3).astype(np.int32)  # 859 rows: the last block short
    rng = np.random.default_rng(0)
    epochs = [list(family._groups(rows, rng)) for _ in range(2)]
    for groups in epochs:
        assert np.array_equal(np.sort(np.concatenate(groups)), rows)
        assert [len(g) for g in groups[:-1]] == [40] * (len(groups) - 1) and len(groups) == 22
        for g in groups:
            assert np.all(np.diff(g) > 0) and g.dtype == np.int32
            positions = np.searchsorted(rows, g)
            whole = [np.arange(b * 10, min(b * 10 + 10, len(rows))) for b in np.unique(positions // 10)]
            assert np.array_equal(positions, np.concatenate(whole))
    firsts = [[int(np.searchsorted(rows, g[0])) // 10 for g in groups] for groups in epochs]
    assert firsts[0] != firsts[1] and max(b for f in firsts for b in f) > 40


def test_a_mapped_column_is_read_into_memory_of_its_own(tmp_path: Path) -> None:
    t = np.arange(1000, dtype=np.int64) * 7
    np.save(tmp_path / "t.npy", t)
    got = read_column(np.load(tmp_path / "t.npy", mmap_mode="r"))
    assert not isinstance(got, np.memmap) and got.dtype == np.int64 and np.array_equal(got, t)
    assert read_column(t) is t
    part = read_column(np.load(tmp_path / "t.npy", mmap_mode="r")[4:10])  # a view: its own values
    assert not isinstance(part, np.memmap) and part.tolist() == t[4:10].tolist()
    with (tmp_path / "t.npy").open("r+b") as fh:  # cut short after it was mapped
        mapped = np.load(tmp_path / "t.npy", mmap_mode="r")
        fh.truncate(128 + 8 * 500)
        with pytest.raises(OSError, match="cut short"):
            read_column(mapped)


def test_the_summed_gradient_is_the_summed_losss_derivative() -> None:
    """Every configuration adds its part of the embedding tables' gradient into
    one per-row buffer, scattered once a step: the result is the derivative of
    the configurations' summed loss, checked against central differences on
    every parameter (ids repeated within the batch, short histories, attribute
    and intent tables included)."""
    from recmesh.tools.training.family import _Batch, _gradients, _init, _mask

    history = Transform("id_sequence", "recent", "user", "u_recent", buckets=16, length=4, role="history")
    ids = Transform("hash_bucket", "item_id", "item", "i_id_bucket", buckets=16, role="item_id")
    layout = Layout.of((*TRANSFORMS[:-1], ids, history))
    x, y = synthetic_with(layout, 24, seed=3)
    family = trained_configs(make_variants(layout, pick_level1(x, y, layout)))
    rng = np.random.default_rng(0)
    p = {k: v.astype(np.float64) for k, v in _init(rng, layout, 8, float(y.mean())).items()}
    for k in ("w_cross", "w_hcross", "e_item", "e_cat", "u_cat"):  # the cross paths as strong as the rest
        p[k] *= 10.0
    batch = _Batch.of(x, layout, x.mean(axis=0)[layout.dense_idx], x.std(axis=0)[layout.dense_idx] + 1e-6)
    w = rng.uniform(0.5, 1.5, len(y)).astype(np.float32)
    for configs in (family, family[-1:]):  # and without the cross: no history read, none scattered
        masks = [_mask(layout, c) for c in configs]
        grads, _ = _gradients(p, batch, configs, masks, y, w)  # type: ignore[arg-type]
        eps = 1e-6  # float64 weights: the loss in float64 too
        for name, param in p.items():
            flat = param.reshape(-1)
            for i in {*np.argsort(-np.abs(grads[name].reshape(-1)))[:4], *rng.integers(0, flat.size, 3)}:
                keep = flat[i]
                flat[i] = keep + eps
                up = _gradients(p, batch, configs, masks, y, w)[1]  # type: ignore[arg-type]
                flat[i] = keep - eps
                down = _gradients(p, batch, configs, masks, y, w)[1]  # type: ignore[arg-type]
                flat[i] = keep
                numeric = (up - down) / (2 * eps)
                assert abs(numeric - grads[name].reshape(-1)[i]) <= 1e-5 + 1e-3 * abs(numeric), (name, i)


def synthetic_with(layout: Layout, n: int, seed: int) -> tuple[F32, F32]:
    """Rows in `layout` (TRANSFORMS' dense, attribute and intent columns, a
    16-bucket item id and a 4-long history, -1 past its end)."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, len(layout.columns))).astype(np.float32)
    x[:, layout.id_col] = rng.integers(0, 16, n)
    attr = list(layout.attr_cols)
    x[:, attr] = 0.0
    x[np.arange(n), np.array(attr)[rng.integers(0, len(CATS), n)]] = 1.0
    x[:, list(layout.intent_cols)] = rng.dirichlet(np.ones(len(CATS)), n)
    hist = np.array(layout.history_cols)
    x[:, hist] = rng.integers(0, 16, (n, len(hist)))
    x[:, hist[2:]] = np.where(rng.random((n, 2)) < 0.5, -1.0, x[:, hist[2:]])
    y = (rng.random(n) < 0.4).astype(np.float32)
    return x, y


def test_an_adam_step_in_place_is_the_expression_bit_for_bit() -> None:
    """`_adam` updates p, m and s in place with the very float32 operations of
    the textbook expression, in its order: the same bits, step after step."""
    from recmesh.tools.training.family import _adam

    rng = np.random.default_rng(8)
    p = rng.standard_normal((64, 16)).astype(np.float32)
    m, s = np.zeros_like(p), np.zeros_like(p)
    want_p, want_m, want_s = p.copy(), m.copy(), s.copy()
    for step in range(1, 40):
        g = (rng.standard_normal(p.shape) * 10.0 ** rng.integers(-6, 2)).astype(np.float32)
        g[rng.random(p.shape) < 0.3] = 0.0  # rows a batch did not touch
        _adam(p, m, s, g, 0.01, step)
        want_m = 0.9 * want_m + 0.1 * g
        want_s = 0.999 * want_s + 0.001 * g * g
        mhat, shat = want_m / (1 - 0.9**step), want_s / (1 - 0.999**step)
        want_p = (want_p - 0.01 * mhat / (np.sqrt(shat) + 1e-8)).astype(np.float32)
        for got, want in ((p, want_p), (m, want_m), (s, want_s)):
            assert got.dtype == want.dtype == np.float32
            assert got.tobytes() == want.tobytes(), step


@pytest.mark.parametrize("seed", range(40))
def test_quantile_of_chunks_is_numpys_to_the_bit(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """family.quantile reads a column a chunk at a time and narrows the range
    holding each rank pass by pass (here 16 bins a pass, at most 50 values
    gathered, so most cases take several passes): the same float as
    np.quantile on the whole column, ties, one value, huge ranges and the ends
    included."""
    monkeypatch.setattr(family, "QUANTILE_BINS", 16)
    monkeypatch.setattr(family, "QUANTILE_GATHER", 50)
    rng = np.random.default_rng(seed)
    n = int(rng.choice([1, 2, 3, 17, 1000, 5003]))
    shape = seed % 4
    if shape == 0:  # day-stamped times: a few values, many ties
        column = 1_700_000_000_000 + 86_400_000 * rng.integers(0, 30, n)
    elif shape == 1:  # millisecond times over a year
        column = 1_700_000_000_000 + rng.integers(0, 365 * 86_400_000, n)
    elif shape == 2:  # the widest range an int64 holds, both signs
        column = rng.integers(-(2**62), 2**62, n)
    else:  # one value
        column = np.full(n, 42, np.int64)
    size = int(rng.integers(1, n + 2))
    chunks = lambda: (column[s : s + size] for s in range(0, n, size))  # noqa: E731
    for q in (0.0, 0.1, 0.5, 0.8, 0.9, 1.0, float(rng.random())):
        got = family.quantile(chunks, q)
        want = float(np.quantile(column, q))
        assert got == want or (np.isnan(got) and np.isnan(want)), (n, q, got, want)
