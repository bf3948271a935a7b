"""Learning item-to-item tables from an event log, with no per-dataset code.

- **item-kNN** (`knn_table`): each event of the retrieval behaviours is paired
  with the same user's previous `previous` items (consecutive repeats
  collapsed), each pair adds w(a) * w(b) (the behaviours' strengths) in both
  directions, and the sums are cosine-normalised by the items' weighted counts.
- **EASE** (`ease_table`; Steck, WWW 2019): B = -P / diag(P) with
  P = (X^T X + lambda I)^-1 over the user x item matrix X (a cell holds the
  strongest behaviour weight of the user on the item), the diagonal 0; on the
  `ease_items` most frequent items (the matrix is dense: 10,000 items is
  400 MB of float32 and about a minute on two cores).

Both are kept as a NeighbourTable with the `neighbours` strongest entries per
item.
- **sequence** (recmesh.retrieval.sequence): a next-item model over the user's
  newest items with learnt position weights, trained on every step of the log.

What no method fixes by itself (EASE's lambda, how fast a user's older items
fade as seeds, the sequence model's epochs, the fusion weights) is chosen by
`tune`, on a
leave-last-out split of the same log (each user's last event of the target
behaviours held out; the tables rebuilt without them), never on data the
caller holds out.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from recmesh.events import Event
from recmesh.features.eventlog import EventTable, select
from recmesh.heap import Spill, give_back
from recmesh.retrieval import sequence
from recmesh.retrieval.table import NeighbourTable, RecallTable, recency_weights

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BuildConfig:
    behaviors: Mapping[str, float]  # behaviour -> strength (only these count)
    previous: int = 20  # kNN: earlier items each event is paired with
    neighbours: int = 200  # kept per item and table
    history: int = 50  # a user's newest distinct items the online history keeps (the seeds)
    ease_items: int = 10_000
    methods: tuple[str, ...] = ("knn", "ease", "sequence")
    # Events of these behaviours make an item seen (never recommended to the user
    # again; the repository's recall.seen); None: every event, and the seeds.
    seen_behaviors: frozenset[str] | None = None


Ints = npt.NDArray[np.int64]
Rows32 = npt.NDArray[np.int32]  # user and item rows: 4 bytes an event (a catalog or user base < 2^31)
Floats = npt.NDArray[np.float64]


@dataclass
class Interactions:
    """The log as arrays: per event (time order within each user) its user and item
    rows and strength; consecutive repeats of one item by one user collapsed.
    Built by `interactions`, the columns are files read through mappings
    (`spills`): the process holds the pages a pass has read until it lets go
    of them (`let_go`, after each block of a pass), and reads at random with
    `take` (12 bytes an event held in no process's memory: 48 MB at 4 M
    events, in memory until 2026-12-07)."""

    item_ids: list[str]
    user_ids: list[str]
    users: Rows32  # sorted by user, then time
    items: Rows32
    weights: npt.NDArray[np.float32]
    spills: tuple[Spill, ...] = field(default=(), compare=False, repr=False)  # users', items', weights'

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    def let_go(self) -> None:
        """Let go of the pages of the columns' files read so far (they stay readable)."""
        for spill in self.spills:
            spill.drop()

    def take(self, column: str, index: npt.NDArray[np.integer[Any]]) -> npt.NDArray[Any]:
        """users, items or weights at `index` (a read at random): from the column's
        file with pread when it is one (see Spill.take), else indexed."""
        if self.spills:
            spill = self.spills[("users", "items", "weights").index(column)]
            return spill.take(index).reshape(np.shape(index))
        values: npt.NDArray[Any] = getattr(self, column)[index]
        return values

    def starts(self) -> Ints:
        """Each user's first event (the users are in order), a block of the column at a time."""
        users, first = self.users, [0] if len(self.users) else []
        for s in range(0, len(users), BLOCK):
            block = users[max(0, s - 1) : s + BLOCK]
            first.extend((np.flatnonzero(block[1:] != block[:-1]) + max(0, s - 1) + 1).tolist())
            self.let_go()
        return np.asarray(first, np.int64)

    def blocks(self) -> Iterator[tuple[slice, Rows32, Rows32, npt.NDArray[np.float32]]]:
        """The columns BLOCK events at a time (each block's pages let go after it)."""
        for s in range(0, len(self.users), BLOCK):
            at = slice(s, min(len(self.users), s + BLOCK))
            yield at, self.users[at], self.items[at], self.weights[at]
            self.let_go()

    def item_strengths(self) -> Floats:
        """Per item, its events' summed strengths: np.bincount(items, weights)'s
        float64 sums, added in the same order, a block at a time."""
        total = np.zeros(self.n_items, np.float64)
        for _, _, items, weights in self.blocks():
            np.add.at(total, items, weights.astype(np.float64))
        return total

    def item_counts(self) -> Ints:
        total = np.zeros(self.n_items, np.int64)
        for _, _, items, _ in self.blocks():
            total += np.bincount(items, minlength=self.n_items)
        return total

    def histories(self, limit: int) -> dict[str, list[str]]:
        """user -> newest distinct items first, at most `limit` (what the online history holds)."""
        out: dict[str, list[str]] = {}
        bounds = np.flatnonzero(np.diff(self.users)) + 1
        for seg in np.split(np.arange(len(self.users)), bounds):
            if not len(seg):
                continue
            seen: list[str] = []
            for r in self.items[seg][::-1]:
                iid = self.item_ids[int(r)]
                if iid not in seen:
                    seen.append(iid)
                    if len(seen) == limit:
                        break
            out[self.user_ids[int(self.users[seg[0]])]] = seen
        return out


