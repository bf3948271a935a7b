"""Served-feature records and their offline check.

The feature service logs a sample of the feature vectors it actually served
(design notes' checklist: without them online/offline gaps cannot be
investigated) as JSON records on the `served_features` topic:

    {"request_id", "trace_id", "served_at_ms", "as_of_ms", "feature_version",
     "degraded": [...], "user_id", "user": {name: [value, source, age_ms]},
     "item_ids": [...], "items": {name: {"values": [...], "sources": [...], "ages": [...]}},
     "applied": {"before": {partition: [next offset, newest event time]}, "after": {...}}}

Items are column-wise, as they are served. `applied` is how far the ingest had
applied the events topic (keys.applied), read just before and just after the
look-up. `compare` recomputes every logged row with the offline replay
(backfill.ReplayState: the same window code the training rows come from) at
the row's own as-of time and counts, per feature, the values that differ.

A row served while the ingest was behind the topic holds fewer events than
the log has before its as-of time. Given where each event sits on the topic
(`recmesh events dump` writes it beside the log: `positions_path`), a value
that differs is recomputed from the events the store had applied: those
before the row's `before` offsets, or its `after` ones; a match with either,
or an event of the entity applied between the two reads, is reported as
*behind the stream*, apart from the mismatches, which then mean a wrong value.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from recmesh.credentials import kafka_options
from recmesh.errors import DeadlineExceeded, NotFound
from recmesh.events import Event
from recmesh.features.backfill import ReplayState, offline_values
from recmesh.features.repository import Entity, FeatureSet, FeatureValue
from recmesh.features.wire import Column
from recmesh.topics import topic_partitions

Values = Mapping[str, tuple[FeatureValue, str, int]]
# keys.applied read before and after a look-up: {partition: (next offset, newest event time)}.
Marks = Mapping[int, tuple[int, int]]
Applied = tuple[Marks, Marks]
# Where an event sits on the topic, by (user id, event id): (partition, offset).
Positions = Mapping[tuple[str, str], tuple[int, int]]


def positions_path(log: Path) -> Path:
    """The positions file `recmesh events dump` writes beside an event log."""
    return log.with_name(log.name + ".positions")


def read_positions(path: Path) -> dict[tuple[str, str], tuple[int, int]]:
    """(user id, event id) -> (partition, offset), the first one written for a pair."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    with path.open("rb") as fh:
        for line in fh:
            if line.strip():
                p = orjson.loads(line)
                out.setdefault(
                    (str(p["user_id"]), str(p["event_id"])), (int(p["partition"]), int(p["offset"]))
                )
    return out


def _marks_json(marks: Marks) -> dict[str, list[int]]:
    return {str(p): [offset, newest] for p, (offset, newest) in sorted(marks.items())}


def _marks_of(raw: Mapping[str, Sequence[int]]) -> dict[int, tuple[int, int]]:
    return {int(p): (int(v[0]), int(v[1])) for p, v in raw.items()}


def served_record(
    *,
    feature_version: str,
    request_id: str,
    trace_id: str,
    as_of_ms: int,
    user_id: str,
    user: Values,
    item_ids: Sequence[str],
    item_columns: Mapping[str, Column],
    degraded: Sequence[str],
    served_at_ms: int | None = None,
    applied: Applied | None = None,
) -> dict[str, Any]:
    record = {
        "request_id": request_id,
        "trace_id": trace_id,
        "served_at_ms": int(time.time() * 1000) if served_at_ms is None else served_at_ms,
        "as_of_ms": as_of_ms,
        "feature_version": feature_version,
        "degraded": list(degraded),
        "user_id": user_id,
        "user": {name: list(v) for name, v in user.items()},
        "item_ids": list(item_ids),
        "items": {
            name: {"values": c.values, "sources": c.sources, "ages": c.ages}
            for name, c in item_columns.items()
        },
    }
    if applied is not None:
        record["applied"] = {"before": _marks_json(applied[0]), "after": _marks_json(applied[1])}
    return record


def read_served(path: Path) -> list[dict[str, Any]]:
    """Served records from a JSON-lines file (`recmesh features dump-served`)."""
    with path.open("rb") as fh:
        return [orjson.loads(line) for line in fh if line.strip()]


