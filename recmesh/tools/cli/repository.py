"""`recmesh repository show | check`: the feature repository (recmesh.toml) and a log checked against it."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from recmesh.features.repository import Entity
from recmesh.features.tabular import read_catalog
from recmesh.tools.cli.common import repository, repository_arg


def _cmd_repository_show(args: argparse.Namespace) -> int:
    from recmesh.features.tabular import columns_of

    feature_set = repository(args)
    info = feature_set.describe()
    problems: list[str] = []
    entities: tuple[Entity, ...] = ("user", "item")
    for entity in entities:
        source = feature_set.entity_source(entity)
        if source is None:
            continue
        if not source.exists():
            problems.append(f"{entity}s source {source} does not exist (yet)")
            continue
        have = set(columns_of(source, feature_set.entity_delimiter(entity)))
        offline = feature_set.features_of(entity, "offline")
        want = [feature_set.entity_id_column(entity), *(f.column for f in offline)]
        missing = [c for c in want if c not in have]
        if missing:
            problems.append(f"{source}: no column {', '.join(map(repr, missing))}")
    info["problems"] = problems
    if args.json:
        print(json.dumps(info))
        return 1 if problems else 0
    print(
        f"repository {feature_set.name!r} ({feature_set.path}), feature set {feature_set.version}"
        f"{' [demo]' if feature_set.demo else ''}"
    )
    print(f"  behaviours: {', '.join(feature_set.behaviors)}")
    for f in feature_set.features:
        if f.kind == "realtime":
            window_s = f.window_ms // 1000 if f.window_ms else 0
            what = f"{f.aggregate} over {window_s}s of {'/'.join(sorted(f.behaviors))}"
            what += f" by {f.by}" if f.by else ""
            what += f" of {f.field}" if f.field else ""
            what += f", tiles of {f.slide_ms // 1000}s" if f.slide_ms else ""
        else:
            what = f"offline {f.offline_type} from column {f.column!r}"
        print(f"  {f.entity:<5} {f.name:<24} {f.dtype:<8} {what}")
    for s in feature_set.streams:
        how = {"tiles": f"tiles of {s.slide_ms // 1000}s", "distinct": f"newest {s.scan} distinct ids"}
        kept = f"kept {s.retention_ms // 1000}s, ttl {s.ttl_s}s"
        print(f"  state {s.entity}:s:{s.id}  {how.get(s.read, f'read {s.read}')}, {kept}")
    for src in info["recall_sources"]:
        print(f"  recall {src['source']:<9} {'on ' if src['on'] else 'off'}  {src['why']}")
    for p in problems:
        print(f"  problem: {p}")
    return 1 if problems else 0


def _cmd_repository_check(args: argparse.Namespace) -> int:
    from recmesh.features.check import check_log, errors
    from recmesh.features.eventlog import load_log

    feature_set = repository(args)
    started = time.perf_counter()
    users, items = read_catalog(feature_set, args.users, args.items)
    events = load_log(Path(args.log), feature_set.event_schema)
    found = check_log(feature_set, events, users, items, ranking=True)
    for f in found:
        print(f"{f.level}: {f.text()}", file=sys.stderr)
    bad = errors(found)
    took = time.perf_counter() - started
    if args.json:
        print(json.dumps({"events": len(events), "errors": [f.text() for f in bad],
                          "warnings": [f.text() for f in found if f.level == "warning"]}))  # fmt: skip
    else:
        print(
            f"{args.log}: {len(events):,} events against {feature_set.path} in {took:.1f} s: "
            f"{len(bad)} errors, {len(found) - len(bad)} warnings"
        )
    return 2 if bad else 0


def add_commands(sub: Any) -> None:
    repo = sub.add_parser("repository", help="the feature repository (recmesh.toml)").add_subparsers(
        dest="repository_command", required=True
    )
    show = repo.add_parser(
        "show", help="validate the repository and its catalog files; print what it declares"
    )
    repository_arg(show)
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=_cmd_repository_show)
    check = repo.add_parser(
        "check",
        help="hold the repository against your event log and catalog in seconds: errors that would "
        "fail training (exit 2), warnings for what is valid but probably not meant",
    )
    check.add_argument("log", help="the canonical JSON-lines event log (events import --to log)")
    repository_arg(check)
    check.add_argument("--users", help="users file (default: the repository's users.source)")
    check.add_argument("--items", help="items file (default: the repository's items.source)")
    check.add_argument("--json", action="store_true")
    check.set_defaults(func=_cmd_repository_check)
