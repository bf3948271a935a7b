"""What one answer earned: its credited items (last touch) and its figures.

Crediting. A positive event (a behaviour `[evaluation] positive` names) by the
answer's user on an item it showed, at event time t with as_of <= t <= as_of +
window, is credited to the answer, unless
- the event names another answer (`request_id` sent back on the event): an
  event that names an answer is credited to that answer only;
- a later answer of the same user (as_of' in (as_of, t]) also showed the item:
  the last answer that showed it before the act gets the credit (last touch).
Each item is credited once per answer however many events name it, so an
event applied twice (redelivery, an app's retry) counts once.

Figures of one answer with the items of its first k positions (n = min(k,
shown)), C its credited items among them:
- ctr@k = |C| / n; hit@k = 1 if C else 0;
- ndcg@k = sum over credited positions p of 1/log2(p+1), over the same sum for
  the first |C| positions (0 without a credit);
- auc = of the (credited, not credited) pairs among the n, the share whose
  credited item scored higher (ties count half); none unless both kinds are
  there. Averaged over answers this is the grouped AUC ("GAUC", Zhou et al.,
  DIN, KDD 2018): scores are compared within one user's answer, so models whose
  scores live on different scales stay comparable, and a user with many
  answers does not dominate by score range.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from recmesh.evaluation.impression import Shown

MEMBER_SEP = "|"  # item and event ids carry no "|" (recmesh.events); a request id is last


@dataclass(frozen=True, slots=True)
class Positive:
    """A positive event of the user, as attribution keeps it."""

    item_id: str
    event_time: int
    event_id: str
    request_id: str | None = None

    def member(self) -> str:
        return MEMBER_SEP.join((self.item_id, self.event_id, self.request_id or ""))

    @classmethod
    def from_member(cls, member: str, event_time: int) -> Positive:
        item_id, event_id, request_id = member.split(MEMBER_SEP, 2)
        return cls(item_id, event_time, event_id, request_id or None)


@dataclass(frozen=True, slots=True)
class Touch:
    """Another answer to the same user: when, and what it showed."""

    request_id: str
    as_of_ms: int
    items: frozenset[str]


def credited(
    shown: Shown, positives: Iterable[Positive], others: Iterable[Touch], window_ms: int
) -> set[str]:
    """The items of `shown` its user acted on that are credited to it (module docstring)."""
    items = set(shown.items)
    mine = (shown.as_of_ms, shown.request_id)
    later = [o for o in others if (o.as_of_ms, o.request_id) > mine]
    out: set[str] = set()
    for p in positives:
        if p.item_id not in items or p.item_id in out:
            continue
        if not shown.as_of_ms <= p.event_time <= shown.as_of_ms + window_ms:
            continue
        if p.request_id is not None:
            if p.request_id == shown.request_id:
                out.add(p.item_id)
            continue
        if any(o.as_of_ms <= p.event_time and p.item_id in o.items for o in later):
            continue  # a later answer showed it before the act: its credit
        out.add(p.item_id)
    return out


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Share of (positive, negative) pairs ordered right by score, ties half; None without both."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return None
    right = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return right / (len(pos) * len(neg))


@dataclass(frozen=True, slots=True)
class Outcome:
    """The figures of one answer over its first k positions."""

    ctr: float
    hit: float
    ndcg: float
    auc: float | None
    positions: tuple[int, ...] = field(default=())  # 1-based positions credited, within k


def outcome(shown: Shown, clicked: set[str], k: int, scores: Sequence[float] | None = None) -> Outcome:
    """The answer's figures (module docstring); `scores` replaces the served ones (a shadow model's)."""
    top = shown.items[:k]
    n = len(top)
    if n == 0:
        return Outcome(0.0, 0.0, 0.0, None)
    labels = [i in clicked for i in top]
    positions = tuple(p for p, y in enumerate(labels, start=1) if y)
    hits = len(positions)
    dcg = sum(1 / math.log2(p + 1) for p in positions)
    ideal = sum(1 / math.log2(p + 1) for p in range(1, hits + 1))
    served = (shown.scores if scores is None else scores)[:n]
    return Outcome(hits / n, float(hits > 0), dcg / ideal if hits else 0.0, auc(served, labels), positions)
