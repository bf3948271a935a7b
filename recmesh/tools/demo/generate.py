"""A synthetic catalog and event stream in which recent behaviour is predictive.

Structure (documented because the model's measured lift must come from it):
- 12 categories; items get a category and a Zipf(1.05) popularity rank.
- Users have 2-3 interest categories (offline `interest_tags`) and an age band.
- Behaviour comes in sessions. A session has a *current* category: an interest
  with probability 0.6, otherwise any category. 70% of views are drawn from the
  current category (by popularity), the rest from the whole catalog.
- A view becomes a click with probability sigmoid(-2.6 + 2.0·[item in current
  category] + 0.5·[item in interests] + 1.2·[item trending] + 0.25·log popularity
  weight). The current category drifts: after a click it switches with p = 0.25.
  So the user's clicks of the last minutes (real-time) reveal the current
  category far better than the static interests do.
- Every 20 minutes 40 items trend: picked 15x more often and clicked more, which
  only real-time item counters can see.
- A click follows its view by 1-3 s; add_to_cart follows a click with p = 0.15,
  purchase follows a cart with p = 0.3.
Everything is seeded: the same seed gives the same catalog and events.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

CATEGORIES = (
    "news", "sports", "music", "movies", "tech", "food",
    "travel", "fashion", "gaming", "science", "finance", "kids",
)  # fmt: skip
AGE_BANDS = ("18-24", "25-34", "35-44", "45-54", "55+")
TREND_PERIOD_MS = 20 * 60 * 1000
TRENDING_ITEMS = 40


@dataclass(frozen=True)
class Catalog:
    items: list[dict[str, Any]]  # item_id, category, length, author_level, popularity, title
    users: list[dict[str, Any]]  # user_id, age_band, interest_tags

    @property
    def item_ids(self) -> list[str]:
        return [i["item_id"] for i in self.items]


def make_catalog(n_items: int = 3000, n_users: int = 2000, seed: int = 7) -> Catalog:
    rng = np.random.default_rng(seed)
    ranks = rng.permutation(n_items) + 1
    weights = 1.0 / ranks**1.05
    items = []
    for i in range(n_items):
        cat = CATEGORIES[int(rng.integers(len(CATEGORIES)))]
        items.append(
            {
                "item_id": f"i{i}",
                "category": cat,
                "length": int(rng.integers(30, 1800)),
                "author_level": int(rng.integers(1, 6)),
                "popularity": round(float(weights[i] * 10_000), 3),
                "title": f"{cat} story {i}",
            }
        )
    users = []
    for u in range(n_users):
        k = int(rng.integers(2, 4))
        tags = sorted(str(c) for c in rng.choice(CATEGORIES, size=k, replace=False))
        users.append(
            {
                "user_id": f"u{u}",
                "age_band": AGE_BANDS[int(rng.integers(len(AGE_BANDS)))],
                "interest_tags": tags,
            }
        )
    return Catalog(items, users)


class _Sampler:
    def __init__(self, catalog: Catalog, rng: np.random.Generator) -> None:
        self.rng = rng
        pop = np.array([i["popularity"] for i in catalog.items])
        self.pop = pop / pop.sum()
        self.log_pop = np.log(pop / pop.max())
        self.cats = np.array([CATEGORIES.index(i["category"]) for i in catalog.items])
        self.by_cat = [np.flatnonzero(self.cats == c) for c in range(len(CATEGORIES))]
        self.trending = np.zeros(len(pop), dtype=bool)
        self.global_cdf = self.pop
        self.cat_cdf: list[np.ndarray] = []
        self.period = -1

    def set_period(self, t_ms: int) -> None:
        period = t_ms // TREND_PERIOD_MS
        if period == self.period:
            return
        self.period = period
        trend_rng = np.random.default_rng(int(period) % (2**32))
        self.trending[:] = False
        self.trending[trend_rng.choice(len(self.pop), TRENDING_ITEMS, replace=False)] = True
        w = self.pop * np.where(self.trending, 15.0, 1.0)
        self.global_cdf = np.cumsum(w) / w.sum()
        self.cat_cdf = [np.cumsum(w[idx]) / w[idx].sum() for idx in self.by_cat]

    def pick(self, category: int) -> int:
        if self.rng.random() < 0.7:
            pos = int(np.searchsorted(self.cat_cdf[category], self.rng.random()))
            return int(self.by_cat[category][min(pos, len(self.by_cat[category]) - 1)])
        return min(int(np.searchsorted(self.global_cdf, self.rng.random())), len(self.pop) - 1)


def generate_events(
    catalog: Catalog, start_ms: int, duration_ms: int, sessions: int, seed: int = 11
) -> Iterator[dict[str, Any]]:
    """Events sorted by event_time, with ids unique for this (seed, start_ms)."""
    rng = np.random.default_rng(seed)
    sampler = _Sampler(catalog, rng)
    activity = rng.pareto(1.5, len(catalog.users)) + 1
    activity /= activity.sum()
    out: list[dict[str, Any]] = []
    starts = np.sort(rng.integers(start_ms, start_ms + duration_ms, sessions))
    for s, t0 in enumerate(starts):
        user = catalog.users[int(rng.choice(len(catalog.users), p=activity))]
        interests = [CATEGORIES.index(c) for c in user["interest_tags"]]
        current = int(rng.choice(interests)) if rng.random() < 0.6 else int(rng.integers(len(CATEGORIES)))
        t = int(t0)
        for step in range(int(rng.geometric(1 / 12))):
            t += int(rng.exponential(8000)) + 200
            if t >= start_ms + duration_ms:
                break
            sampler.set_period(t)
            idx = sampler.pick(current)
            item = catalog.items[idx]
            base = f"s{seed}-{start_ms}-{s}-{step}"
            out.append(_event(base + "v", user, item, "view", t))
            logit = (
                -2.6
                + 2.0 * (sampler.cats[idx] == current)
                + 0.5 * (sampler.cats[idx] in interests)
                + 1.2 * sampler.trending[idx]
                + 0.25 * sampler.log_pop[idx]
            )
            if rng.random() < 1 / (1 + math.exp(-logit)):
                tc = t + int(rng.integers(1000, 3000))
                out.append(_event(base + "c", user, item, "click", tc))
                if rng.random() < 0.15:
                    out.append(_event(base + "a", user, item, "add_to_cart", tc + 2000))
                    if rng.random() < 0.3:
                        out.append(_event(base + "p", user, item, "purchase", tc + 6000))
                if rng.random() < 0.25:
                    current = int(rng.integers(len(CATEGORIES)))
    out.sort(key=lambda e: (e["event_time"], e["event_id"]))
    yield from out


def _event(eid: str, user: dict[str, Any], item: dict[str, Any], behavior: str, t: int) -> dict[str, Any]:
    return {
        "event_id": eid,
        "user_id": user["user_id"],
        "item_id": item["item_id"],
        "behavior": behavior,
        "event_time": t,
    }


def offline_rows(
    catalog: Catalog,
) -> tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, dict[str, Any]]]]:
    """(user_id, features), (item_id, features) as loaded into the offline store."""
    users = [
        (u["user_id"], {"age_band": u["age_band"], "interest_tags": u["interest_tags"]})
        for u in catalog.users
    ]
    items = [
        (
            i["item_id"],
            {k: i[k] for k in ("category", "length", "author_level", "popularity")},
        )
        for i in catalog.items
    ]
    return users, items
