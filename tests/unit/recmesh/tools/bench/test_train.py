"""`recmesh bench train`'s generated logs: by default users grow with the
purchases; with `shoppers` the users are held and the days grow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recmesh.errors import InvalidArgument
from recmesh.tools.bench.train import PURCHASES_PER_SHOPPER, shop_log


def _users_and_events(log: Path) -> tuple[set[str], int]:
    users, n = set(), 0
    with log.open() as fh:
        for line in fh:
            users.add(json.loads(line)["user_id"])
            n += 1
    return users, n


def test_a_log_of_more_purchases_by_the_same_shoppers(tmp_path: Path) -> None:
    default = shop_log(3000, tmp_path)
    held = shop_log(6000, tmp_path, shoppers=50)
    assert default.parent.name == "shop-3000" and held.parent.name == "shop-6000-50-shoppers"
    users, events = _users_and_events(default)
    assert 0.6 * 3000 < events < 1.4 * 3000 and len(users) <= 3000 // PURCHASES_PER_SHOPPER
    users, events = _users_and_events(held)
    assert 0.8 * 6000 < events < 1.2 * 6000 and 40 <= len(users) <= 50
    for shoppers in (10_000, 10):  # under one visit each; most of the catalog each
        with pytest.raises(InvalidArgument, match="purchases a shopper"):
            shop_log(6000, tmp_path, shoppers=shoppers)
