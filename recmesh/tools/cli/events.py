"""`recmesh events import | send | dump | export-demo`: a team's events in and out."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from recmesh.errors import InvalidArgument, RecmeshError
from recmesh.tools.catalog import progress_bar
from recmesh.tools.cli.common import print_figures, repository, repository_arg, say_for


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
    say = say_for(args)
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


def add_commands(sub: Any) -> None:
    events = sub.add_parser("events", help="bring events in, send, dump").add_subparsers(
        dest="events_command", required=True
    )
    imp = events.add_parser(
        "import", help="a file of your events (CSV, TSV, JSON lines, Parquet), mapped by the repository"
    )
    imp.add_argument("file")
    repository_arg(imp)
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
    repository_arg(send)
    send.set_defaults(func=_cmd_events_send)
    edump = events.add_parser(
        "dump", help="copy the events topic to a JSON-lines event log (for features compare / backfill)"
    )
    edump.add_argument("--out", required=True)
    edump.add_argument("--topic", help="default: RECMESH_EVENTS_TOPIC (user_behavior)")
    edump.add_argument("--timeout", type=float, default=30.0, help="seconds at most (default 30)")
    repository_arg(edump)
    edump.set_defaults(func=_cmd_events_dump)
    export = events.add_parser("export-demo", help="write a demo event log as JSON lines")
    export.add_argument("out")
    export.add_argument("--sessions", type=int, default=2000)
    export.add_argument("--hours", type=float, default=2.0)
    export.add_argument("--start", type=int, help="epoch ms of the first event")
    export.add_argument("--seed", type=int, default=11)
    export.set_defaults(func=_cmd_events_export_demo)