@dataclass
class FeatureTally:
    compared: int = 0
    mismatched: int = 0
    behind: int = 0  # differs, but served while the store was behind the stream (module docstring)
    age_mismatched: int = 0  # real-time values that agree but whose age differs
    examples: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class CompareReport:
    rows: int = 0
    skipped_version: int = 0  # logged under another feature-set version: not recomputable here
    skipped_degraded: int = 0  # served from a fallback: real-time values were defaults on purpose
    rows_behind: int = 0  # rows with a value explained by the store being behind the stream
    without_marks: int = 0  # rows with no `applied` (an older service, or the read timed out)
    positions: bool = False  # whether the events' topic positions were given
    features: dict[str, FeatureTally] = field(default_factory=lambda: defaultdict(FeatureTally))

    @property
    def mismatches(self) -> int:
        return sum(t.mismatched for t in self.features.values())

    @property
    def behind(self) -> int:
        return sum(t.behind for t in self.features.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "skipped_version": self.skipped_version,
            "skipped_degraded": self.skipped_degraded,
            "rows_behind": self.rows_behind,
            "rows_without_marks": self.without_marks,
            "positions": self.positions,
            "mismatches": self.mismatches,
            "behind": self.behind,
            "features": {
                name: {"compared": t.compared, "mismatched": t.mismatched, "behind": t.behind,
                       "age_mismatched": t.age_mismatched, "examples": t.examples}
                for name, t in sorted(self.features.items())
            },
        }  # fmt: skip


MAX_EXAMPLES = 5


class _Lag:
    """Whether a value that differs was served while the store was behind the
    stream: the events of one entity up to a row's as-of time, replayed as far
    as the ingest had applied them (module docstring)."""

    def __init__(
        self,
        feature_set: FeatureSet,
        users: Mapping[str, Mapping[str, Any]],
        items: Mapping[str, Mapping[str, Any]],
        positions: Positions,
    ) -> None:
        self._feature_set, self._users, self._items, self._positions = feature_set, users, items, positions
        self._events: dict[tuple[Entity, str], list[Event]] = defaultdict(list)
        self._at: dict[tuple[Entity, str, int], Any] = {}

    def saw(self, event: Event) -> None:
        """An event of the log at or before the current row's as-of time."""
        self._events["user", event.user_id].append(event)
        self._events["item", event.item_id].append(event)

    def _applied(self, event: Event, marks: Marks) -> bool:
        at = self._positions.get((event.user_id, event.event_id))
        if at is None:
            return True  # not on the topic the positions came from: counted as applied
        mark = marks.get(at[0])
        return mark is not None and at[1] < mark[0]

    def _replayed(self, entity: Entity, entity_id: str, as_of: int, marks: Marks) -> Any:
        key = (entity, entity_id, id(marks))
        if key not in self._at:
            state = ReplayState(self._feature_set, self._users, self._items)
            for event in self._events[entity, entity_id]:
                if self._applied(event, marks):
                    state.apply(event)
            self._at[key] = state.features(entity, entity_id, as_of)
        return self._at[key]

    def explains(
        self, entity: Entity, entity_id: str, as_of: int, name: str, served: Any, applied: Applied
    ) -> bool:
        before, after = applied
        for marks in (before, after):
            want = self._replayed(entity, entity_id, as_of, marks).get(name)
            if want is not None and want[0] == served:
                return True
        # An event of this entity applied between the two reads: the look-up may
        # have seen any part of it (one Redis script per key), so it cannot tell.
        return any(
            not self._applied(e, before) and self._applied(e, after) for e in self._events[entity, entity_id]
        )

    def next_row(self) -> None:
        self._at.clear()


