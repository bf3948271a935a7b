"""Ranking quality by leave-last-out: the split, the baseline and the metrics.

The split (`leave_last_out`), per user, by time: the user's last positive
example (an event of the repository's `training.examples` behaviours that its
`training.label` rule calls positive, of the `target` behaviours when given;
ties in time broken by event id, as the log is sorted: with day-resolution
times the order within a day is that of the ids, the same in every run) is
the held-out target. Everything the user did from the target's lead-up on
(their first event on the target's item since their previous target, e.g.
the view and the cart of what they then bought; with one event per item, the
target itself) is held out of training and of the state the ranking is asked
from; everything before it, and every event of the users not held out, is the
training part (recmesh.retrieval.build.last_targets). The user's history is
the items of their training-part events (of the repository's `recall.seen`
behaviours when it declares them): the items they have "rated" or bought,
which are never candidates. The target is ranked as of 1 ms before its
lead-up, over every catalog item not in the history: a hit when it is among
the first k.

Metrics: HR@k (share of targets in the first k) and NDCG@k (1/log2(rank + 2)
for a hit at 0-based rank, 0 otherwise; one relevant item, so the ideal DCG is
1). The popularity baseline (`Popularity`) ranks items by how many events of
the popularity behaviours they had before the as-of time, ties by item id.

These are pure functions over events; recmesh.tools.bench.ranking asks the served
mesh for its rankings and uses them.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from recmesh.events import Event
from recmesh.features.backfill import LabelRule, positive_examples
from recmesh.features.eventlog import select
from recmesh.retrieval.build import last_targets


@dataclass(frozen=True)
class Target:
    user_id: str
    item_id: str
    event_id: str
    event_time: int

    @property
    def as_of_ms(self) -> int:
        return self.event_time - 1


@dataclass
class Split:
    """Targets (by time), the training part, each target user's history."""

    targets: list[Target]
    training: Sequence[Event]
    history: dict[str, set[str]] = field(default_factory=dict)
    held_out_events: int = 0
    users_with_a_positive: int = 0


def leave_last_out(
    rule: LabelRule,
    events: Sequence[Event],
    users: int | None = None,
    seed: int = 0,
    target: Collection[str] | None = None,
    seen: Collection[str] | None = None,
) -> Split:
    """Hold out each user's last positive example and what follows it (module
    docstring). `users`: hold out only this many users, drawn under `seed`
    (the others stay whole in the training part); None: every user with a
    positive example and a history before it. `target`: only positive
    examples of these behaviours are targets (the last purchase, while the
    history holds views and carts too). `seen`: only items of these
    behaviours' events are the user's history, never candidates (the
    repository's recall.seen: what was bought, not what was viewed)."""
    positive = positive_examples(rule, events)
    is_target = [
        p and (target is None or ev.behavior in target) for ev, p in zip(events, positive, strict=True)
    ]
    found = last_targets(events, is_target)
    eligible = sorted(found)
    chosen = set(eligible if users is None or users >= len(eligible) else
                 random.Random(seed).sample(eligible, users))  # fmt: skip
    cut_index = {u: found[u][1] for u in chosen}
    cut = {u: events[c].event_time for u, c in cut_index.items()}
    training: list[int] = []  # the indices of the training part's events
    history: dict[str, set[str]] = {u: set() for u in chosen}
    held = 0
    for n, ev in enumerate(events):
        u = ev.user_id
        counts = seen is None or ev.behavior in seen
        if u in cut_index and (n >= cut_index[u] or ev.event_time >= cut[u]):
            held += 1
            if n < cut_index[u] and counts:  # the same moment as the target, before it in the log: history
                history[u].add(ev.item_id)
            continue
        training.append(n)
        if u in history and counts:
            history[u].add(ev.item_id)
    targets = sorted(
        (Target(u, events[found[u][0]].item_id, events[found[u][0]].event_id, cut[u]) for u in chosen),
        key=lambda t: (t.event_time, t.user_id),
    )
    # The target's own item can be in the history (rated before, rated again): it stays a candidate.
    for t in targets:
        history[t.user_id].discard(t.item_id)
    users_with_one = len({ev.user_id for ev, t in zip(events, is_target, strict=True) if t})
    return Split(targets, select(events, training), history, held, users_with_one)