def interactions(events: Iterable[Event], behaviors: Mapping[str, float]) -> Interactions:
    """The events of `behaviors` (those with a weight), users and items numbered
    in the order they first appear; from a table's columns when it is one (a
    few users at a time: `_of_columns`)."""
    if isinstance(events, EventTable):
        return _of_columns(events, behaviors)
    item_ids, user_ids, us, its, ws, ts = _counted_events(events, behaviors)
    return _spilled(item_ids, user_ids, [_ordered(us, its, ws, ts)])


def _ordered(us: Rows32, its: Rows32, ws: npt.NDArray[np.float32], ts: Ints | None) -> _Columns:
    """Events by user, then time, ties in log order (a stable sort by user alone
    when they come in time order already), an item repeated at once by the same
    user (a view and its click) one step of the sequence, with the stronger weight."""
    order = np.lexsort((ts, us)) if ts is not None else np.argsort(us, kind="stable")
    users, items, weights = us[order], its[order], ws[order]
    del order
    if len(users) > 1:
        same = (users[1:] == users[:-1]) & (items[1:] == items[:-1])
        if same.any():
            keep = np.ones(len(users), bool)
            keep[1:] = ~same
            group = np.cumsum(keep) - 1
            strongest = np.zeros(int(keep.sum()), np.float32)
            np.maximum.at(strongest, group, weights)
            users, items, weights = users[keep], items[keep], strongest
    return users, items, weights


_Columns = tuple[Rows32, Rows32, npt.NDArray[np.float32]]


def _spilled(item_ids: list[str], user_ids: list[str], parts: Iterable[_Columns]) -> Interactions:
    """Interactions of consecutive parts (whole users each, in order), each column written to its file."""
    spills = Spill(np.int32), Spill(np.int32), Spill(np.float32)
    for part in parts:
        for spill, column in zip(spills, part, strict=True):
            spill.write(column)
    give_back()  # the parts' sorts and copies
    mapped = [spill.mapped() for spill in spills]
    return Interactions(item_ids, user_ids, mapped[0], mapped[1], mapped[2], spills)


def _of_columns(table: EventTable, behaviors: Mapping[str, float]) -> Interactions:
    """interactions of a table, from its columns a block at a time: no event
    made, and nothing as long as the log held (the columns, their sort and
    its copies were 50 bytes an event at once, 2026-12-07). A first pass
    numbers the users and items in the order they first appear and counts each
    user's events; then the users are taken a bucket of at most BLOCK events
    at a time (a pass over the columns each), ordered and written out."""
    weight_of = np.asarray([behaviors.get(b) or 0.0 for b in table.behaviors] or [0.0], np.float32)
    size = BLOCK
    first_user = np.full(len(table.users), -1, np.int64)  # a code's first counted event
    first_item = np.full(len(table.items), -1, np.int64)
    per_user = np.zeros(len(table.users), np.int64)
    in_order, last, at = True, None, 0
    for t, user, item, behavior in table.code_blocks(size):
        counted = weight_of[behavior] != 0
        if len(t):  # in time order: then a stable sort by user orders each bucket
            in_order = in_order and (last is None or int(t[0]) >= last) and bool((t[1:] >= t[:-1]).all())
            last = int(t[-1])
        for first, codes in ((first_user, user), (first_item, item)):
            new = np.flatnonzero(counted & (first[codes] < 0))
            if len(new):  # a code's first event in this block: its smallest position
                where = np.full(len(first), np.iinfo(np.int64).max, np.int64)
                np.minimum.at(where, codes[new], new + at)
                seen = where < np.iinfo(np.int64).max
                first[seen] = where[seen]
        per_user += np.bincount(user[counted], minlength=len(first_user))
        at += len(t)
    user_codes = _by_first(first_user)
    item_codes = _by_first(first_item)
    user_number = np.full(len(table.users), -1, np.int32)
    user_number[user_codes] = np.arange(len(user_codes))
    item_number = np.full(len(table.items), -1, np.int32)
    item_number[item_codes] = np.arange(len(item_codes))
    counts = per_user[user_codes]  # per user number

    def parts() -> Iterator[_Columns]:
        lo = 0
        while lo < len(counts):  # users lo..hi-1: at most BLOCK events (or one user)
            hi = max(lo + 1, int(np.searchsorted(np.cumsum(counts[lo:]), size, side="right")) + lo)
            us, its, ws, ts = [], [], [], []
            for t, user, item, behavior in table.code_blocks(size):
                u = user_number[user]
                mine = np.flatnonzero((weight_of[behavior] != 0) & (u >= lo) & (u < hi))
                us.append(u[mine])
                its.append(item_number[item[mine]])
                ws.append(weight_of[behavior[mine]])
                if not in_order:
                    ts.append(t[mine].astype(np.int64))
            yield _ordered(np.concatenate(us), np.concatenate(its), np.concatenate(ws),
                           None if in_order else np.concatenate(ts))  # fmt: skip
            lo = hi

    item_ids = [table.items[c] for c in item_codes.tolist()]
    return _spilled(item_ids, [table.users[c] for c in user_codes.tolist()], parts())


def _by_first(first: Ints) -> Ints:
    """The codes with an event, in the order of their first."""
    present = np.flatnonzero(first >= 0)
    return present[np.argsort(first[present], kind="stable")]


