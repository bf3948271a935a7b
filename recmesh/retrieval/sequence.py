"""A learnt next-item model over the user's newest items: sequence-aware retrieval.

The tables (item-kNN, EASE) sum what each history item points at, weighted by
a fixed recency decay; they never learn which of a user's recent items says
most about the next one, nor anything beyond pair counts. This model does, in
the factorised Markov chain family (FPMC, Fossil): an item has an input vector
(as context) and an output vector (as the next item); a user's query is the
position-weighted sum of their newest items' input vectors,

    q = sum_p a_p * inputs[h_p]          (h_0 the newest item, p < length)
    score(i) = <q, outputs[i]> + bias[i]

with the position weights a_p learnt too. It is trained on every step of every
user's sequence in the log (the next item given the previous `length` distinct
items) with softmax cross-entropy over the whole catalog (over a shared sample
of it past FULL_SOFTMAX_ITEMS items), each step weighted by its behaviour's
strength, mini-batch Adam in NumPy, deterministic under a seed. The number of
epochs is chosen on the build's tuning split (recmesh.retrieval.build), as the
tables' decays are: it overfits within a few passes on a small log.

It serves through the same interface as a NeighbourTable (`top`: the k best
items for a user's seeds, excluding some), so the ranker and the offline
evaluation treat it as one more learnt source; scoring is one matrix-vector
product over the catalog (100,000 items x 64 dimensions: 26 MB a matrix, a
few milliseconds).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from recmesh.heap import Spill, give_back
from recmesh.retrieval.table import best, id_ranks
from recmesh.scatter import Scatter

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
Rows = npt.NDArray[np.uint16] | npt.NDArray[np.int32]  # item rows: uint16 where the catalog allows


class Steps(Protocol):
    """The log as the model reads it (recmesh.retrieval.build.Interactions): per
    step its user and item rows and strength, sorted by user, then time."""

    item_ids: list[str]
    users: I32
    items: I32
    weights: F32

    @property
    def n_items(self) -> int: ...

    def starts(self) -> I64: ...

    def take(self, column: str, index: npt.NDArray[np.integer[Any]]) -> npt.NDArray[Any]: ...


DIM = 64
LENGTH = 20  # the newest distinct items a query reads
BATCH = 256
LEARNING_RATE = 3e-3
L2 = 1e-4
# Past this many items a step's softmax runs over its batch's targets and a
# shared uniform sample of SAMPLED_ITEMS others, not the whole catalog.
FULL_SOFTMAX_ITEMS = 20_000
ORDER_DROP = BATCH * 256  # steps of an epoch's order read before its pages are let go
SAMPLED_ITEMS = 4096


@dataclass(eq=False)
class SequenceModel:
    item_ids: list[str]
    inputs: F32  # [n, dim]
    outputs: F32  # [n, dim]
    bias: F32  # [n]
    positions: F32  # [length]
    row_of: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    id_rank: I64 = field(default_factory=lambda: np.zeros(0, np.int64), compare=False, repr=False)

    def __post_init__(self) -> None:
        n = len(self.item_ids)
        if (
            self.inputs.shape != self.outputs.shape
            or self.inputs.ndim != 2
            or len(self.inputs) != n
            or self.bias.shape != (n,)
            or self.positions.ndim != 1
        ):
            raise ValueError("sequence model: inputs, outputs, bias and positions do not fit together")
        if not self.row_of:
            self.row_of = {iid: r for r, iid in enumerate(self.item_ids)}
        self.id_rank = id_ranks(self.item_ids)

    def __len__(self) -> int:
        return len(self.item_ids)

    def same_as(self, other: SequenceModel) -> bool:
        """The same items and the same weights, bit for bit."""
        return self.item_ids == other.item_ids and all(
            np.array_equal(a, b)
            for a, b in zip(
                (self.inputs, self.outputs, self.bias, self.positions),
                (other.inputs, other.outputs, other.bias, other.positions),
                strict=True,
            )
        )

    @property
    def length(self) -> int:
        return len(self.positions)

    @property
    def nbytes(self) -> int:
        return int(self.inputs.nbytes + self.outputs.nbytes + self.bias.nbytes + self.positions.nbytes)

    @property
    def entries(self) -> int:
        return int(self.inputs.size)

    def query(self, seeds: Sequence[str]) -> F32 | None:
        """The user's query vector from their newest items (newest first); None
        when none of them is known."""
        # an unknown seed keeps its place: the known ones weigh as far back as they are
        known = [(p, r) for p, r in enumerate(map(self.row_of.get, seeds[: self.length])) if r is not None]
        if not known:
            return None
        places, rows = zip(*known, strict=True)
        q: F32 = (self.positions[list(places), None] * self.inputs[list(rows)]).sum(axis=0, dtype=np.float32)
        return q

    def scores(self, seeds: Sequence[str]) -> F32 | None:
        q = self.query(seeds)
        if q is None:
            return None
        out: F32 = self.outputs @ q + self.bias
        return out

    def top(
        self,
        seeds: Sequence[str],
        seed_weights: Sequence[float],
        k: int,
        exclude: frozenset[str] = frozenset(),
    ) -> list[tuple[str, float]]:
        """The k best next items for these seeds (newest first), best first, ties
        by item id; `exclude` is never returned. `seed_weights` is unused: the
        position weights are learnt (the NeighbourTable interface)."""
        del seed_weights
        total = self.scores(seeds)
        if total is None or k <= 0:
            return []
        # the best k + |exclude| first: one partial sort over the catalog, then the shared rule
        want = min(len(total), k + len(exclude))
        rows = np.argpartition(-total, want - 1)[:want] if want < len(total) else np.arange(len(total))
        return best(self.item_ids, self.id_rank, self.row_of, rows, total[rows], k, exclude)

    def save(self, path: Path) -> None:
        np.savez(
            path,
            item_ids=np.asarray(self.item_ids, dtype=object).astype(str),
            inputs=self.inputs,
            outputs=self.outputs,
            bias=self.bias,
            positions=self.positions,
        )

    @classmethod
    def load(cls, path: Path) -> SequenceModel:
        with np.load(path, allow_pickle=False) as z:
            try:
                return cls(
                    [str(s) for s in z["item_ids"]],
                    z["inputs"].astype(np.float32),
                    z["outputs"].astype(np.float32),
                    z["bias"].astype(np.float32),
                    z["positions"].astype(np.float32),
                )
            except KeyError as err:
                raise ValueError(f"{path}: not a sequence model ({err})") from None


# Steps made into Python ints at a time while the examples are built: the whole
# log's as lists took about 100 bytes a step more (at 4 M steps, ~0.4 GB).
STEPS_AT_A_TIME = 65_536


def examples(data: Steps, length: int) -> tuple[Rows, I32, F32]:
    """Every step of every user's sequence after their first: (the previous
    `length` distinct items, newest first, padded with n_items; the item; its
    strength). Built in flat buffers, the contexts' item rows as uint16 while
    the catalog has fewer than 65,535 items, else int32: 48 bytes a step (88
    with int32 rows). Training makes the same a batch at a time (_Steps)."""
    pad = data.n_items
    narrow = pad <= np.iinfo(np.uint16).max
    contexts, targets, weights = array("H" if narrow else "i"), array("i"), array("f")
    padding = [pad] * length
    recent: list[int] = []  # at most `length`, the newest first
    user = -1
    for start in range(0, len(data.users), STEPS_AT_A_TIME):  # as Python ints a block at a time
        part = slice(start, start + STEPS_AT_A_TIME)
        for u, item, strength in zip(data.users[part].tolist(), data.items[part].tolist(),
                                     data.weights[part].tolist(), strict=True):  # fmt: skip
            if u != user:
                recent, user = [], u
            if recent:
                contexts.extend(recent)
                contexts.extend(padding[: length - len(recent)])
                targets.append(item)
                weights.append(strength)
            if item in recent:
                recent.remove(item)
            recent.insert(0, item)
            del recent[length:]
    x: Rows
    if narrow:
        x = np.frombuffer(contexts, np.uint16).reshape(-1, length)
    else:
        x = np.frombuffer(contexts, np.int32).reshape(-1, length)
    return x, np.frombuffer(targets, np.int32), np.frombuffer(weights, np.float32)


class _Steps:
    """examples' rows, made a batch at a time from the interactions themselves:
    nothing is held per step or per event, only each user's first event (the
    examples took 48 bytes a step, 185 MB at 4 M events; an index of each
    step's event and of the user's next event on the same item, 8 bytes, until
    2026-12-07), and a batch's windows are read from the interactions' files at
    random (Steps.take). A step's context is the first `length` distinct items
    of the user's events before it, newest first (what examples' move-to-front
    list holds): the events of a window of the 2 x `length` before it whose
    item no newer event of the window has; the rare step whose window holds
    fewer distinct items than that while the user has older events is walked
    back."""

    def __init__(self, data: Steps, length: int) -> None:
        self.data = data
        self.starts = data.starts()  # each user's first event
        # steps before each user's: every event of the users before but their first
        self.steps_before = self.starts - np.arange(len(self.starts))
        self.count = len(data.users) - len(self.starts)
        self.pad, self.length = data.n_items, length
        self.narrow = self.pad <= np.iinfo(np.uint16).max

    def __len__(self) -> int:
        return self.count

    def batch(self, steps: npt.NDArray[np.integer[Any]]) -> tuple[Rows, I32, F32]:
        """The contexts, items and strengths of these steps (examples' rows)."""
        steps = np.asarray(steps, np.int64)
        # a user with one event has no step: the last user whose steps start at or before
        user = np.searchsorted(self.steps_before, steps, side="right") - 1
        at = steps + user + 1
        start = self.starts[user]
        window = 2 * self.length
        # each step's window and its own event, oldest first: one read a step
        read = self.data.take("items", np.maximum(at[:, None] - window + np.arange(window + 1), 0))
        item = read[:, window].astype(np.int32)
        position = np.arange(window)
        back = at[:, None] - 1 - position  # the events before, newest first
        inside = back >= start[:, None]
        # the window's items (outside the user's events: past every item, each its own)
        win = np.where(inside, read[:, window - 1 :: -1].astype(np.int64), self.pad + 1 + position)
        # kept: the item's newest event before the step (no newer event of the window has it):
        # the window sorted by item, then position, and each item's first place kept
        ordered = np.sort(win * window + position, axis=1)
        repeat = np.zeros(ordered.shape, bool)
        repeat[:, 1:] = ordered[:, 1:] // window == ordered[:, :-1] // window
        kept = np.zeros(ordered.shape, bool)
        kept[np.arange(len(at))[:, None], ordered % window] = ~repeat
        kept &= inside
        place = np.cumsum(kept, axis=1) - 1
        row, col = np.nonzero(kept & (place < self.length))
        context = np.full((len(at), self.length), self.pad, np.int64)
        context[row, place[row, col]] = win[row, col]
        found = place[:, -1] + 1
        for r in np.flatnonzero((found < self.length) & (at - window > start)).tolist():
            context[r] = self._walked(int(at[r]), int(start[r]))
        rows: Rows = context.astype(np.uint16) if self.narrow else context.astype(np.int32)
        weights: F32 = self.data.take("weights", at)
        return rows, item, weights

    def _walked(self, at: int, start: int) -> list[int]:
        recent: list[int] = []
        for item in self.data.take("items", np.arange(start, at))[::-1].tolist():
            if item not in recent:
                recent.append(item)
                if len(recent) == self.length:
                    break
        return recent + [self.pad] * (self.length - len(recent))


EpochCheck = Callable[[int, SequenceModel], bool]


def train(
    data: Steps,
    epochs: int,
    seed: int = 0,
    dim: int = DIM,
    length: int = LENGTH,
    after_epoch: EpochCheck | None = None,
) -> SequenceModel:
    """Train for `epochs` passes (module docstring). `after_epoch(epoch, model)`
    (1-based) sees the model after each pass and may stop the training by
    returning False; the model returned is the last one trained."""
    n = data.n_items
    steps = _Steps(data, length)
    rng = np.random.default_rng(seed)
    inputs = (rng.standard_normal((n + 1, dim)) * 0.05).astype(np.float32)  # row n: padding, kept 0
    inputs[n] = 0.0
    outputs = (rng.standard_normal((n, dim)) * 0.05).astype(np.float32)
    bias = np.zeros(n, np.float32)
    positions = (0.8 ** np.arange(length)).astype(np.float32)
    params = [inputs, outputs, bias, positions]
    adam = _Adam(params)
    full = n <= FULL_SOFTMAX_ITEMS

    def model() -> SequenceModel:
        return SequenceModel(list(data.item_ids), inputs[:n].copy(), outputs.copy(), bias.copy(),
                             positions.copy())  # fmt: skip

    for epoch in range(1, epochs + 1):
        # 4 bytes a step, held in a file through the epoch (read in order)
        spill = _order(rng, len(steps))
        order = spill.mapped()
        for start in range(0, len(steps), BATCH):
            idx = order[start : start + BATCH]
            if start % ORDER_DROP == 0:
                spill.drop()
            xb, yb, wb = steps.batch(idx)
            sample = () if full else (yb, rng.integers(0, n, SAMPLED_ITEMS))
            cols = np.arange(n) if full else np.unique(np.concatenate(sample))
            target_col = yb if full else np.searchsorted(cols, yb)
            emb = inputs[xb]  # [b, length, dim]
            q = np.einsum("l,bld->bd", positions, emb)
            out_c, bias_c = outputs[cols], bias[cols]
            logits = q @ out_c.T + bias_c
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=1, keepdims=True)
            g = p
            g[np.arange(len(yb)), target_col] -= 1.0
            g *= (wb / wb.sum())[:, None]
            g_out = np.zeros_like(outputs)
            g_out[cols] = g.T @ q
            g_bias = np.zeros_like(bias)
            g_bias[cols] = g.sum(axis=0)
            g_q = g @ out_c
            g_pos = np.einsum("bd,bld->l", g_q, emb)
            g_in = np.zeros_like(inputs)
            # each context position's row gets its position's weight times g_q
            at = xb.ravel().astype(np.int64)
            Scatter.of(at, np.arange(xb.size) // length, np.tile(positions, len(xb))).add(g_in, g_q)
            g_in[n] = 0.0
            g_in += L2 * inputs
            g_out += L2 * outputs
            adam.step([g_in, g_out, g_bias, g_pos])
            inputs[n] = 0.0
        if after_epoch is not None and not after_epoch(epoch, model()):
            break
    return model()


def _order(rng: np.random.Generator, steps: int) -> Spill:
    """An epoch's order of steps (= permutation(steps)) in a file, written a
    block at a time; the heap given back after it (the permutation and its
    arange, 8 bytes a step, were kept in the heap through the epoch)."""
    spill, drawn = Spill(np.int32), rng.permutation(np.arange(steps, dtype=np.int32))
    for at in range(0, len(drawn), ORDER_DROP):
        spill.write(drawn[at : at + ORDER_DROP])
    del drawn
    give_back()
    return spill


class _Adam:
    def __init__(self, params: list[npt.NDArray[np.float32]], lr: float = LEARNING_RATE) -> None:
        self.params = params
        self.lr = lr
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]
        self.t = 0

    def step(self, grads: list[npt.NDArray[np.float32]]) -> None:
        self.t += 1
        c1, c2 = 1 - 0.9**self.t, 1 - 0.999**self.t
        for k, g in enumerate(grads):  # in place: the model's arrays are the ones trained
            self.m[k] *= 0.9
            self.m[k] += 0.1 * g
            self.v[k] *= 0.999
            self.v[k] += 0.001 * g * g
            self.params[k] -= (self.lr / c1) * self.m[k] / (np.sqrt(self.v[k] / c2) + 1e-8)
