"""The next-item sequence model: its examples, what it learns, how it serves."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from recmesh.retrieval import build as rb
from recmesh.retrieval import sequence
from recmesh.retrieval.sequence import SequenceModel
from tests.unit.recmesh.retrieval.test_build import sequences

CHAIN = [f"i{n}" for n in range(12)]


def _chains(users: int = 600, length: int = 8, seed: int = 0) -> rb.Interactions:
    """Every user walks the chain i0 -> i1 -> ... -> i11 -> i0 from a random start:
    the next item is fixed by the newest one, and co-occurrence alone cannot tell
    which neighbour comes next (i3 is as often beside i2 as beside i4)."""
    rng = np.random.default_rng(seed)
    seqs = {}
    for u in range(users):
        start = int(rng.integers(len(CHAIN)))
        seqs[f"u{u}"] = [CHAIN[(start + k) % len(CHAIN)] for k in range(length)]
    return rb.interactions(sequences(seqs), {"view": 1.0})


def test_examples_are_each_step_with_the_previous_distinct_items_newest_first() -> None:
    data = rb.interactions(sequences({"u": ["a", "b", "a", "c"], "v": ["d"]}), {"view": 1.0})
    x, y, w = sequence.examples(data, length=3)
    pad = data.n_items
    name = {r: i for r, i in enumerate(data.item_ids)} | {pad: "-"}
    assert [[name[int(r)] for r in row] for row in x] == [["a", "-", "-"], ["b", "a", "-"], ["a", "b", "-"]]
    assert [name[int(r)] for r in y] == ["b", "a", "c"]
    assert w.tolist() == [1.0, 1.0, 1.0]
    assert x.dtype == np.uint16  # 2 bytes an item row while the catalog allows
    wide = dataclasses.replace(data, item_ids=[*data.item_ids, *(f"z{k}" for k in range(70_000))])
    xw, yw, _ = sequence.examples(wide, length=3)
    assert xw.dtype == np.int32 and np.array_equal(yw, y)
    assert np.array_equal(np.where(xw == wide.n_items, pad, xw), x)  # the same rows, another padding


def test_examples_made_a_block_of_steps_at_a_time_are_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 3 steps (users' sequences cut across blocks) give the examples
    one block of the whole log gives."""
    data = _chains(users=40, length=7)
    whole = sequence.examples(data, length=4)
    monkeypatch.setattr(sequence, "STEPS_AT_A_TIME", 3)
    for got, want in zip(sequence.examples(data, length=4), whole, strict=True):
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


def test_a_batch_of_steps_made_from_the_interactions_is_examples_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Training makes its batches' rows from the interactions (_Steps) instead
    of holding examples: the same rows, in any order of steps, for users whose
    windows of 2 x length events hold few distinct items (walked back), short
    users, and a wide catalog's int32 rows; the users' first events found a
    few events at a time, the windows read from the interactions' files."""
    monkeypatch.setattr(rb, "BLOCK", 5)
    rng = np.random.default_rng(5)
    seqs: dict[str, list[str]] = {}
    for u in range(60):
        few = int(rng.integers(1, 9))  # some users cycle through a handful of items
        seqs[f"u{u}"] = [
            f"i{int(rng.integers(0, few if u % 3 else 40))}" for _ in range(int(rng.integers(1, 90)))
        ]
    data = rb.interactions(sequences(seqs), {"view": 1.0})
    for d in (data, dataclasses.replace(data, item_ids=[*data.item_ids, *(f"z{k}" for k in range(70_000))])):
        for length in (3, 6):
            want = sequence.examples(d, length)
            steps = sequence._Steps(d, length)
            walked: list[int] = []
            own = steps._walked

            def walk(at: int, start: int, walked: list[int] = walked, own: Any = own) -> Any:
                walked.append(at)
                return own(at, start)

            monkeypatch.setattr(steps, "_walked", walk)
            order = rng.permutation(len(steps))
            got = steps.batch(order)
            assert len(steps) == len(want[1]) > 500 and len(walked) > 20
            for g, w in zip(got, want, strict=True):
                assert g.dtype == w.dtype and np.array_equal(g, w[order])


def test_it_learns_which_item_comes_next_where_pair_counts_cannot() -> None:
    data = _chains()
    model = sequence.train(data, epochs=10, seed=0)
    for n, item in enumerate(CHAIN):
        after = CHAIN[(n + 1) % len(CHAIN)]
        assert model.top([item], [1.0], 1)[0][0] == after
        # two steps of history, the newest first: still the item after the newest
        before = CHAIN[n - 1]
        assert model.top([item, before], [1.0, 1.0], 1, frozenset({before}))[0][0] == after
    # the newest item says the most
    assert model.positions[0] > abs(model.positions[5])
    # the symmetric table cannot tell the next item from the previous one
    knn = rb.knn_table(data, previous=1, neighbours=10)
    row = dict(knn.row("i5"))
    assert np.isclose(row["i4"], row["i6"], rtol=0.3)


def test_a_sampled_softmax_learns_the_same_on_a_large_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sequence, "FULL_SOFTMAX_ITEMS", 4)
    monkeypatch.setattr(sequence, "SAMPLED_ITEMS", 5)
    model = sequence.train(_chains(), epochs=10, seed=0)
    nexts = [model.top([item], [1.0], 1)[0][0] for item in CHAIN]
    hits = sum(got == CHAIN[(n + 1) % len(CHAIN)] for n, got in enumerate(nexts))
    assert hits >= 10


def test_training_is_deterministic_under_a_seed_and_stops_when_told() -> None:
    data = _chains(users=30)
    a = sequence.train(data, epochs=2, seed=3)
    b = sequence.train(data, epochs=2, seed=3)
    assert a.same_as(b)
    seen: list[int] = []

    def check(epoch: int, _model: SequenceModel) -> bool:
        seen.append(epoch)
        return epoch < 2

    sequence.train(data, epochs=5, seed=3, after_epoch=check)
    assert seen == [1, 2]


def test_top_excludes_breaks_ties_by_id_and_knows_no_unknown_seed() -> None:
    model = SequenceModel(
        ["c", "a", "b"],
        np.eye(3, 2, dtype=np.float32),
        np.zeros((3, 2), np.float32),
        np.asarray([0.0, 1.0, 1.0], np.float32),
        np.ones(2, np.float32),
    )
    assert model.top(["c"], [1.0], 3) == [("a", 1.0), ("b", 1.0), ("c", 0.0)]
    assert model.top(["c"], [1.0], 2, frozenset({"a"})) == [("b", 1.0), ("c", 0.0)]
    assert model.top(["zzz"], [1.0], 3) == []
    with pytest.raises(ValueError, match="do not fit"):
        SequenceModel(["a"], np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float32),
                      np.zeros(2, np.float32), np.ones(1, np.float32))  # fmt: skip
