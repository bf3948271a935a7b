"""`recmesh demo write-data | write-shop`: the demo's and the generated shop's data files."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def _cmd_demo_write(args: argparse.Namespace) -> int:
    from recmesh.features.repository import DEMO_REPOSITORY, load_feature_set
    from recmesh.features.tabular import write_csv
    from recmesh.tools.demo.generate import make_catalog, offline_rows

    feature_set = load_feature_set(DEMO_REPOSITORY)
    users, items = offline_rows(make_catalog())
    out = Path(args.out)
    print(write_csv(feature_set, out, "user", users), write_csv(feature_set, out, "item", items))
    return 0


def _cmd_demo_write_shop(args: argparse.Namespace) -> int:
    from recmesh.tools.demo.shop import write_shop

    counts = write_shop(Path(args.out), args.shoppers, args.products, args.days, args.seed)
    print(f"wrote {counts['purchases']:,} purchases (purchases.csv), {counts['events']:,} views, carts "
          f"and purchases (events.csv) and {counts['products']:,} products (products.csv) to "
          f"{args.out}")  # fmt: skip
    return 0


def add_commands(sub: Any) -> None:
    demo = sub.add_parser("demo", help="demo data").add_subparsers(dest="demo_command", required=True)
    write = demo.add_parser("write-data", help="write the demo users.csv and items.csv")
    write.add_argument("out")
    write.set_defaults(func=_cmd_demo_write)
    shop = demo.add_parser(
        "write-shop",
        help="write a generated shop's logs (purchases only; views, carts and purchases) and products, "
        "whose preferences are known (examples/shop)",
    )
    shop.add_argument("out")
    shop.add_argument("--shoppers", type=int, default=1000)
    shop.add_argument("--products", type=int, default=2000)
    shop.add_argument("--days", type=int, default=180)
    shop.add_argument("--seed", type=int, default=11)
    shop.set_defaults(func=_cmd_demo_write_shop)
