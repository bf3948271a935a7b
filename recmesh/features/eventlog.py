"""Event logs on disk: JSON lines, one event per line, in any order.

`sorted_events` yields them in event-time order using an external merge sort
(sorted runs of `run_size` events spilled to temporary files, then merged), so
a log larger than memory can be replayed.
"""

from __future__ import annotations

import heapq
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from recmesh.errors import InvalidArgument
from recmesh.events import parse_event


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """Validated events from a JSON-lines file; a bad line is an error naming it."""
    with path.open("rb") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield parse_event(line).model_dump()
            except InvalidArgument as err:
                raise InvalidArgument(f"{path}:{n}: {err}") from None


def _key(e: dict[str, Any]) -> tuple[int, str]:
    return (int(e["event_time"]), str(e["event_id"]))


def sorted_events(path: Path, run_size: int = 200_000) -> Iterator[dict[str, Any]]:
    runs: list[IO[bytes]] = []
    batch: list[dict[str, Any]] = []
    try:
        for event in read_events(path):
            batch.append(event)
            if len(batch) >= run_size:
                runs.append(_spill(batch))
                batch = []
        if not runs:
            yield from sorted(batch, key=_key)
            return
        if batch:
            runs.append(_spill(batch))
        streams = [(orjson.loads(line) for line in run) for run in runs]
        yield from heapq.merge(*streams, key=_key)
    finally:
        for run in runs:
            run.close()


def _spill(batch: list[dict[str, Any]]) -> IO[bytes]:
    run = tempfile.TemporaryFile()  # noqa: SIM115 (closed by sorted_events once merged)
    for e in sorted(batch, key=_key):
        run.write(orjson.dumps(e) + b"\n")
    run.seek(0)
    return run


def write_events(path: Path, events: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> int:
    n = 0
    with path.open("wb") as fh:
        for e in events:
            fh.write(orjson.dumps(e) + b"\n")
            n += 1
    return n
