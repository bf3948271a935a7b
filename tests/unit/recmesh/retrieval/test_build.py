"""Learning tables from events: item-kNN, EASE, the tuning split, fusion."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from recmesh.events import Event
from recmesh.features.eventlog import EventTable
from recmesh.retrieval import build as rb


def ev(n: int, user: str, item: str, behavior: str = "view") -> Event:
    return Event(
        event_id=f"e{n}", user_id=user, item_id=item, behavior=behavior, event_time=1_700_000_000_000 + n
    )


def sequences(seqs: dict[str, list[str]], behavior: str = "view") -> list[Event]:
    out = []
    n = 0
    for user, items in seqs.items():
        for item in items:
            out.append(ev(n, user, item, behavior))
            n += 1
    return sorted(out, key=lambda e: (e.event_time, e.event_id))


def test_interactions_collapse_an_item_repeated_at_once_keeping_the_stronger_weight() -> None:
    events = [
        ev(0, "u", "a", "view"),
        ev(1, "u", "a", "buy"),
        ev(2, "u", "b", "view"),
        ev(3, "u", "a", "view"),
    ]
    data = rb.interactions(events, {"view": 1.0, "buy": 3.0})
    assert [data.item_ids[i] for i in data.items] == ["a", "b", "a"]
    assert data.weights.tolist() == [3.0, 1.0, 1.0]
    assert data.histories(5) == {"u": ["a", "b"]}


def test_events_of_behaviours_not_named_do_not_count() -> None:
    data = rb.interactions([ev(0, "u", "a", "impression"), ev(1, "u", "b", "click")], {"click": 1.0})
    assert data.item_ids == ["b"]


@pytest.mark.parametrize("block", [rb.BLOCK, 97])
def test_a_tables_columns_give_the_interactions_its_events_give(
    monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    """The column path (no event made) against the event path, on a random log
    with behaviours of weight 0 and none, repeats, shared times, and on a view
    of the table in another order; the columns read and the users taken a few
    at a time (BLOCK 97: buckets of a few users, users' events across blocks)."""
    monkeypatch.setattr(rb, "BLOCK", block)
    rng = np.random.default_rng(3)
    behaviours = ["view", "cart", "buy", "impression"]
    events = [
        Event(event_id=f"e{n}", user_id=f"u{rng.integers(30)}", item_id=f"i{rng.integers(40)}",
              behavior=behaviours[rng.integers(4)], event_time=1_700_000_000_000 + int(rng.integers(300)))
        for n in range(2000)
    ]  # fmt: skip
    events.sort(key=lambda e: (e.event_time, e.event_id))
    table = EventTable.of(events)
    some = {"view": 1.0, "cart": 2.5, "buy": 4.0, "impression": 0.0}
    every = {"view": 1.0, "cart": 2.5, "buy": 4.0, "impression": 0.5}
    shuffled = table.take(rng.permutation(len(table))[:1500])  # not in time order: sorted by time too
    in_order = table.take(np.flatnonzero(rng.random(len(table)) < 0.7))
    for source, weights in itertools.product((table, shuffled, in_order), (some, every)):
        got, want = rb.interactions(source, weights), rb.interactions(list(source), weights)
        assert got.item_ids == want.item_ids and got.user_ids == want.user_ids
        assert len(got.users) < len(source)  # repeats collapsed
        for name in ("users", "items", "weights"):
            a, b = getattr(got, name), getattr(want, name)
            assert a.dtype == b.dtype and a.tolist() == b.tolist(), name
    assert rb.interactions(EventTable.of(events[:5]), {"click": 1.0}).item_ids == []
    with pytest.raises(ValueError, match="1999 target flags for 2000 events"):
        rb.last_targets(table, np.ones(1999, bool))


def test_the_tuning_split_of_a_tables_columns_is_the_split_of_its_events() -> None:
    """last_targets and holdout from a table's codes against the same from its
    events: the same targets in the same order, lead-ups (a view, a cart, then
    the purchase), training part, histories and seen items; on the whole table,
    on a view of it, with every user drawn and with a sample."""
    rng = np.random.default_rng(8)
    events = []
    for n in range(3000):
        user, item = f"u{rng.integers(60)}", f"i{rng.integers(25)}"
        t = 1_700_000_000_000 + 1000 * int(rng.integers(400))
        for k, behavior in enumerate(("view", "cart", "buy")[: 1 + int(rng.integers(3))]):
            events.append(Event(event_id=f"e{n}-{k}", user_id=user, item_id=item, behavior=behavior,
                                event_time=t + k * int(rng.integers(2))))  # fmt: skip
    events.sort(key=lambda e: (e.event_time, e.event_id))
    table = EventTable.of(events)
    view = table.take(np.flatnonzero(rng.random(len(table)) < 0.8))
    for source in (table, view):
        listed = list(source)
        is_target = np.asarray([ev.behavior == "buy" for ev in listed])
        got, want = rb.last_targets(source, is_target), rb.last_targets(listed, is_target.tolist())
        assert list(got.items()) == list(want.items()) and len(got) > 20
        assert any(lead < t for t, lead in got.values())  # a lead-up before the purchase
        for users in (1000, 15):
            a = rb.holdout(source, is_target, {"view": 1.0, "buy": 3.0}, 5, users, 4, frozenset({"buy"}))
            b = rb.holdout(
                listed, is_target.tolist(), {"view": 1.0, "buy": 3.0}, 5, users, 4, frozenset({"buy"})
            )
            assert (a.targets, a.history, a.seen, a.as_of) == (b.targets, b.history, b.seen, b.as_of)
            assert [ev.event_id for ev in a.training] == [ev.event_id for ev in b.training]
            assert len(a.targets) == min(users, len(got)) and isinstance(a.training, EventTable)


def test_knn_counts_sequential_pairs_within_previous_and_normalises_by_counts() -> None:
    # a then b for three users; c follows b far back for one
    events = sequences({"u1": ["a", "b"], "u2": ["a", "b"], "u3": ["a", "x", "y", "b", "c"]})
    t = rb.knn_table(rb.interactions(events, {"view": 1.0}), previous=1, neighbours=10)
    # previous=1: only adjacent pairs; a-b adjacent twice (u1, u2), a-x once
    ab = dict(t.row("a"))["b"]
    assert np.isclose(ab, 2 / np.sqrt(3 * 3))
    assert "c" not in dict(t.row("a"))
    t3 = rb.knn_table(rb.interactions(events, {"view": 1.0}), previous=4, neighbours=10)
    assert np.isclose(dict(t3.row("a"))["b"], 3 / 3)
    assert "c" in dict(t3.row("a"))


def _whole_lag_pair_sums(data: rb.Interactions, previous: int) -> tuple[np.ndarray, np.ndarray]:
    """The pair sums as one pass per lag makes them (the forward pairs of the
    whole log, then the backward ones), the reference for the blocked sums."""
    n, keys, sums = data.n_items, np.zeros(0, np.int64), np.zeros(0, np.float64)
    inverse: np.ndarray
    for lag in range(1, previous + 1):
        same = data.users[lag:] == data.users[:-lag]
        a, b = data.items[lag:][same], data.items[:-lag][same]
        w = (data.weights[lag:][same] * data.weights[:-lag][same]).astype(np.float64)
        a, b, w = a[a != b], b[a != b], w[a != b]
        keys, inverse = np.unique(np.concatenate([keys, a * n + b, b * n + a]), return_inverse=True)
        sums = np.bincount(inverse, weights=np.concatenate([sums, w, w])).astype(np.float64)
    return keys, sums


@pytest.mark.parametrize("dense", [True, False], ids=["dense", "sparse"])
def test_knn_sums_its_pairs_a_block_at_a_time_to_the_same_float64(
    monkeypatch: pytest.MonkeyPatch, dense: bool
) -> None:
    """Blocks of 7 events give the sums one pass over each lag gives, to the
    bit, with strengths whose sums depend on the order they are added in (1e-16
    added to 1 is lost; added to another 1e-16 first, it is not): summed in
    place at each pair's cell (a small catalog) or merged into running sums."""
    rng = np.random.default_rng(11)
    events = [ev(n, f"u{rng.integers(12)}", f"i{rng.integers(30)}", ("view", "buy", "cart")[n % 3])
              for n in range(600)]  # fmt: skip
    data = rb.interactions(events, {"view": 1e-8, "buy": 1.0, "cart": 0.3})
    want_keys, want_sums = _whole_lag_pair_sums(data, 5)
    monkeypatch.setattr(rb, "PAIR_BLOCK", 7)
    monkeypatch.setattr(rb, "DENSE_PAIR_BYTES", rb.DENSE_PAIR_BYTES if dense else 0)
    keys, sums = rb.pair_sums(data, 5)
    assert keys.tolist() == want_keys.tolist() and len(keys) > 200
    assert sums.tobytes() == want_sums.tobytes()


def test_knn_ranks_dense_rows_as_it_ranks_the_sparse_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dense path (sums at their cells, rows ranked a block at a time) gives
    the table the sparse one gives, to the bit: ties in similarity by column,
    pairs of negative strength never kept, rows cut to their strongest."""
    rng = np.random.default_rng(12)
    behaviours = ("view", "buy", "skip")
    events = [ev(n, f"u{rng.integers(15)}", f"i{rng.integers(150)}", behaviours[n % 3]) for n in range(1500)]
    data = rb.interactions(events, {"view": 1.0, "buy": 2.0, "skip": -0.5})
    monkeypatch.setattr(rb, "ROW_BLOCK", 7)
    tables = []
    for dense_bytes in (rb.DENSE_PAIR_BYTES, 0):
        monkeypatch.setattr(rb, "DENSE_PAIR_BYTES", dense_bytes)
        tables.append(rb.knn_table(data, previous=4, neighbours=40))
    dense, sparse = tables
    for name in ("indptr", "indices", "weights"):
        assert getattr(dense, name).tobytes() == getattr(sparse, name).tobytes(), name
    lengths = np.diff(dense.indptr)
    assert lengths.max() == 40 and lengths.min() < 40 and (dense.weights > 0).all()


def _masked_gram(data: rb.Interactions, keep: np.ndarray, chunk: int) -> np.ndarray:
    """X^T X as a mask over the log per chunk of users makes it (the reference)."""
    m = len(keep)
    col = np.full(data.n_items, -1, np.int64)
    col[keep] = np.arange(m)
    c = col[data.items]
    users, cols, w = data.users[c >= 0], c[c >= 0], data.weights[c >= 0]
    g = np.zeros((m, m), np.float64)
    uniq = np.unique(users)
    for start in range(0, len(uniq), chunk):
        part = uniq[start : start + chunk]
        sel = (users >= part[0]) & (users <= part[-1])
        x = np.zeros((len(part), m), np.float32)
        np.maximum.at(x, (np.searchsorted(part, users[sel]), cols[sel]), w[sel])
        g += (x.T @ x).astype(np.float64)
    return g


@pytest.mark.parametrize("cells", [rb.GRAM_CELLS, 100])
def test_the_gram_matrix_of_user_slices_is_the_masked_ones(
    monkeypatch: pytest.MonkeyPatch, cells: int
) -> None:
    """Chunks of users as slices of the interactions (in user order) give the
    Gram matrix a mask per chunk gives, to the bit; every item kept or some."""
    rng = np.random.default_rng(5)
    events = [
        ev(n, f"u{rng.integers(40)}", f"i{rng.integers(25)}", ("view", "buy")[n % 2]) for n in range(900)
    ]
    data = rb.interactions(events, {"view": 0.3, "buy": 1.0})
    monkeypatch.setattr(rb, "GRAM_CELLS", cells)
    for keep in (np.arange(data.n_items), rb.ease_items(data, 10)):
        chunk = max(1, cells // len(keep))
        want = _masked_gram(data, keep, chunk)
        assert rb.gram(data, keep).tobytes() == want.tobytes() and want.any()
        assert (chunk < len(data.user_ids)) == (cells == 100)  # several chunks of users, or one


def test_ease_learns_that_items_bought_together_predict_each_other() -> None:
    rng = np.random.default_rng(0)
    seqs: dict[str, list[str]] = {}
    for u in range(300):
        group = ["a", "b", "c"] if u % 2 else ["x", "y", "z"]
        seqs[f"u{u}"] = [str(i) for i in rng.permutation(group)[:2]] + [f"noise{rng.integers(50)}"]
    t = rb.ease_table(rb.interactions(sequences(seqs), {"view": 1.0}), lam=10.0, neighbours=5, limit=100)
    best = t.top(["a"], [1.0], k=2)
    assert {i for i, _ in best} == {"b", "c"}
    assert len(t) <= 100


def test_ease_keeps_only_the_most_frequent_items() -> None:
    events = sequences({"u1": ["a", "b", "c"], "u2": ["a", "b"], "u3": ["a"]})
    t = rb.ease_table(rb.interactions(events, {"view": 1.0}), lam=1.0, neighbours=5, limit=2)
    assert t.item_ids == ["a", "b"]


def test_holdout_takes_each_users_last_target_and_keeps_the_rest() -> None:
    events = sequences({"u1": ["a", "b", "c"], "u2": ["d"]})
    is_target = [True] * len(events)
    hold = rb.holdout(events, is_target, {"view": 1.0}, history=10, users=10)
    assert hold.targets == {"u1": "c"}  # u2's only event has no history before it
    assert hold.history == {"u1": ["b", "a"]}
    assert [e.item_id for e in hold.training if e.user_id == "u1"] == ["a", "b"]
    assert hold.seen["u1"] == {"a", "b"}


def test_rrf_and_ndcg() -> None:
    fused = rb.rrf({"s1": ["a", "b"], "s2": ["b", "c"]}, {"s1": 1.0, "s2": 1.0})
    assert fused[0] == "b"
    assert rb.ndcg({"u": ["x", "t"]}, {"u": "t"}) == 1 / np.log2(3)
    assert rb.ndcg({"u": ["x"]}, {"u": "t"}) == 0.0


def test_tune_picks_weights_that_fuse_the_sources_it_learnt() -> None:
    rng = np.random.default_rng(1)
    seqs = {f"u{u}": [f"i{(u + s) % 40}" for s in range(8)] for u in range(200)}  # sequential structure
    events = sequences(seqs)
    cfg = rb.BuildConfig(behaviors={"view": 1.0}, previous=5, neighbours=20, history=10, ease_items=100)
    seed = int(rng.integers(10))
    hold = rb.holdout(events, [True] * len(events), cfg.behaviors, cfg.history, 100, seed, cfg.seen_behaviors)
    tuned = rb.tune(hold, cfg, seed)
    assert tuned.users == 100
    assert set(tuned.decay) == {"knn", "ease"}
    assert tuned.ease_lambda > 0
    assert max(tuned.fusion.values()) > 0
    # a sequential world: the learnt sources beat popularity on the tuning split
    assert tuned.ndcg["fused"] > tuned.ndcg["popular"]


def test_the_fused_head_follows_its_weights_and_the_rest_the_depth_weights() -> None:
    from recmesh.retrieval.build import rrf_head_tail

    lists = {"a": ["x", "y", "z", "w"], "b": ["p", "q", "x", "r"]}
    head = {"a": 1.0, "b": 0.0}
    # Without depth weights (or the same ones): plain weighted RRF.
    assert rrf_head_tail(lists, head, None) == ["x", "y", "z", "w"]
    assert rrf_head_tail(lists, head, head, size=2) == ["x", "y", "z", "w"]
    # The first two by the head's weights, then b's order for what is left.
    assert rrf_head_tail(lists, head, {"a": 0.0, "b": 1.0}, size=2) == ["x", "y", "p", "q", "r"]


def test_grid_ascent_stops_where_no_single_coordinate_move_gains() -> None:
    lams, decays = (1.0, 2.0, 5.0, 10.0, 20.0, 40.0), (1.0, 0.9, 0.8, 0.65, 0.5)
    for seed in range(40):
        rng = np.random.default_rng(seed)
        table = {(a, b): float(rng.integers(0, 6)) for a in lams for b in decays}  # many ties
        calls: list[tuple[float, ...]] = []

        def score(
            point: tuple[float, ...],
            table: dict[tuple[float, float], float] = table,
            calls: list[tuple[float, ...]] = calls,
        ) -> float:
            calls.append(point)
            return table[(point[0], point[1])]

        point, best, tries = rb.grid_ascent((lams, decays), (lams[2], decays[1]), score)
        assert best == table[(point[0], point[1])] and tries == len(calls) == len(set(calls)), "each once"
        for a in lams:  # no move along either axis beats it, ties to the larger point
            assert (table[(a, point[1])], (a, point[1])) <= (best, point)
        for b in decays:
            assert (table[(point[0], b)], (point[0], b)) <= (best, point)
    # Where the score is separable, the ascent finds the whole grid's best point in one pass and a check.
    peak = {a: -abs(a - 10.0) for a in lams} | {b + 100: -abs(b - 0.65) for b in decays}
    point, _, tries = rb.grid_ascent((lams, decays), (1.0, 1.0), lambda p: peak[p[0]] + peak[p[1] + 100])
    assert point == (10.0, 0.65) and tries < len(lams) * len(decays)


def test_the_weight_search_scores_each_combination_once() -> None:
    names, grid = ["knn", "ease", "sequence", "popular"], (0.0, 0.25, 0.5, 1.0)  # 256: coordinate ascent
    calls: list[tuple[tuple[str, float], ...]] = []

    def score(ws: dict[str, float]) -> float:
        calls.append(tuple(sorted(ws.items())))
        return -abs(ws["knn"] - 0.5) - abs(ws["ease"] - 0.25) - ws["popular"] + ws["sequence"]

    best, ws = rb._weight_search(names, grid, score)
    assert ws == {"knn": 0.5, "ease": 0.25, "sequence": 1.0, "popular": 0.0} and best == 1.0
    assert len(calls) == len(set(calls)) < 2 * len(names) * len(grid), "the held point is not scored again"


def test_interactions_are_files_read_a_block_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The columns are read-only mappings of files; what the passes compute a
    block at a time (each user's first event, the items' summed strengths and
    counts, the knn table) is what the whole columns give, to the bit, with
    users cut across blocks; `take` reads what indexing reads."""
    rng = np.random.default_rng(8)
    events = [
        ev(n, f"u{rng.integers(60)}", f"i{rng.integers(30)}", ("view", "cart", "buy")[n % 3])
        for n in range(3000)
    ]
    data = rb.interactions(events, {"view": 0.3, "cart": 0.7, "buy": 1.1})
    assert all(not getattr(data, c).flags.writeable for c in ("users", "items", "weights"))
    strengths = np.bincount(data.items, weights=data.weights, minlength=data.n_items)
    starts = np.flatnonzero(np.r_[True, data.users[1:] != data.users[:-1]])
    whole = rb.knn_table(data, previous=5, neighbours=10)
    monkeypatch.setattr(rb, "BLOCK", 7)
    assert data.item_strengths().tobytes() == strengths.tobytes()
    assert data.item_counts().tolist() == np.bincount(data.items, minlength=data.n_items).tolist()
    assert data.starts().tolist() == starts.tolist()
    cut = rb.knn_table(data, previous=5, neighbours=10)
    assert all(
        getattr(cut, n).tobytes() == getattr(whole, n).tobytes() for n in ("indptr", "indices", "weights")
    )
    index = rng.integers(0, len(data.items), (4, 9))
    for column in ("users", "items", "weights"):
        assert np.array_equal(data.take(column, index), getattr(data, column)[index])
