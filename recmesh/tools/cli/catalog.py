"""`recmesh catalog load`: users' and items' offline features into Redis, as the repository maps them."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from recmesh.tools.catalog import load_catalog_files
from recmesh.tools.cli.common import print_figures, refuse_demo, repository, repository_arg, say_for


def _cmd_catalog_load(args: argparse.Namespace) -> int:
    from recmesh.settings import FeatureSettings

    feature_set = repository(args)
    refuse_demo(feature_set, args, "catalog load")
    say = say_for(args)
    figures = asyncio.run(
        load_catalog_files(
            feature_set, FeatureSettings().redis_url, Path(args.users) if args.users else None,
            Path(args.items) if args.items else None, say,
        )
    )  # fmt: skip
    print_figures(
        figures, args.json,
        f"loaded {figures['users']:,} users and {figures['items']:,} items in {figures['seconds']} s; "
        f"Redis memory per user {figures['bytes_per_user']} B, per item {figures['bytes_per_item']} B",
    )  # fmt: skip
    return 0


def add_commands(sub: Any) -> None:
    cat = sub.add_parser("catalog", help="users' and items' offline features").add_subparsers(
        dest="catalog_command", required=True
    )
    load = cat.add_parser("load", help="load users and items into Redis (CSV, TSV, Parquet or JSON lines)")
    repository_arg(load)
    load.add_argument("--users", help="users file (default: the repository's users.source)")
    load.add_argument("--items", help="items file (default: the repository's items.source)")
    load.add_argument("--demo", action="store_true", help="allow loading the demo repository's catalog")
    load.add_argument("--json", action="store_true")
    load.set_defaults(func=_cmd_catalog_load)
