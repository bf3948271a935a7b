"""Event logs on disk: canonical events as JSON lines, one per line, in any order.

`sorted_events` yields them in event-time order (ties by event id) using an
external merge sort (sorted runs of `run_size` events spilled to temporary
files, then merged), so a log larger than memory can be replayed.
`recmesh events import --to log` writes such a log from a team's own records.
"""

from __future__ import annotations

import heapq
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from recmesh.errors import InvalidArgument
from recmesh.events import Event, EventSchema, validate_event


def read_events(path: Path, schema: EventSchema | None) -> Iterator[Event]:
    """Validated events from a JSON-lines file; a bad line is an error naming it."""
    with path.open("rb") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as err:
                raise InvalidArgument(f"{path}:{n}: not JSON: {err}") from None
            try:
                yield validate_event(obj, schema)
            except InvalidArgument as err:
                raise InvalidArgument(f"{path}:{n}: {err}") from None


def _key(e: Event) -> tuple[int, str]:
    return (e.event_time, e.event_id)


def _row(e: Event) -> list[Any]:
    return [e.event_time, e.event_id, e.user_id, e.item_id, e.behavior, e.values]


def _event(row: list[Any]) -> Event:
    t, eid, uid, iid, behavior, values = row
    event = Event.model_construct(event_id=eid, user_id=uid, item_id=iid, behavior=behavior, event_time=t)
    return event.with_values(values) if values else event


def sorted_events(path: Path, schema: EventSchema | None, run_size: int = 200_000) -> Iterator[Event]:
    yield from sort_events(read_events(path, schema), run_size)


def sort_events(events: Iterable[Event], run_size: int = 200_000) -> Iterator[Event]:
    runs: list[IO[bytes]] = []
    batch: list[Event] = []
    try:
        for event in events:
            batch.append(event)
            if len(batch) >= run_size:
                runs.append(_spill(batch))
                batch = []
        if not runs:
            yield from sorted(batch, key=_key)
            return
        if batch:
            runs.append(_spill(batch))
        streams = [(_event(orjson.loads(line)) for line in run) for run in runs]
        yield from heapq.merge(*streams, key=_key)
    finally:
        for run in runs:
            run.close()


def _spill(batch: list[Event]) -> IO[bytes]:
    run = tempfile.TemporaryFile()  # noqa: SIM115 (closed by sort_events once merged)
    for e in sorted(batch, key=_key):
        run.write(orjson.dumps(_row(e)) + b"\n")
    run.seek(0)
    return run


def write_events(path: Path, events: Iterable[Event | dict[str, Any]]) -> int:
    n = 0
    with path.open("wb") as fh:
        for e in events:
            fh.write((e.to_json() if isinstance(e, Event) else orjson.dumps(e)) + b"\n")
            n += 1
    return n