BLOCK = 1 << 20  # events of the interactions' columns a pass reads at a time


# item and user names, user and item rows, strengths, times (None: in time order already)
_Counted = tuple[list[str], list[str], Rows32, Rows32, npt.NDArray[np.float32], Ints | None]


def _counted_events(events: Iterable[Event], behaviors: Mapping[str, float]) -> _Counted:
    item_row: dict[str, int] = {}
    user_row: dict[str, int] = {}
    us: list[int] = []
    its: list[int] = []
    ws: list[float] = []
    ts: list[int] = []
    for ev in events:
        w = behaviors.get(ev.behavior)
        if not w:
            continue
        us.append(user_row.setdefault(ev.user_id, len(user_row)))
        its.append(item_row.setdefault(ev.item_id, len(item_row)))
        ws.append(w)
        ts.append(ev.event_time)
    return (list(item_row), list(user_row), np.asarray(us, np.int32), np.asarray(its, np.int32),
            np.asarray(ws, np.float32), np.asarray(ts, np.int64))  # fmt: skip


def _summed(keys: Ints, vals: Floats) -> tuple[Ints, Floats]:
    uniq, inverse = np.unique(keys, return_inverse=True)
    return uniq.astype(np.int64), np.bincount(inverse, weights=vals).astype(np.float64)


# Events whose pairs at one lag are summed in at a time: the pair arrays (and,
# past DENSE_PAIR_BYTES, the sort that sums them) are this long, not the log's
# (1 << 20 until 2026-12-07: about 50 MB of keys, products and masks at once; the
# sums are the same to the bit whatever the block).
PAIR_BLOCK = 1 << 18
# A catalog whose every ordered pair fits in this many bytes (a float64 sum and
# a flag each: 9 n^2; 36 MB at 2,000 items, 3,862 items at most) has its pair
# sums added in place, at their cell; a larger one keeps running sums of the
# pairs met, merged with each block by a sort (a few times the pairs' 16 bytes
# while it sorts, and about 14x slower: 1.27 s against 0.09 s a block of 1 M
# pairs into 4 M sums).
DENSE_PAIR_BYTES = 1 << 27


def knn_table(data: Interactions, previous: int, neighbours: int) -> NeighbourTable:
    """Each event paired with the user's items up to `previous` steps before it
    (module docstring), the pairs' strengths summed and cosine-normalised."""
    n = data.n_items
    count = data.item_strengths()
    norm = np.sqrt(np.maximum(count, 1e-9))
    if _dense(n):  # the sums at their cells, each row's neighbours ranked a block of rows at a time
        sums, met = _dense_pair_sums(data, previous)
        return _top_per_dense_row(data.item_ids, sums.reshape(n, n), met.reshape(n, n), norm, neighbours)
    acc_k, acc_v = _sparse_pair_sums(data, previous)
    rows, cols = acc_k // n, acc_k % n
    sim = acc_v / (norm[rows] * norm[cols])
    return _top_per_row(data.item_ids, rows, cols, sim, neighbours)


def pair_sums(data: Interactions, previous: int) -> tuple[Ints, Floats]:
    """Per ordered pair of distinct items (key a * n_items + b) met within
    `previous` steps of one user's sequence, both ways: the summed products of
    their strengths, keys ascending. A lag's pairs are summed in a block of
    PAIR_BLOCK events at a time, each direction in event order, so every sum
    adds its terms in the order one whole-lag pass would (the same float64 to
    the bit, dense or sparse: `DENSE_PAIR_BYTES`)."""
    if not _dense(data.n_items):
        return _sparse_pair_sums(data, previous)
    sums, met = _dense_pair_sums(data, previous)
    keys = np.flatnonzero(met).astype(np.int64)
    return keys, sums[keys]


def _dense(n_items: int) -> bool:
    return 9 * n_items * n_items <= DENSE_PAIR_BYTES


def _pair_blocks(data: Interactions, previous: int) -> Iterator[tuple[Ints, Floats]]:
    """The pairs' keys and strength products, a lag, a direction and a block of
    PAIR_BLOCK events at a time, in the order pair_sums adds them."""
    n = data.n_items
    users, items, weights = data.users, data.items, data.weights
    for lag in range(1, previous + 1):
        if lag >= len(items):
            break
        for forward in (True, False):
            for start in range(lag, len(items), PAIR_BLOCK):
                now = slice(start, min(start + PAIR_BLOCK, len(items)))
                before = slice(now.start - lag, now.stop - lag)
                same = users[now] == users[before]
                a, b = items[now][same].astype(np.int64), items[before][same].astype(np.int64)
                w = (weights[now][same] * weights[before][same]).astype(np.float64)
                diff = a != b
                a, b, w = a[diff], b[diff], w[diff]
                yield (a * n + b if forward else b * n + a), w
                data.let_go()


def _dense_pair_sums(data: Interactions, previous: int) -> tuple[Floats, npt.NDArray[np.bool_]]:
    """Every cell's sum (n_items^2, a key's sum at the key) and whether a pair met there."""
    n = data.n_items
    sums, met = np.zeros(n * n, np.float64), np.zeros(n * n, bool)
    for k, w in _pair_blocks(data, previous):
        np.add.at(sums, k, w)  # in k's order, as the sparse path's bincount adds
        met[k] = True
    give_back()
    return sums, met


