"""`recmesh features get | backfill | compare | dump-served`: look-ups, the
point-in-time replay and the online/offline check."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from recmesh.errors import NotFound
from recmesh.features.tabular import read_catalog
from recmesh.tools.cli.common import print_figures, repository, repository_arg, say_for


async def _features_get(args: argparse.Namespace) -> dict[str, Any]:
    from recmesh.clients.feature import FeatureClient
    from recmesh.features.wire import row_to_json, table_to_json
    from recmesh.settings import RankerSettings

    client = FeatureClient(args.addr or RankerSettings().feature_addr, "cli")
    try:
        resp = await client.get_features(args.user, args.item or [], args.as_of or 0, cap_s=5.0)
    finally:
        await client.close()
    return {
        "feature_version": resp.feature_version,
        "as_of_ms": resp.as_of_ms,
        "degraded": list(resp.degraded),
        "user": {"user_id": resp.user.entity_id, "features": row_to_json(resp.user)},
        "items": table_to_json(resp.items),
    }


def _cmd_features_get(args: argparse.Namespace) -> int:
    print(json.dumps(asyncio.run(_features_get(args)), indent=2))
    return 0


def _cmd_features_backfill(args: argparse.Namespace) -> int:
    from recmesh.features.backfill import backfill

    feature_set = repository(args)
    users, items = read_catalog(feature_set, args.users, args.items)
    say = say_for(args)
    figures = backfill(feature_set, Path(args.events), Path(args.out), users, items, progress=say)
    print_figures(figures, args.json, f"wrote {figures['rows']} rows ({figures['positives']} positive) to "
                  f"{args.out} in {figures['seconds']} s")  # fmt: skip
    return 0


def _cmd_features_compare(args: argparse.Namespace) -> int:
    from recmesh.features.eventlog import sorted_events
    from recmesh.features.served import compare, format_report, positions_path, read_positions, read_served

    feature_set = repository(args)
    users, items = read_catalog(feature_set, args.users, args.items)
    log = Path(args.events)
    events = sorted_events(log, feature_set.event_schema)
    places = Path(args.positions) if args.positions else positions_path(log)
    if args.positions and not places.exists():
        raise NotFound(f"--positions {places}: no such file")
    positions = read_positions(places) if places.exists() else None
    report = compare(feature_set, read_served(Path(args.served)), events, users, items, positions)
    print(json.dumps(report.to_json()) if args.json else format_report(report))
    return 1 if report.mismatches else 0


def _cmd_features_dump_served(args: argparse.Namespace) -> int:
    from recmesh.features.served import dump_topic
    from recmesh.settings import FeatureSettings

    settings = FeatureSettings()
    topic = args.topic or settings.served_topic
    dump = asyncio.run(dump_topic(settings.kafka_bootstrap, topic, Path(args.out), args.timeout))
    print(f"wrote {dump.written} served records from {topic} to {args.out}")
    return 0


def add_commands(sub: Any) -> None:
    feats = sub.add_parser("features", help="feature look-ups, replay and checks").add_subparsers(
        dest="features_command", required=True
    )
    get = feats.add_parser("get", help="print the features the ranker would see, as JSON")
    get.add_argument("--user", required=True, help="user id, e.g. u42")
    get.add_argument("--item", action="append", help="repeat for several items")
    get.add_argument("--as-of", type=int, help="epoch ms (default: now)")
    get.add_argument("--addr", help="feature service address (default: FEATURE_ADDR)")
    get.set_defaults(func=_cmd_features_get)
    bf = feats.add_parser("backfill", help="point-in-time training rows from an event log (JSON lines)")
    bf.add_argument("--events", required=True, help="canonical JSON-lines event log, any order, any size")
    bf.add_argument("--out", required=True, help="output JSON lines, one row per training example")
    repository_arg(bf)
    bf.add_argument("--users", help="users file (default: the repository's users.source)")
    bf.add_argument("--items", help="items file (default: the repository's items.source)")
    bf.add_argument("--json", action="store_true")
    bf.set_defaults(func=_cmd_features_backfill)
    cmp_ = feats.add_parser(
        "compare", help="recompute served feature rows with the offline replay; exit 1 on any mismatch"
    )
    cmp_.add_argument("--served", required=True, help="served records, JSON lines (features dump-served)")
    cmp_.add_argument(
        "--events", required=True, help="event log covering the served as-of times (events dump)"
    )
    cmp_.add_argument(
        "--positions",
        help="where each event sat on the topic (default: EVENTS.positions, which events dump writes): "
        "a row served while the ingest was behind the stream is then reported apart, not as a mismatch",
    )
    repository_arg(cmp_)
    cmp_.add_argument("--users", help="users file (default: the repository's users.source)")
    cmp_.add_argument("--items", help="items file (default: the repository's items.source)")
    cmp_.add_argument("--json", action="store_true")
    cmp_.set_defaults(func=_cmd_features_compare)
    dump = feats.add_parser("dump-served", help="copy the served_features topic to a JSON-lines file")
    dump.add_argument("--out", required=True)
    dump.add_argument("--topic", help="default: RECMESH_SERVED_TOPIC (served_features)")
    dump.add_argument("--timeout", type=float, default=30.0, help="seconds at most (default 30)")
    dump.set_defaults(func=_cmd_features_dump_served)