@dataclass
class _RowCheck:
    """One served row's values against the replay's, tallied into `report`."""

    report: CompareReport
    lag: _Lag | None
    applied: Applied | None
    as_of: int
    request_id: Any
    behind: bool = False  # a value of the row was explained by the store being behind

    def check(
        self,
        entity: Entity,
        entity_id: str,
        name: str,
        served_value: tuple[Any, str, int],
        want: FeatureValue,
        want_age: int | None,  # None: an offline value
    ) -> None:
        tally = self.report.features[name]
        tally.compared += 1
        value, _, age = served_value
        if value == want:
            if want_age is not None and age != want_age:
                tally.age_mismatched += 1
            return
        if (
            self.lag is not None
            and self.applied is not None
            and want_age is not None  # real-time: offline values do not follow the stream
            and self.lag.explains(entity, entity_id, self.as_of, name, value, self.applied)
        ):
            tally.behind += 1
            self.behind = True
            return
        tally.mismatched += 1
        if len(tally.examples) < MAX_EXAMPLES:
            where = {"request_id": self.request_id, "as_of_ms": self.as_of, f"{entity}_id": entity_id}
            tally.examples.append({**where, "served": value, "replay": want})

    def check_user(
        self,
        feature_set: FeatureSet,
        state: ReplayState,
        users: Mapping[str, Mapping[str, Any]],
        row: Mapping[str, Any],
        degraded: bool,
    ) -> None:
        """The row's user values (real-time ones only when the row is not degraded)."""
        check = self.check
        user_id = str(row["user_id"])
        want_user = state.features("user", user_id, self.as_of)
        want_user_off = offline_values(feature_set, "user", users.get(user_id))
        for name, served_value in row["user"].items():
            if name in want_user:
                if not degraded:
                    want, want_age = want_user[name]
                    check("user", user_id, name, tuple(served_value), want, want_age)
            elif name in want_user_off:
                check("user", user_id, name, tuple(served_value), want_user_off[name], None)

    def check_items(
        self,
        feature_set: FeatureSet,
        state: ReplayState,
        items: Mapping[str, Mapping[str, Any]],
        row: Mapping[str, Any],
        degraded: bool,
    ) -> None:
        """The row's item columns, item by item (real-time ones only when the row is not degraded)."""
        check = self.check
        as_of = self.as_of
        columns = row["items"]
        for i, item_id in enumerate(row["item_ids"]):
            want_rt = state.features("item", item_id, as_of)
            want_off = offline_values(feature_set, "item", items.get(item_id))
            for name, col in columns.items():
                served_value = (col["values"][i], col["sources"][i], col["ages"][i])
                if name in want_rt:
                    if not degraded:
                        want, want_age = want_rt[name]
                        check("item", item_id, name, served_value, want, want_age)
                elif name in want_off:
                    check("item", item_id, name, served_value, want_off[name], None)


def compare(
    feature_set: FeatureSet,
    served: Iterable[Mapping[str, Any]],
    events: Iterable[Event],
    users: Mapping[str, Mapping[str, Any]],
    items: Mapping[str, Mapping[str, Any]],
    positions: Positions | None = None,
) -> CompareReport:
    """Recompute each served row with the offline replay and tally differences per feature.

    `events` must be sorted by event time (eventlog.sorted_events); the served
    rows are held in memory (a sample) and visited in as-of order, applying
    events up to each row's as-of time, so memory stays bounded by the state
    retention as in the backfill. With `positions` (where each event sits on
    the topic) a value that differs in a row carrying the ingest's applied
    marks is checked against what the store had applied (module docstring);
    the events seen so far are then held too.
    """
    report = CompareReport(positions=positions is not None)
    state = ReplayState(feature_set, users, items)
    lag = _Lag(feature_set, users, items, positions) if positions is not None else None
    pending: Iterator[Event] = iter(events)
    next_event: Event | None = next(pending, None)
    for row in sorted(served, key=lambda r: int(r["as_of_ms"])):
        report.rows += 1
        if row.get("feature_version") != feature_set.version:
            report.skipped_version += 1
            continue
        as_of = int(row["as_of_ms"])
        while next_event is not None and next_event.event_time <= as_of:
            state.apply(next_event)
            if lag is not None:
                lag.saw(next_event)
            next_event = next(pending, None)
        degraded = bool(row.get("degraded"))
        report.skipped_degraded += degraded
        marks = row.get("applied")
        report.without_marks += marks is None
        applied = None if marks is None else (_marks_of(marks["before"]), _marks_of(marks["after"]))
        if lag is not None:
            lag.next_row()
        row_check = _RowCheck(report, lag, applied, as_of, row.get("request_id"))
        row_check.check_user(feature_set, state, users, row, degraded)
        row_check.check_items(feature_set, state, items, row, degraded)
        report.rows_behind += row_check.behind
    return report