def _sparse_pair_sums(data: Interactions, previous: int) -> tuple[Ints, Floats]:
    acc_k = np.zeros(0, np.int64)
    acc_v = np.zeros(0, np.float64)
    for k, w in _pair_blocks(data, previous):
        acc_k, acc_v = _summed(np.concatenate([acc_k, k]), np.concatenate([acc_v, w]))
    give_back()
    return acc_k, acc_v


def _top_per_row(
    item_ids: list[str],
    rows: npt.NDArray[np.int64],
    cols: npt.NDArray[np.int64],
    sim: npt.NDArray[np.float64],
    keep: int,
) -> NeighbourTable:
    order = np.lexsort((cols, -sim, rows))  # by row, strongest first, ties by column
    rows, cols, sim = rows[order], cols[order], sim[order]
    starts = np.searchsorted(rows, np.arange(len(item_ids) + 1))
    rank = np.arange(len(rows)) - starts[rows]
    ok = (rank < keep) & (sim > 0)
    rows, cols, sim = rows[ok], cols[ok], sim[ok]
    indptr = np.searchsorted(rows, np.arange(len(item_ids) + 1)).astype(np.int64)
    return NeighbourTable(list(item_ids), indptr, cols.astype(np.int32), sim.astype(np.float32))


ROW_BLOCK = 256  # rows of the dense sums ranked at a time (2 x 8 MB at 2,000 items)


def _top_per_dense_row(
    item_ids: list[str], sums: Floats, met: npt.NDArray[np.bool_], norm: Floats, keep: int
) -> NeighbourTable:
    """_top_per_row's table from the dense sums: a row's cells by similarity,
    strongest first, ties by column (a stable sort of the row), the first
    `keep` of those above 0; a cell no pair met is 0, so never kept."""
    n = len(item_ids)
    counts = np.zeros(n, np.int64)
    cols: list[npt.NDArray[np.int64]] = []
    sims: list[Floats] = []
    for r0 in range(0, n, ROW_BLOCK):
        r1 = min(n, r0 + ROW_BLOCK)
        sim = sums[r0:r1] / (norm[r0:r1, None] * norm[None, :])
        sim[~met[r0:r1]] = 0.0
        order = np.argsort(-sim, axis=1, kind="stable")[:, :keep]
        top = np.take_along_axis(sim, order, axis=1)
        ok = top > 0
        counts[r0:r1] = ok.sum(axis=1)
        cols.append(order[ok])
        sims.append(top[ok])
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    col = np.concatenate(cols) if cols else np.zeros(0, np.int64)
    sim_all = np.concatenate(sims) if sims else np.zeros(0, np.float64)
    return NeighbourTable(list(item_ids), indptr, col.astype(np.int32), sim_all.astype(np.float32))


# The users x kept items block of X made at a time (float32: 16 MB; 80 MB until
# 2026-12-07, the largest part of the 4 M-event run's peak: the same products
# to multiply, in more calls).
GRAM_CELLS = 1 << 22