class Popularity:
    """Item counts of the popularity behaviours, fed in time order."""

    def __init__(self, behaviors: Collection[str]) -> None:
        self._behaviors = frozenset(behaviors)
        self.counts: Counter[str] = Counter()

    def add(self, events: Iterable[Event]) -> None:
        for ev in events:
            if ev.behavior in self._behaviors:
                self.counts[ev.item_id] += 1

    def top(self, k: int, exclude: Collection[str]) -> list[str]:
        # The k best not excluded are among the k + len(exclude) best: no full sort per target.
        ranked = heapq.nsmallest(k + len(exclude), self.counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return [i for i, _ in ranked if i not in exclude][:k]


def first_k(ranked: Iterable[str], exclude: Collection[str], k: int) -> list[str]:
    """The first k items of a ranking that are not in `exclude` (the history)."""
    out: list[str] = []
    for item in ranked:
        if item not in exclude and item not in out:
            out.append(item)
            if len(out) == k:
                break
    return out


@dataclass
class Quality:
    """HR@k and NDCG@k of one ranker over the targets it was asked about."""

    k: int
    hits: int = 0
    dcg: float = 0.0
    asked: int = 0
    found: int = 0  # the target anywhere in the returned ranking (recall of the candidate list)

    def add(self, target_item: str, ranked: Sequence[str], full: Sequence[str] | None = None) -> None:
        """`ranked`: the first k (history removed); `full`: the whole returned list."""
        self.asked += 1
        if target_item in (full if full is not None else ranked):
            self.found += 1
        if target_item in ranked[: self.k]:
            self.hits += 1
            self.dcg += 1.0 / math.log2(ranked.index(target_item) + 2)

    @property
    def hr(self) -> float:
        return self.hits / self.asked if self.asked else float("nan")

    @property
    def ndcg(self) -> float:
        return self.dcg / self.asked if self.asked else float("nan")

    def to_json(self) -> dict[str, float | int]:
        return {
            f"hr@{self.k}": round(self.hr, 4),
            f"ndcg@{self.k}": round(self.ndcg, 4),
            "targets": self.asked,
            "target_in_list": round(self.found / self.asked, 4) if self.asked else float("nan"),
        }


# --- classical baselines, fed in time order like Popularity ----------------------------


class Histories:
    """Each user's newest distinct items (newest first, at most `cap`) among events
    of `behaviors`: what the ingest keeps online as the user's history."""

    def __init__(self, behaviors: Collection[str], cap: int) -> None:
        self._behaviors = frozenset(behaviors)
        self._cap = cap
        self.items: dict[str, list[str]] = {}
        self.events: Counter[str] = Counter()  # events of every behaviour, per user

    def add(self, events: Iterable[Event]) -> None:
        for ev in events:
            self.events[ev.user_id] += 1
            if ev.behavior not in self._behaviors:
                continue
            h = self.items.setdefault(ev.user_id, [])
            if ev.item_id in h:
                h.remove(ev.item_id)
            h.insert(0, ev.item_id)
            del h[self._cap :]


class SequentialKnn:
    """Sequential item-to-item co-occurrence kNN, counted only from the events fed
    so far (never the future): each event of `behaviors` is paired with the
    user's previous `previous` distinct items, both directions; a candidate's
    score from the user's last `seeds` items is the sum of count(a, b) /
    sqrt(count(a) count(b)). The classical baseline a team already runs."""

    def __init__(self, behaviors: Collection[str], previous: int = 19, seeds: int = 10) -> None:
        self._behaviors = frozenset(behaviors)
        self._previous = previous
        self._seeds = seeds
        self._recent: dict[str, list[str]] = {}
        self.pairs: dict[str, Counter[str]] = {}
        self.count: Counter[str] = Counter()

    def add(self, events: Iterable[Event]) -> None:
        keep = max(self._previous, self._seeds)
        for ev in events:
            if ev.behavior not in self._behaviors:
                continue
            item = ev.item_id
            recent = self._recent.setdefault(ev.user_id, [])
            if recent and recent[0] == item:
                continue  # the same step again (a view and its click)
            mine = self.pairs.setdefault(item, Counter())
            for other in recent[: self._previous]:
                if other != item:
                    mine[other] += 1
                    self.pairs.setdefault(other, Counter())[item] += 1
            self.count[item] += 1
            if item in recent:
                recent.remove(item)
            recent.insert(0, item)
            del recent[keep:]

    def scores(self, user_id: str) -> dict[str, float]:
        total: dict[str, float] = {}
        for seed in self._recent.get(user_id, [])[: self._seeds]:
            cs = self.count[seed]
            for other, c in self.pairs.get(seed, {}).items():
                total[other] = total.get(other, 0.0) + c / math.sqrt(cs * self.count[other])
        return total

    def top(self, user_id: str, k: int, exclude: Collection[str], fill: Popularity) -> list[str]:
        s = self.scores(user_id)
        best = heapq.nsmallest(k + len(exclude), s.items(), key=lambda kv: (-kv[1], kv[0]))
        out = [i for i, _ in best if i not in exclude][:k]
        return out + [p for p in fill.top(k, exclude) if p not in out][: k - len(out)]


def rank_of(target: str, ranked: Sequence[str]) -> int | None:
    try:
        return list(ranked).index(target)
    except ValueError:
        return None


@dataclass
class RecallAt:
    """The share of targets among the first N candidates of a list."""

    cuts: tuple[int, ...] = (100, 200, 500)
    asked: int = 0
    hits: Counter[int] = field(default_factory=Counter)

    def add(self, position: int | None) -> None:
        self.asked += 1
        for n in self.cuts:
            if position is not None and position < n:
                self.hits[n] += 1

    def to_json(self) -> dict[str, float]:
        return {
            f"recall@{n}": round(self.hits[n] / self.asked, 4) if self.asked else float("nan")
            for n in self.cuts
        }
