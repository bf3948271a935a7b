"""`recmesh repository | catalog | events | features ...`: a team's data in and out.

Every command reads the feature repository (RECMESH_REPOSITORY, or
--repository; the demo's when neither is given) and maps the team's files by
it: no command knows a feature by name.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from recmesh.errors import FailedPrecondition, InvalidArgument, NotFound, RecmeshError
from recmesh.features.repository import Entity, FeatureSet
from recmesh.features.tabular import read_catalog
from recmesh.tools.catalog import load_catalog_files, progress_bar
from recmesh.tools.cli.common import print_figures


def _say(args: argparse.Namespace) -> Callable[[str], None]:
    """Progress to stderr when the figures go to stdout as JSON."""
    if getattr(args, "json", False):
        return lambda m: print(m, file=sys.stderr, flush=True)
    return lambda m: print(m, flush=True)


def repository(args: argparse.Namespace) -> FeatureSet:
    from recmesh.features.repository import configured_feature_set, load_feature_set
    from recmesh.settings import CommonSettings

    if getattr(args, "repository", None):
        return load_feature_set(Path(args.repository))
    return configured_feature_set(CommonSettings().repository)


# --- repository --------------------------------------------------------------------


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
        else:
            what = f"offline {f.offline_type} from column {f.column!r}"
        print(f"  {f.entity:<5} {f.name:<24} {f.dtype:<8} {what}")
    for s in feature_set.streams:
        print(f"  state {s.entity}:s:{s.id}  read {s.read}, kept {s.retention_ms // 1000}s, ttl {s.ttl_s}s")
    for src in info["recall_sources"]:
        print(f"  recall {src['source']:<9} {'on ' if src['on'] else 'off'}  {src['why']}")
    for p in problems:
        print(f"  problem: {p}")
    return 1 if problems else 0


def _cmd_repository_check(args: argparse.Namespace) -> int:
    from recmesh.features.check import check_log, errors
    from recmesh.features.eventlog import sorted_events

    feature_set = repository(args)
    started = time.perf_counter()
    users, items = read_catalog(feature_set, args.users, args.items)
    events = list(sorted_events(Path(args.log), feature_set.event_schema))
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


# --- catalog -----------------------------------------------------------------------


def _refuse_demo(feature_set: FeatureSet, args: argparse.Namespace, what: str) -> None:
    if feature_set.demo and not args.demo:
        raise FailedPrecondition(
            f"{feature_set.path} is the demo repository: {what} loads the demo catalog only with --demo "
            "(set RECMESH_REPOSITORY to your recmesh.toml to load yours)"
        )


def _cmd_catalog_load(args: argparse.Namespace) -> int:
    from recmesh.settings import FeatureSettings

    feature_set = repository(args)
    _refuse_demo(feature_set, args, "catalog load")
    say = _say(args)
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


# --- events ------------------------------------------------------------------------


async def _send(
    bootstrap: str, topic: str, events: Iterator[Any], rate: float, speed: float | None,
    origin_ms: int, shift_ms: int, progress: Callable[[int], None],
) -> int:  # fmt: skip
    """Produce events in order: at `rate` events/s, or paced at `speed` x real time
    (each stamped with its send time), acks=all; waits for every acknowledgement."""
    from recmesh.producer import make_producer
    from recmesh.telemetry import kafka_trace_headers

    producer = make_producer(bootstrap)
    await producer.start()
    sent = 0
    started_wall = time.time()
    started = time.monotonic()
    try:
        headers = kafka_trace_headers()
        pending = []
        for original in events:
            if speed is not None:
                due = (original.event_time - origin_ms) / speed / 1000
                wait = due - (time.monotonic() - started)
                if wait > 0:
                    await asyncio.sleep(wait)
                event = original.model_copy(update={"event_time": int(started_wall * 1000 + due * 1000)})
            else:
                event = original
                if shift_ms:
                    event = original.model_copy(update={"event_time": original.event_time + shift_ms})
                ahead = sent / rate - (time.monotonic() - started)
                if ahead > 0.005:
                    await asyncio.sleep(ahead)
            value, key = event.to_json(), event.user_id.encode()
            pending.append(await producer.send(topic, value=value, key=key, headers=headers))
            sent += 1
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending.clear()
                progress(sent)
        await asyncio.gather(*pending)
        progress(sent)
    finally:
        await producer.stop()
    return sent


def _cmd_events_import(args: argparse.Namespace) -> int:
    from recmesh.features.eventlog import sort_events
    from recmesh.features.importer import EventMapper, good_events, scan
    from recmesh.settings import KafkaSettings

    feature_set = repository(args)
    say = _say(args)
    path = Path(args.file)
    if not path.exists():
        raise InvalidArgument(f"{path}: no such file")
    if args.to == "log" and not args.out:
        raise InvalidArgument("--to log needs --out LOG")
    if args.speed is not None and args.speed <= 0:
        raise InvalidArgument("--speed must be above 0")
    mapper = EventMapper(feature_set)
    started = time.perf_counter()
    say(f"checking {path} against {feature_set.path} ...")
    found = scan(mapper, path, args.delimiter)
    if found.bad:
        report = found.describe_bad(path)
        if not args.skip_bad:
            print(report + "\nnothing was imported; fix the records or pass --skip-bad to leave them out",
                  file=sys.stderr)  # fmt: skip
            return 2
        say(report + f"\nleaving {found.bad} bad records out (--skip-bad)")
    if found.time_range is None:
        raise InvalidArgument(f"{path}: no events in it")
    lo, hi = found.time_range
    shift = int(time.time() * 1000) - hi if args.shift_to_now and args.speed is None else 0
    bar = progress_bar(say, "events", found.events)
    if args.to == "log":
        from recmesh.features.eventlog import write_events

        events = good_events(mapper, path, args.delimiter)
        if shift:
            events = (e.model_copy(update={"event_time": e.event_time + shift}) for e in events)
        n = write_events(Path(args.out), events)
        bar(n)
        where = args.out
    else:
        kafka = KafkaSettings()
        topic = args.topic or kafka.events_topic
        ordered = sort_events(good_events(mapper, path, args.delimiter))
        n = asyncio.run(_send(kafka.kafka_bootstrap, topic, ordered, args.rate, args.speed, lo, shift, bar))
        where = f"topic {topic}"
    seconds = time.perf_counter() - started
    figures = {
        "records": found.records, "events": n, "bad_records": found.bad, "seconds": round(seconds, 2),
        "events_per_s": round(n / seconds) if seconds else None, "to": where,
        "time_range_ms": [lo + shift, hi + shift] if args.speed is None else None,
    }  # fmt: skip
    text = (f"imported {n:,} events from {found.records:,} records to {where} in {seconds:.1f} s "
            f"({figures['events_per_s']:,} events/s); {found.bad} bad records left out")  # fmt: skip
    print_figures(figures, args.json, text)
    return 0


def _cmd_events_send(args: argparse.Namespace) -> int:
    from recmesh.events import parse_event
    from recmesh.producer import produce_events
    from recmesh.settings import KafkaSettings

    feature_set = repository(args)
    if args.file:
        events = []
        for n, line in enumerate(Path(args.file).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                events.append(parse_event(line.encode(), feature_set.event_schema))
            except InvalidArgument as err:  # all or nothing: say where, send none
                raise InvalidArgument(f"{args.file} line {n}: {err}; nothing was sent") from None
    else:
        from recmesh.tools.demo.live import demo_events

        if not feature_set.demo:
            raise InvalidArgument("--demo events are the demo repository's; give --file (or events import)")
        events = demo_events(args.demo, seed=args.seed)
    kafka = KafkaSettings()
    asyncio.run(produce_events(kafka.kafka_bootstrap, kafka.events_topic, events))
    print(f"sent {len(events)} events to {kafka.events_topic}")
    return 0


def _cmd_events_dump(args: argparse.Namespace) -> int:
    from recmesh.events import parse_event
    from recmesh.features.served import dump_topic, positions_path
    from recmesh.settings import KafkaSettings

    schema = repository(args).event_schema

    def is_event(raw: bytes) -> bool:
        try:
            parse_event(raw, schema)
        except RecmeshError:
            return False
        return True

    kafka = KafkaSettings()
    topic = args.topic or kafka.events_topic
    out = Path(args.out)
    places = positions_path(out)
    dump = asyncio.run(dump_topic(kafka.kafka_bootstrap, topic, out, args.timeout, is_event, places))
    skipped = f"; left out {dump.skipped} malformed (the ingest dead-lettered them)" if dump.skipped else ""
    print(
        f"wrote {dump.written} events from {topic} to {args.out}{skipped}; their topic positions to {places}"
    )
    return 0


def _cmd_events_export_demo(args: argparse.Namespace) -> int:
    from recmesh.features.eventlog import write_events
    from recmesh.tools.demo.generate import generate_events, make_catalog

    start = args.start or 1_767_225_600_000
    events = generate_events(make_catalog(), start, int(args.hours * 3_600_000), args.sessions, args.seed)
    print(f"wrote {write_events(Path(args.out), events)} events to {args.out}")
    return 0


# --- features ------------------------------------------------------------------------


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
    say = _say(args)
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


def _repo_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repository", help="the repository file (default: RECMESH_REPOSITORY, else the demo's)")


def add_commands(sub: Any) -> None:
    _add_repository(sub)
    _add_catalog(sub)
    _add_events(sub)
    _add_features(sub)
    _add_demo(sub)


def _add_repository(sub: Any) -> None:
    repo = sub.add_parser("repository", help="the feature repository (recmesh.toml)").add_subparsers(
        dest="repository_command", required=True
    )
    show = repo.add_parser(
        "show", help="validate the repository and its catalog files; print what it declares"
    )
    _repo_arg(show)
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=_cmd_repository_show)
    check = repo.add_parser(
        "check",
        help="hold the repository against your event log and catalog in seconds: errors that would "
        "fail training (exit 2), warnings for what is valid but probably not meant",
    )
    check.add_argument("log", help="the canonical JSON-lines event log (events import --to log)")
    _repo_arg(check)
    check.add_argument("--users", help="users file (default: the repository's users.source)")
    check.add_argument("--items", help="items file (default: the repository's items.source)")
    check.add_argument("--json", action="store_true")
    check.set_defaults(func=_cmd_repository_check)


def _add_catalog(sub: Any) -> None:
    cat = sub.add_parser("catalog", help="users' and items' offline features").add_subparsers(
        dest="catalog_command", required=True
    )
    load = cat.add_parser("load", help="load users and items into Redis (CSV, TSV, Parquet or JSON lines)")
    _repo_arg(load)
    load.add_argument("--users", help="users file (default: the repository's users.source)")
    load.add_argument("--items", help="items file (default: the repository's items.source)")
    load.add_argument("--demo", action="store_true", help="allow loading the demo repository's catalog")
    load.add_argument("--json", action="store_true")
    load.set_defaults(func=_cmd_catalog_load)


def _add_events(sub: Any) -> None:
    events = sub.add_parser("events", help="bring events in, send, dump").add_subparsers(
        dest="events_command", required=True
    )
    imp = events.add_parser(
        "import", help="a file of your events (CSV, TSV, JSON lines, Parquet), mapped by the repository"
    )
    imp.add_argument("file")
    _repo_arg(imp)
    imp.add_argument("--to", choices=("topic", "log"), default="topic",
                     help="produce to the events topic (default) or write a canonical event log")  # fmt: skip
    imp.add_argument("--out", help="with --to log: the JSON-lines event log to write")
    imp.add_argument("--topic", help="default: RECMESH_EVENTS_TOPIC (user_behavior)")
    imp.add_argument("--rate", type=float, default=20_000.0, help="events/s produced (default %(default)s)")
    imp.add_argument(
        "--shift-to-now", action="store_true",
        help="move the events in time so the last one is now (a historical log as live)",
    )  # fmt: skip
    imp.add_argument(
        "--speed",
        type=float,
        help="replay paced at N x real time, each event stamped when sent (a live stream)",
    )
    imp.add_argument(
        "--skip-bad", action="store_true", help="leave bad records out instead of importing nothing"
    )
    imp.add_argument("--delimiter", help="CSV delimiter (default: ',' or tab, from the header)")
    imp.add_argument("--json", action="store_true")
    imp.set_defaults(func=_cmd_events_import)
    send = events.add_parser("send", help="send demo events, or canonical events from a JSON-lines file")
    send.add_argument(
        "--demo", type=int, default=1000, help="number of demo events (default 1000; ignored with --file)"
    )
    send.add_argument("--file", help="JSON lines, one canonical event per line")
    send.add_argument("--seed", type=int, default=1)
    _repo_arg(send)
    send.set_defaults(func=_cmd_events_send)
    edump = events.add_parser(
        "dump", help="copy the events topic to a JSON-lines event log (for features compare / backfill)"
    )
    edump.add_argument("--out", required=True)
    edump.add_argument("--topic", help="default: RECMESH_EVENTS_TOPIC (user_behavior)")
    edump.add_argument("--timeout", type=float, default=30.0, help="seconds at most (default 30)")
    _repo_arg(edump)
    edump.set_defaults(func=_cmd_events_dump)
    export = events.add_parser("export-demo", help="write a demo event log as JSON lines")
    export.add_argument("out")
    export.add_argument("--sessions", type=int, default=2000)
    export.add_argument("--hours", type=float, default=2.0)
    export.add_argument("--start", type=int, help="epoch ms of the first event")
    export.add_argument("--seed", type=int, default=11)
    export.set_defaults(func=_cmd_events_export_demo)


def _add_features(sub: Any) -> None:
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
    _repo_arg(bf)
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
    _repo_arg(cmp_)
    cmp_.add_argument("--users", help="users file (default: the repository's users.source)")
    cmp_.add_argument("--items", help="items file (default: the repository's items.source)")
    cmp_.add_argument("--json", action="store_true")
    cmp_.set_defaults(func=_cmd_features_compare)
    dump = feats.add_parser("dump-served", help="copy the served_features topic to a JSON-lines file")
    dump.add_argument("--out", required=True)
    dump.add_argument("--topic", help="default: RECMESH_SERVED_TOPIC (served_features)")
    dump.add_argument("--timeout", type=float, default=30.0, help="seconds at most (default 30)")
    dump.set_defaults(func=_cmd_features_dump_served)


def _add_demo(sub: Any) -> None:
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