def gram(data: Interactions, keep_items: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """X^T X over the kept items (X: a user's strongest weight per item), built
    per chunk of the users with a kept item: the interactions are in user
    order, so a chunk's events are a slice of the columns' files, read as it
    is built (nothing as long as the log is held; a mask over the whole log
    until 2026-12-07)."""
    m = len(keep_items)
    col = None
    if m != data.n_items:  # some items not kept (keep_items is sorted): their events left out
        col = np.full(data.n_items, -1, np.int32)
        col[keep_items] = np.arange(m)
    starts = data.starts()  # user u's first event (the users are numbered 0.. in order)
    if col is None:
        has = np.arange(len(starts))
    else:
        kept = np.zeros(len(starts), np.int64)  # per user, their events on kept items
        for _, users, items, _ in data.blocks():
            kept += np.bincount(users[col[items] >= 0], minlength=len(starts))
        has = np.flatnonzero(kept)
    g = np.zeros((m, m), np.float64)
    chunk = max(1, GRAM_CELLS // max(m, 1))
    for first in range(0, len(has), chunk):
        group = has[first : first + chunk]
        lo = int(starts[group[0]])
        hi = int(starts[has[first + chunk]]) if first + chunk < len(has) else len(data.users)
        users, cols, w = data.users[lo:hi], data.items[lo:hi], data.weights[lo:hi]
        if col is not None:
            c = col[cols]
            ok = c >= 0
            users, cols, w = users[ok], c[ok], w[ok]
        x = np.zeros((len(group), m), np.float32)
        np.maximum.at(x, (np.searchsorted(group, users), cols), w)
        g += (x.T @ x).astype(np.float64)
        data.let_go()
    give_back()
    return g


def ease_weights(g: npt.NDArray[np.float64], lam: float) -> npt.NDArray[np.float32]:
    p = np.linalg.inv(g + lam * np.eye(len(g)))
    b = -p / np.diag(p)[None, :]
    np.fill_diagonal(b, 0.0)
    return b.astype(np.float32)


def ease_items(data: Interactions, limit: int) -> npt.NDArray[np.int64]:
    count = data.item_counts()
    order = np.lexsort((np.arange(data.n_items), -count))
    return np.sort(order[: min(limit, int((count > 0).sum()))])


def ease_table(data: Interactions, lam: float, neighbours: int, limit: int) -> NeighbourTable:
    keep = ease_items(data, limit)
    b = ease_weights(gram(data, keep), lam)
    ids = [data.item_ids[int(i)] for i in keep]
    return NeighbourTable.from_dense(ids, b, neighbours)


# --- tuning on a split of the same log ---------------------------------------------


@dataclass(frozen=True)
class Holdout:
    """Each (sampled) user's last event of the target behaviours, and their history before it."""

    targets: dict[str, str]  # user -> item
    history: dict[str, list[str]]  # user -> newest distinct items first (the seeds)
    training: Sequence[Event]
    seen: dict[str, set[str]] = field(default_factory=dict)  # user -> every item they had an event on
    as_of: dict[str, int] = field(default_factory=dict)  # user -> 1 ms before their held-out part


Flags = Sequence[bool] | npt.NDArray[np.bool_]  # per event


def last_targets(events: Sequence[Event], is_target: Flags) -> dict[str, tuple[int, int]]:
    """Per user with a target event and a history before it: (the index of
    their last target event, the index where its held-out part begins).

    The held-out part begins with the target's lead-up: the user's first
    event on the target's item since their previous target event (in a
    shop's clickstream, the view and the cart of what was then bought), so
    the ranking is asked as of before the user turned to the item; with one
    event per item (ratings, purchases) it is the target itself. Everything
    from there on is the user's held-out part."""
    if isinstance(events, EventTable):
        return _last_targets_of_columns(events, np.asarray(is_target, bool))
    last: dict[str, int] = {}
    prev: dict[str, int] = {}
    first: dict[str, int] = {}
    for n, ev in enumerate(events):
        first.setdefault(ev.user_id, n)
        if is_target[n]:
            if ev.user_id in last:
                prev[ev.user_id] = last[ev.user_id]
            last[ev.user_id] = n
    lead: dict[str, int] = {}
    for n, ev in enumerate(events):
        u = ev.user_id
        t = last.get(u)
        if t is not None and u not in lead and prev.get(u, -1) < n <= t and ev.item_id == events[t].item_id:
            lead[u] = n
    return {u: (t, lead[u]) for u, t in last.items() if first[u] < lead[u]}


def _last_targets_of_columns(
    table: EventTable, is_target: npt.NDArray[np.bool_]
) -> dict[str, tuple[int, int]]:
    """last_targets from a table's codes: the same pairs, in the same order (by
    each user's first target), without making an event."""
    if len(is_target) != len(table):
        raise ValueError(f"{len(is_target)} target flags for {len(table)} events")
    _, user, item, _ = table.codes()
    n, size = len(user), len(table.users)
    first = np.full(size, n, np.int64)
    seen_users, first_at = np.unique(user, return_index=True)
    first[seen_users] = first_at
    at = np.flatnonzero(is_target)
    last = np.full(size, -1, np.int64)
    np.maximum.at(last, user[at], at)
    prev = np.full(size, -1, np.int64)
    earlier = at[at != last[user[at]]]
    np.maximum.at(prev, user[earlier], earlier)
    rows = np.arange(n)
    t = last[user]
    leads = np.flatnonzero((t >= 0) & (prev[user] < rows) & (rows <= t) & (item == item[np.maximum(t, 0)]))
    lead = np.full(size, n, np.int64)
    np.minimum.at(lead, user[leads], leads)
    by_first_target = np.full(size, n, np.int64)
    np.minimum.at(by_first_target, user[at], at)
    found = np.flatnonzero((last >= 0) & (first < lead))
    found = found[np.argsort(by_first_target[found], kind="stable")]
    table.let_go()
    return {table.users[u]: (int(last[u]), int(lead[u])) for u in found.tolist()}


def holdout(
    events: Sequence[Event],
    is_target: Flags,
    behaviors: Mapping[str, float],
    history: int,
    users: int,
    seed: int = 0,
    seen_behaviors: frozenset[str] | None = None,
) -> Holdout:
    """`is_target`: per event, may it be a user's held-out target (a positive).
    The split is `last_targets`'s, on at most `users` users drawn under `seed`.
    A user's seen items: those of their training events (of `seen_behaviors`
    when given), never recommended to them."""
    found = last_targets(events, is_target)
    eligible = sorted(found)
    if len(eligible) > users:
        eligible = sorted(np.random.default_rng(seed).choice(eligible, users, replace=False).tolist())
    chosen = {u: found[u] for u in eligible}
    cut = {u: events[c].event_time for u, (_, c) in chosen.items()}
    training: Sequence[Event]
    theirs: Sequence[Event]
    if isinstance(events, EventTable):
        training, theirs = _training_of_columns(events, chosen, cut)
    else:
        training = theirs = select(events, [
            n for n, ev in enumerate(events)
            if ev.user_id not in chosen or (n < chosen[ev.user_id][1] and ev.event_time < cut[ev.user_id])
        ])  # fmt: skip
    hist: dict[str, list[str]] = {u: [] for u in chosen}
    seen: dict[str, set[str]] = {u: set() for u in chosen}
    for ev in reversed(theirs):
        if ev.user_id in seen and (seen_behaviors is None or ev.behavior in seen_behaviors):
            seen[ev.user_id].add(ev.item_id)
        h = hist.get(ev.user_id)
        if h is not None and len(h) < history and ev.behavior in behaviors and ev.item_id not in h:
            h.append(ev.item_id)
    targets = {u: events[t].item_id for u, (t, _) in chosen.items()}
    for u, item in targets.items():  # an item rated before and again later stays a candidate
        seen[u].discard(item)
    as_of = {u: t - 1 for u, t in cut.items()}
    if isinstance(events, EventTable):  # the pages its targets were read from (a few events at random)
        events.let_go()
    give_back()
    return Holdout(targets, {u: h for u, h in hist.items() if h}, training, seen, as_of)


def _training_of_columns(
    table: EventTable, chosen: Mapping[str, tuple[int, int]], cut: Mapping[str, int]
) -> tuple[EventTable, EventTable]:
    """The training part of `table` (every event of a user not chosen; a chosen
    user's events before their held-out part and before its time), and the
    chosen users' events in it: views of the table, no event made."""
    t, user, _, _ = table.codes()
    code = {u: c for c, u in enumerate(table.users)}
    lead = np.full(len(table.users), len(t), np.int64)
    before = np.full(len(table.users), np.iinfo(np.int64).max, np.int64)
    for u, (_, c) in chosen.items():
        lead[code[u]], before[code[u]] = c, cut[u]
    keep = (np.arange(len(t)) < lead[user]) & (t < before[user])
    theirs = np.zeros(len(table.users), bool)
    theirs[[code[u] for u in chosen]] = True
    split = table.take(np.flatnonzero(keep)), table.take(np.flatnonzero(keep & theirs[user]))
    table.let_go()
    return split


def ndcg(rankings: Mapping[str, Sequence[str]], targets: Mapping[str, str], k: int = 10) -> float:
    total = 0.0
    for user, target in targets.items():
        ranked = list(rankings.get(user, ()))[:k]
        if target in ranked:
            total += 1.0 / math.log2(ranked.index(target) + 2)
    return total / max(1, len(targets))


def rrf(lists: Mapping[str, Sequence[str]], weights: Mapping[str, float], k: float = 60.0) -> list[str]:
    """Weighted reciprocal-rank fusion (services/ranker/fusion.py's rule), ties by id."""
    score: dict[str, float] = {}
    for name, items in lists.items():
        w = weights.get(name, 0.0)
        if w > 0:
            for rank, item in enumerate(items):
                score[item] = score.get(item, 0.0) + w * k / (k + rank)
    return sorted(score, key=lambda i: (-score[i], i))


# The fused list's head (its first FUSION_HEAD items) follows the weights tuned
# for the top 10 (NDCG@10); the rest follows the weights tuned for the depth the
# ranker scores (the target among the first 200): what ranks first and what
# reaches the model at all are different questions, and one set of weights
# answered the second worse than the best table alone (docs/models.md).
FUSION_HEAD = 50


def rrf_head_tail(
    lists: Mapping[str, Sequence[str]],
    head: Mapping[str, float],
    tail: Mapping[str, float] | None,
    size: int = FUSION_HEAD,
) -> list[str]:
    """The first `size` of `rrf(lists, head)`, then `rrf(lists, tail)` without them."""
    first = rrf(lists, head)
    if not tail or dict(tail) == dict(head):
        return first
    top = first[:size]
    chosen = set(top)
    return top + [i for i in rrf(lists, tail) if i not in chosen]


DECAYS = (1.0, 0.9, 0.8, 0.65, 0.5)
LAMBDA_FACTORS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0)  # times the mean item count (diag of X^T X)
FUSION_GRID = (0.0, 0.25, 0.5, 1.0)
DEPTH_GRID = (0.0, 0.5, 1.0)


@dataclass
class Tuned:
    decay: dict[str, float] = field(default_factory=dict)  # seed recency decay per method
    ease_lambda: float = 0.0
    sequence_epochs: int = 0
    fusion: dict[str, float] = field(default_factory=dict)  # RRF weights: methods + "popular"
    fusion_depth: dict[str, float] = field(default_factory=dict)  # the same, past the head (rrf_head_tail)
    ndcg: dict[str, float] = field(default_factory=dict)  # on the tuning split, per source and fused
    users: int = 0
    hold: Holdout | None = None  # the tuning split
    candidates: dict[str, list[str]] = field(default_factory=dict)  # per tuning user: the fused lists, 200


@dataclass(frozen=True)
class _TuningSplit:
    """What every try on the tuning split ranks against: the held-out users (those
    with a history: `targets`), the popularity list that fills, `depth` items a list."""

    hold: Holdout
    targets: dict[str, str]
    popular: list[str]
    seeds_seen: bool  # no recall.seen: a user's seeds are never recommended to them
    depth: int

    def rank_all(self, table: RecallTable, decay: float) -> dict[str, list[str]]:
        return _rank_all(table, self.hold, decay, self.depth, self.popular, self.seeds_seen)


def _rank_all(
    table: RecallTable, hold: Holdout, decay: float, k: int, popular: Sequence[str], seeds_seen: bool
) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for user, hist in hold.history.items():
        seen = frozenset(hold.seen.get(user, ())) | (frozenset(hist) if seeds_seen else frozenset())
        got = [i for i, _ in table.top(hist, recency_weights(len(hist), decay), k, seen)]
        if len(got) < k:  # popularity fills, as the ranker's prior does
            got += [p for p in popular if p not in seen and p not in got][: k - len(got)]
        out[user] = got
    return out


Popularity = Callable[[Sequence[Event]], list[str]]


def tune(hold: Holdout, cfg: BuildConfig, seed: int = 0, progress: Progress = lambda _: None,
         popularity: Popularity | None = None) -> Tuned:  # fmt: skip
    """Seed decay per method, EASE's lambda and the fusion weights that give the
    best NDCG@10 on `hold`, a leave-last-out split of the log (`holdout`; module
    docstring). `seed`: the sequence model's. `popularity`: the ranked list the
    ranker's popularity source would serve, from the events it may see (default:
    the learnt behaviours' counts)."""
    seeds_seen = cfg.seen_behaviors is None
    out = Tuned(users=len(hold.targets))
    if not hold.targets:
        out.fusion = {m: 1.0 for m in cfg.methods} | {"popular": 0.25}
        return out
    data = interactions(hold.training, cfg.behaviors)
    if popularity is not None:
        popular = popularity(hold.training)[:500]
    else:
        pop_count = data.item_strengths()
        popular = [data.item_ids[int(i)] for i in np.lexsort((np.arange(data.n_items), -pop_count))[:500]]
    depth = 200  # each source's list fused (the ranker's recall_per_source is 100 to 200)
    targets = {u: t for u, t in hold.targets.items() if u in hold.history}
    split = _TuningSplit(hold, targets, popular, seeds_seen, depth)
    best_lists: dict[str, dict[str, list[str]]] = {}
    # each method's tries (their tables and ranked lists, a few MB apiece) freed after it, and
    # given back: the heap kept about 100 MB of EASE's through the sequence model's training
    if "knn" in cfg.methods:
        best_lists["knn"] = _tune_knn(data, cfg, split, out, progress)
        give_back()
    if "ease" in cfg.methods:
        best_lists["ease"] = _tune_ease(data, cfg, split, out, progress)
        give_back()
    if "sequence" in cfg.methods:
        best_lists["sequence"] = _tune_sequence(data, split, out, seed, progress)
        give_back()
    best_lists["popular"] = {
        u: [p for p in popular if p not in hold.seen.get(u, set(h))][:depth] for u, h in hold.history.items()
    }
    if not seeds_seen:  # the ranker's `revisit` source: history items not seen (viewed, not bought)
        best_lists["revisit"] = {
            u: [i for i in h if i not in hold.seen.get(u, ())][:depth] for u, h in hold.history.items()
        }
    _tune_head_fusion(best_lists, targets, out, progress)
    names = list(best_lists)
    full = {u: {n: best_lists[n].get(u, []) for n in names} for u in targets}
    _tune_depth_fusion(full, names, targets, depth, out, progress)
    out.hold = hold
    out.candidates = {u: rrf_head_tail(full[u], out.fusion, out.fusion_depth)[:depth] for u in targets}
    return out


def _tune_knn(
    data: Interactions, cfg: BuildConfig, split: _TuningSplit, out: Tuned, progress: Progress
) -> dict[str, list[str]]:
    """item-kNN's seed decay (into `out`); the lists it ranks with it."""
    targets = split.targets
    table = knn_table(data, cfg.previous, cfg.neighbours)
    scored = {d: split.rank_all(table, d) for d in DECAYS}
    best = max(DECAYS, key=lambda d: (ndcg(scored[d], targets), d))
    out.decay["knn"] = best
    out.ndcg["knn"] = round(ndcg(scored[best], targets), 4)
    progress(f"  tuned item-kNN on {len(targets)} users: seed decay {best} (NDCG@10 {out.ndcg['knn']})")
    return scored[best]


def _tune_ease(
    data: Interactions, cfg: BuildConfig, split: _TuningSplit, out: Tuned, progress: Progress
) -> dict[str, list[str]]:
    """EASE's lambda and seed decay (into `out`); the lists it ranks with them."""
    keep = ease_items(data, cfg.ease_items)
    g = gram(data, keep)
    ids = [data.item_ids[int(i)] for i in keep]
    mean_count = float(np.mean(np.diag(g))) or 1.0
    tables: dict[float, NeighbourTable] = {}
    results: dict[tuple[float, float], dict[str, list[str]]] = {}

    def score(point: tuple[float, ...]) -> float:
        lam, d = point
        if lam not in tables:
            tables[lam] = NeighbourTable.from_dense(ids, ease_weights(g, lam), cfg.neighbours)
        results[(lam, d)] = split.rank_all(tables[lam], d)
        return ndcg(results[(lam, d)], split.targets)

    # Ascent from item-kNN's decay (a seed's recency is the user's, whatever ranks it) and the
    # middle lambda: each try ranks every tuning user, and the full grid's 30 tries were 12 %
    # of a 108k-event run (issue 32).
    lambdas = tuple(f * mean_count for f in LAMBDA_FACTORS)
    start = (lambdas[len(lambdas) // 2], out.decay.get("knn", DECAYS[len(DECAYS) // 2]))
    (lam, d), best, tries = grid_ascent((lambdas, DECAYS), start, score)
    out.ease_lambda, out.decay["ease"] = lam, d
    out.ndcg["ease"] = round(best, 4)
    progress(f"  tuned EASE: lambda {lam:.1f}, seed decay {d} (NDCG@10 {out.ndcg['ease']}; {tries} of "
             f"{len(lambdas) * len(DECAYS)} tries)")  # fmt: skip
    return results[(lam, d)]


def grid_ascent(
    grids: Sequence[Sequence[float]], start: Sequence[float], score: Callable[[tuple[float, ...]], float]
) -> tuple[tuple[float, ...], float, int]:
    """Coordinate ascent over a grid: each coordinate swept in turn, the others held, until a
    whole pass moves none; ties go to the larger point (as a max over the whole grid's
    (score, point) did). Each point is scored once. The best point, its score, the points scored."""
    scored: dict[tuple[float, ...], float] = {}

    def key(point: tuple[float, ...]) -> tuple[float, tuple[float, ...]]:
        if point not in scored:
            scored[point] = score(point)
        return scored[point], point

    best = key(tuple(start))
    moved = True
    while moved:
        moved = False
        for axis, grid in enumerate(grids):
            for value in grid:
                trial = key((*best[1][:axis], value, *best[1][axis + 1 :]))
                if trial > best:
                    best, moved = trial, True
    return best[1], best[0], len(scored)


# The sequence model's passes over the log: the best on the tuning split, at
# most SEQUENCE_EPOCHS, stopping once two in a row do not beat it.
SEQUENCE_EPOCHS = 8


def _tune_sequence(
    data: Interactions, split: _TuningSplit, out: Tuned, seed: int, progress: Progress
) -> dict[str, list[str]]:
    """The sequence model's number of epochs (into `out`); the lists it ranks after them."""
    best: tuple[float, int, dict[str, list[str]]] = (-1.0, 0, {})

    def check(epoch: int, model: sequence.SequenceModel) -> bool:
        nonlocal best
        lists = split.rank_all(model, 1.0)
        score = ndcg(lists, split.targets)
        if score > best[0]:
            best = (score, epoch, lists)
        return epoch - best[1] < 2

    sequence.train(data, SEQUENCE_EPOCHS, seed, after_epoch=check)
    out.sequence_epochs = max(1, best[1])
    out.ndcg["sequence"] = round(max(0.0, best[0]), 4)
    progress(f"  tuned the sequence model: {out.sequence_epochs} epochs (NDCG@10 {out.ndcg['sequence']})")
    return best[2]


def _weight_search(
    names: list[str], grid: Sequence[float], score: Callable[[dict[str, float]], float]
) -> tuple[float, dict[str, float]]:
    """The weights (one of `grid` per name, not all 0) with the best score, ties to
    the sorted weights' larger tuple (as max over the grid always chose): every
    combination while there are at most 64, else coordinate ascent from all
    ones (each name's weight tried in turn with the others held, twice over);
    each combination is scored once (the held point recurs in every sweep)."""
    scored: dict[tuple[tuple[str, float], ...], float] = {}

    def key(ws: dict[str, float]) -> tuple[float, list[tuple[str, float]]]:
        items = sorted(ws.items())
        if (point := tuple(items)) not in scored:
            scored[point] = score(ws)
        return scored[point], items

    if len(grid) ** len(names) <= 64:
        combos = [dict(zip(names, ws, strict=True)) for ws in itertools.product(grid, repeat=len(names))
                  if any(w > 0 for w in ws)]  # fmt: skip
        best_score, best_ws = max(key(ws) for ws in combos)
        return best_score, dict(best_ws)
    current = dict.fromkeys(names, max(grid))
    best_score, best_ws = key(current)
    for _ in range(2):
        for name in names:
            for w in grid:
                trial = {**current, name: w}
                if any(v > 0 for v in trial.values()):
                    best_score, best_ws = max((best_score, best_ws), key(trial))
            current = dict(best_ws)
    return best_score, current


def _tune_head_fusion(
    best_lists: dict[str, dict[str, list[str]]], targets: dict[str, str], out: Tuned, progress: Progress
) -> None:
    """The fusion weights (FUSION_GRID per source) with the best NDCG@10, into `out`."""
    names = list(best_lists)

    # Only the head of each list can reach a fused top 10.
    heads = {n: {u: best_lists[n].get(u, [])[:50] for u in targets} for n in names}

    def fused(ws: Mapping[str, float]) -> float:
        return ndcg({u: rrf({n: heads[n][u] for n in names}, ws)[:10] for u in targets}, targets)

    best_score, out.fusion = _weight_search(names, FUSION_GRID, fused)
    out.ndcg["fused"] = round(best_score, 4)
    out.ndcg["popular"] = round(ndcg(best_lists["popular"], targets), 4)
    progress(f"  learnt fusion weights {out.fusion} (NDCG@10 {out.ndcg['fused']})")


def _tune_depth_fusion(
    full: dict[str, dict[str, list[str]]],
    names: list[str],
    targets: dict[str, str],
    depth: int,
    out: Tuned,
    progress: Progress,
) -> None:
    """Past the head: the weights that put the target among the first `depth` most
    often (the head's weights and each table alone among the tries), into `out`.
    `full`: per user, each source's list (`names`: the sources)."""
    head = {u: rrf(full[u], out.fusion) for u in targets}

    def reach(ws: Mapping[str, float]) -> float:
        hits = 0
        for u, target in targets.items():
            top = head[u][:FUSION_HEAD]
            if target in top:
                hits += 1
                continue
            rest = [i for i in rrf(full[u], ws)[: depth + FUSION_HEAD] if i not in top]
            hits += target in rest[: depth - len(top)]
        return hits / len(targets)

    # revisit's list is the user's own few items, all inside the head: its weight stays the head's.
    free = [n for n in names if n != "revisit"]
    fixed = {n: out.fusion[n] for n in names if n not in free}
    base = reach(out.fusion)
    best_reach, best_depth = _weight_search(free, DEPTH_GRID, lambda ws: reach({**ws, **fixed}))
    best_depth = {**best_depth, **fixed}
    out.fusion_depth = dict(sorted(best_depth.items())) if best_reach > base else {}
    best_reach = max(best_reach, base)
    out.ndcg[f"fused_recall@{depth}"] = round(best_reach, 4)
    progress(f"  past the first {FUSION_HEAD}: weights {out.fusion_depth or out.fusion} (target among "
             f"the first {depth}: {best_reach:.3f}; with the head's weights {base:.3f})")  # fmt: skip