def format_report(report: CompareReport) -> str:
    lines = [
        f"served rows {report.rows}  (skipped: {report.skipped_version} other feature-set version, "
        f"{report.skipped_degraded} degraded: real-time features not compared)",
        f"{'feature':<22}{'compared':>10}{'mismatched':>12}{'behind':>9}{'age differs':>13}",
    ]
    for name, t in sorted(report.features.items()):
        lines.append(f"{name:<22}{t.compared:>10}{t.mismatched:>12}{t.behind:>9}{t.age_mismatched:>13}")
    if report.behind:
        lines.append(
            f"behind the stream: {report.behind} values in {report.rows_behind} rows were served before the "
            "ingest had applied every event up to their as-of time (the rows' applied offsets say so): "
            "not mismatches"
        )
    elif not report.positions:
        lines.append(
            "no event positions (the log was not written by `recmesh events dump`): a row served while "
            "the ingest was behind the stream shows as a mismatch"
        )
    if report.without_marks:
        lines.append(f"{report.without_marks} rows carry no applied offsets (an older feature service)")
    verdict = "no mismatch" if report.mismatches == 0 else f"{report.mismatches} mismatched values"
    lines.append(verdict)
    for name, t in sorted(report.features.items()):
        for ex in t.examples:
            lines.append(f"  {name}: {orjson.dumps(ex).decode()}")
    return "\n".join(lines)


# A topic dump ends after this many empty polls of this length past the ends.
QUIET_POLLS, QUIET_POLL_MS = 2, 500


@dataclass
class Dump:
    written: int = 0
    skipped: int = 0  # records `keep` refused


async def dump_topic(
    bootstrap: str,
    topic: str,
    out: Path,
    timeout_s: float = 30.0,
    keep: Callable[[bytes], bool] | None = None,
    positions: Path | None = None,
) -> Dump:
    """Copy every record on `topic` (that `keep` accepts) into `out` as JSON lines;
    with `positions`, each one's place on the topic there too (`read_positions`:
    user id, event id, partition, offset), for `compare`.

    Reads without a consumer group (nothing committed, nothing rebalanced)
    from the beginning until the partitions have been quiet for QUIET_POLLS
    polls past their end offsets (read again when quiet, in case the topic
    grew). The end offsets alone are not trusted as the stop: the embedded
    Tansu broker reports ends short of its last batches (3,000 demo events
    read back as 2,827-2,878 when the dump stopped there). NotFound when the
    topic does not exist; DeadlineExceeded after `timeout_s`, with what was
    read so far left in `out`.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition

    partitions = [TopicPartition(topic, p) for p in await topic_partitions(bootstrap, topic)]
    if not partitions:
        raise NotFound(f"topic {topic!r} does not exist on {bootstrap}")
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, **kafka_options()
    )
    await consumer.start()
    dump = Dump()
    try:
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        deadline = time.monotonic() + timeout_s
        quiet = 0
        with out.open("wb") as fh, contextlib.ExitStack() as stack:
            places = stack.enter_context(positions.open("wb")) if positions is not None else None
            while quiet < QUIET_POLLS:
                if time.monotonic() > deadline:
                    raise DeadlineExceeded(
                        f"{topic}: still reading after {timeout_s} s ({dump.written} records in {out} so far)"
                    )
                batch = await consumer.getmany(timeout_ms=QUIET_POLL_MS)
                for records in batch.values():
                    for rec in records:
                        if not rec.value:
                            continue
                        if keep is not None and not keep(rec.value):
                            dump.skipped += 1
                            continue
                        fh.write(rec.value.rstrip(b"\n") + b"\n")
                        dump.written += 1
                        if places is not None:
                            obj = orjson.loads(rec.value)
                            places.write(orjson.dumps({
                                "user_id": obj.get("user_id"), "event_id": obj.get("event_id"),
                                "partition": rec.partition, "offset": rec.offset,
                            }) + b"\n")  # fmt: skip
                reached = {tp: await consumer.position(tp) for tp in partitions}
                if batch or any(reached[tp] < ends[tp] for tp in partitions):
                    quiet = 0
                    continue
                quiet += 1
                ends = await consumer.end_offsets(partitions)  # grown meanwhile? then go on
    finally:
        await consumer.stop()
    return dump
