"""A shop's logs whose true preferences are known: implicit feedback in two shapes.

The commonest recommendation data is not ratings but interactions: one row per
product bought, played or clicked, no names, a category for a few products,
no users file. `write_shop` writes such a world in the team's own shapes (CSV
with their column names, days as dates), so that recmesh is proven on it the
way a team would bring it (`recmesh events import` with a repository file):

- `purchases.csv` (shopper, product, day): purchases only, day resolution;
- `events.csv` (shopper, product, action, time): views, carts and purchases,
  seconds resolution, the same purchases as `purchases.csv`;
- `products.csv` (product, aisle): an aisle for only AISLE_KNOWN of the
  products, empty for the rest; no texts.

The world (seeded; the lift any method shows must come from these):
- AISLES aisles; a product belongs to one and has a Zipf(1.1) popularity.
- Each product has FOLLOWERS products often bought after it (accessories,
  refills), most of them from its own aisle: sequence-aware and item-to-item
  methods can learn them, popularity cannot.
- A shopper has two favourite aisles and visits every Exp(VISIT_DAYS) days;
  a visit buys 1-3 products, never one bought before (durable goods). Each
  purchase is, with P_FOLLOW, a follower of one of the shopper's last three
  purchases; with P_FAVOURITE a product of a favourite aisle by popularity;
  otherwise any product by popularity.
- In `events.csv` a visit also views 2-6 other products of the visit's aisle
  (by popularity) and carts some of them (P_CART) without buying; every
  purchase is preceded by its view and its cart.
"""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

AISLES = 24
FOLLOWERS = 4
AISLE_KNOWN = 0.1
VISIT_DAYS = 9.0
P_FOLLOW = 0.4
P_FAVOURITE = 0.45
P_CART = 0.25
START = dt.date(2024, 1, 1)


@dataclass(frozen=True)
class Visit:
    shopper: str
    day: int  # days after START
    bought: list[int]
    browsed: list[int]  # viewed, not bought (events.csv only)
    carted: list[int]  # browsed and carted, not bought


class _World:
    def __init__(self, products: int, rng: np.random.Generator) -> None:
        self.rng = rng
        self.aisle = rng.integers(0, AISLES, products)
        ranks = rng.permutation(products) + 1
        pop = 1.0 / ranks**1.1
        self.pop = pop / pop.sum()
        self.by_aisle = [np.flatnonzero(self.aisle == a) for a in range(AISLES)]
        self.aisle_pop = [self.pop[idx] / self.pop[idx].sum() for idx in self.by_aisle]
        self.followers = np.empty((products, FOLLOWERS), np.int64)
        for p in range(products):
            own = self.by_aisle[int(self.aisle[p])]
            for f in range(FOLLOWERS):  # 3 of 4 from the product's own aisle
                pool = own if f < 3 and len(own) > 1 else np.arange(products)
                self.followers[p, f] = pool[int(rng.integers(len(pool)))]

    def from_aisle(self, aisle: int) -> int:
        idx = self.by_aisle[aisle]
        return int(idx[self.rng.choice(len(idx), p=self.aisle_pop[aisle])])

    def any(self) -> int:
        return int(self.rng.choice(len(self.pop), p=self.pop))


def visits(shoppers: int, products: int, days: int, seed: int) -> Iterator[Visit]:
    rng = np.random.default_rng(seed)
    world = _World(products, rng)
    for s in range(shoppers):
        favourites = rng.choice(AISLES, 2, replace=False)
        bought: list[int] = []
        day = float(rng.uniform(0, days * 0.6))
        while day < days:
            n = int(rng.integers(1, 4))
            basket: list[int] = []
            for _ in range(n * 5):  # draws that hit an owned product are retried
                if len(basket) == n:
                    break
                r = rng.random()
                if r < P_FOLLOW and bought:
                    seed_item = bought[-1 - int(rng.integers(min(3, len(bought))))]
                    p = int(world.followers[seed_item, int(rng.integers(FOLLOWERS))])
                elif r < P_FOLLOW + P_FAVOURITE:
                    p = world.from_aisle(int(favourites[int(rng.integers(2))]))
                else:
                    p = world.any()
                if p not in bought and p not in basket:
                    basket.append(p)
            aisle = int(world.aisle[basket[0]]) if basket else int(favourites[0])
            browsed = [world.from_aisle(aisle) for _ in range(int(rng.integers(2, 7)))]
            browsed = [b for b in dict.fromkeys(browsed) if b not in basket]
            carted = [b for b in browsed if rng.random() < P_CART]
            yield Visit(f"s{s}", int(day), basket, browsed, carted)
            bought += basket
            day += float(rng.exponential(VISIT_DAYS))


def write_shop(
    out: Path, shoppers: int = 2000, products: int = 3000, days: int = 365, seed: int = 11
) -> dict[str, int]:
    """Write purchases.csv, events.csv and products.csv under `out`; their row counts."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed + 1)
    counts = {"purchases": 0, "events": 0, "products": products}
    with (
        (out / "purchases.csv").open("w", newline="") as pf,
        (out / "events.csv").open("w", newline="") as ef,
    ):
        purchases, events = csv.writer(pf, lineterminator="\n"), csv.writer(ef, lineterminator="\n")
        purchases.writerow(["shopper", "product", "day"])
        events.writerow(["shopper", "product", "action", "time"])
        for v in visits(shoppers, products, days, seed):
            date = START + dt.timedelta(days=v.day)
            at = dt.datetime(date.year, date.month, date.day, 8, tzinfo=dt.UTC)
            at += dt.timedelta(seconds=int(rng.integers(0, 12 * 3600)))
            rows: list[tuple[int, str, int]] = []  # (product, action, seconds after the visit's start)
            for n, p in enumerate(v.bought):
                rows += [(p, "view", 40 * n), (p, "cart", 40 * n + 15)]
                purchases.writerow([v.shopper, f"p{p}", date.isoformat()])
                counts["purchases"] += 1
            for n, p in enumerate(v.browsed):
                rows.append((p, "view", 7 + 40 * n))
                if p in v.carted:
                    rows.append((p, "cart", 20 + 40 * n))
            checkout = 40 * (len(v.bought) + len(v.browsed)) + 30
            rows += [(p, "purchase", checkout + n) for n, p in enumerate(v.bought)]
            for p, action, sec in sorted(rows, key=lambda r: r[2]):
                events.writerow([v.shopper, f"p{p}", action, (at + dt.timedelta(seconds=sec)).isoformat()])
                counts["events"] += 1
    world = _World(products, np.random.default_rng(seed))  # the same draws as `visits` made first
    known = np.random.default_rng(seed + 2).random(products) < AISLE_KNOWN
    with (out / "products.csv").open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["product", "aisle"])
        for p in range(products):
            w.writerow([f"p{p}", f"aisle{world.aisle[p]}" if known[p] else ""])
    return counts
