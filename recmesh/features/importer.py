"""A team's own event records -> canonical events, mapped by the repository.

`EventMapper` reads the fields `[events]` names (event id, user, item,
behaviour, time), converts the time unit to epoch milliseconds, maps the
team's behaviour names through the aliases, carries the declared numeric
values, derives extra events (`[[events.derive]]`, e.g. a high rating also
counts as a click) and, when the records have no event id, derives a
deterministic one from the record's content, so importing the same file twice
counts every event once. A record that cannot be mapped is a `BadRecord` with
its line number and the reason; `scan` reads a whole file and counts them
before anything is sent.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from recmesh.errors import InvalidArgument
from recmesh.events import Event, validate_event
from recmesh.features.repository import ConstantBehavior, FeatureSet
from recmesh.features.tabular import read_rows

_UNIT_TO_MS = {"s": 1000.0, "ms": 1.0, "us": 0.001, "ns": 0.000001}


@dataclass(frozen=True)
class BadRecord:
    line: int
    reason: str


class EventMapper:
    def __init__(self, feature_set: FeatureSet) -> None:
        self.feature_set = feature_set
        self.decl = feature_set.decl.events
        self.schema = feature_set.event_schema
        self._values = self.decl.value_fields

    def _time_ms(self, raw: Any) -> int:
        unit = self.decl.time_unit
        if raw is None or raw == "":
            raise ValueError(f"no {self.decl.event_time!r}")
        if unit == "iso8601":
            text = str(raw).strip()
            if isinstance(raw, datetime):
                moment = raw
            elif len(text) == 10 and text[4] == "-" and text[7] == "-":  # a date alone: the day, in UTC
                moment = datetime.fromisoformat(text).replace(tzinfo=UTC)
            else:
                moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
            if moment.tzinfo is None:
                raise ValueError(f"{raw!r} has no time zone (add Z or +00:00)")
            return int(moment.timestamp() * 1000)
        if isinstance(raw, datetime):
            return int(raw.timestamp() * 1000)
        value = float(raw)
        if not math.isfinite(value):
            raise ValueError(f"{raw!r} is not a time")
        return round(value * _UNIT_TO_MS[unit])

    def map(self, record: Mapping[str, Any]) -> list[Event]:
        """The canonical events of one record; raises ValueError/InvalidArgument with the reason."""
        d = self.decl
        behavior_raw = (
            d.behavior.value if isinstance(d.behavior, ConstantBehavior) else record.get(d.behavior)
        )
        if behavior_raw is None or str(behavior_raw).strip() == "":
            raise ValueError(f"no {d.behavior!r}")
        values: dict[str, float] = {}
        for name, column in self._values.items():
            raw = record.get(column)
            if raw is None or raw == "":
                continue
            try:
                values[name] = float(raw)
            except (TypeError, ValueError):
                raise ValueError(f"{column!r}: {raw!r} is not a number") from None
        user = _text(record.get(d.user_id), d.user_id)
        item = _text(record.get(d.item_id), d.item_id)
        t = self._time_ms(record.get(d.event_time))
        behavior = str(behavior_raw).strip()
        if d.event_id and record.get(d.event_id) not in (None, ""):
            event_id = str(record[d.event_id]).strip()
        else:
            basis = "\t".join(
                [user, item, behavior, str(t), *(f"{k}={v!r}" for k, v in sorted(values.items()))]
            )
            event_id = "imp-" + hashlib.sha1(basis.encode()).hexdigest()[:20]
        base = {"event_id": event_id, "user_id": user, "item_id": item, "behavior": behavior, "event_time": t}
        out = [validate_event({**base, **values}, self.schema)]
        for rule in d.derive:
            if rule.when.holds(values):
                derived = {**base, "event_id": f"{event_id}:{rule.behavior}", "behavior": rule.behavior}
                out.append(validate_event({**derived, **values}, self.schema))
        return out

    def records(
        self, path: Path, delimiter: str | None = None
    ) -> Iterator[tuple[int, list[Event] | BadRecord]]:
        """(line, events or why not) for every record of a CSV/TSV, JSON-lines or Parquet file."""
        for line, row in read_rows(path, delimiter):
            try:
                yield line, self.map(row)
            except (ValueError, TypeError, InvalidArgument) as err:
                yield line, BadRecord(line, str(err))


def _text(raw: Any, column: str) -> str:
    if raw is None or str(raw).strip() == "":
        raise ValueError(f"no {column!r}")
    value = str(raw).strip()
    return value[:-2] if isinstance(raw, float) and value.endswith(".0") else value


@dataclass
class Scan:
    """What a pass over a file found: records, events they map to, bad records."""

    records: int = 0
    events: int = 0
    bad: int = 0
    first_bad: list[BadRecord] = field(default_factory=list)
    time_range: tuple[int, int] | None = None

    def note(self, item: list[Event] | BadRecord, keep_bad: int = 5) -> None:
        self.records += 1
        if isinstance(item, BadRecord):
            self.bad += 1
            if len(self.first_bad) < keep_bad:
                self.first_bad.append(item)
            return
        self.events += len(item)
        t = item[0].event_time
        lo, hi = self.time_range or (t, t)
        self.time_range = (min(lo, t), max(hi, t))

    def describe_bad(self, path: Path) -> str:
        lines = [f"{path}: {self.bad} of {self.records} records cannot be imported; the first:"]
        lines += [f"  line {b.line}: {b.reason}" for b in self.first_bad]
        return "\n".join(lines)


def scan(mapper: EventMapper, path: Path, delimiter: str | None = None) -> Scan:
    out = Scan()
    for _, item in mapper.records(path, delimiter):
        out.note(item)
    return out


def good_events(mapper: EventMapper, path: Path, delimiter: str | None = None) -> Iterator[Event]:
    for _, item in mapper.records(path, delimiter):
        if not isinstance(item, BadRecord):
            yield from item
