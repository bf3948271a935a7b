"""Served-feature records and their offline check.

The feature service logs a sample of the feature vectors it actually served
(design notes' checklist: without them online/offline gaps cannot be
investigated) as JSON records on the `served_features` topic:

    {"request_id", "trace_id", "served_at_ms", "as_of_ms", "feature_version",
     "degraded": [...], "user_id", "user": {name: [value, source, age_ms]},
     "item_ids": [...], "items": {name: {"values": [...], "sources": [...], "ages": [...]}}}

Items are column-wise, as they are served. `compare` recomputes every logged
row with the offline replay (backfill.ReplayState: the same window code the
training rows come from) at the row's own as-of time and counts, per feature,
the values that differ.
"""

from __future__ import annotations

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
from recmesh.features.repository import FeatureSet, FeatureValue
from recmesh.features.wire import Column
from recmesh.topics import topic_partitions

Values = Mapping[str, tuple[FeatureValue, str, int]]


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
) -> dict[str, Any]:
    return {
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


def read_served(path: Path) -> list[dict[str, Any]]:
    """Served records from a JSON-lines file (`recmesh features dump-served`)."""
    with path.open("rb") as fh:
        return [orjson.loads(line) for line in fh if line.strip()]


@dataclass
class FeatureTally:
    compared: int = 0
    mismatched: int = 0
    age_mismatched: int = 0  # real-time values that agree but whose age differs
    examples: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class CompareReport:
    rows: int = 0
    skipped_version: int = 0  # logged under another feature-set version: not recomputable here
    skipped_degraded: int = 0  # served from a fallback: real-time values were defaults on purpose
    features: dict[str, FeatureTally] = field(default_factory=lambda: defaultdict(FeatureTally))

    @property
    def mismatches(self) -> int:
        return sum(t.mismatched for t in self.features.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "skipped_version": self.skipped_version,
            "skipped_degraded": self.skipped_degraded,
            "mismatches": self.mismatches,
            "features": {
                name: {"compared": t.compared, "mismatched": t.mismatched,
                       "age_mismatched": t.age_mismatched, "examples": t.examples}
                for name, t in sorted(self.features.items())
            },
        }  # fmt: skip


MAX_EXAMPLES = 5


def _check(
    report: CompareReport,
    name: str,
    served: tuple[Any, str, int],
    want: FeatureValue,
    want_age: int | None,
    where: dict[str, Any],
) -> None:
    tally = report.features[name]
    tally.compared += 1
    value, _, age = served
    if value != want:
        tally.mismatched += 1
        if len(tally.examples) < MAX_EXAMPLES:
            tally.examples.append({**where, "served": value, "replay": want})
    elif want_age is not None and age != want_age:
        tally.age_mismatched += 1


def compare(
    fs: FeatureSet,
    served: Iterable[Mapping[str, Any]],
    events: Iterable[Event],
    users: Mapping[str, Mapping[str, Any]],
    items: Mapping[str, Mapping[str, Any]],
) -> CompareReport:
    """Recompute each served row with the offline replay and tally differences per feature.

    `events` must be sorted by event time (eventlog.sorted_events); the served
    rows are held in memory (a sample) and visited in as-of order, applying
    events up to each row's as-of time, so memory stays bounded by the state
    retention as in the backfill.
    """
    report = CompareReport()
    state = ReplayState(fs, users, items)
    pending: Iterator[Event] = iter(events)
    next_event: Event | None = next(pending, None)
    for row in sorted(served, key=lambda r: int(r["as_of_ms"])):
        report.rows += 1
        if row.get("feature_version") != fs.version:
            report.skipped_version += 1
            continue
        as_of = int(row["as_of_ms"])
        while next_event is not None and next_event.event_time <= as_of:
            state.apply(next_event)
            next_event = next(pending, None)
        degraded = bool(row.get("degraded"))
        report.skipped_degraded += degraded
        where = {"request_id": row.get("request_id"), "as_of_ms": as_of}
        user_id = str(row["user_id"])
        want_user = state.features("user", user_id, as_of)
        want_user_off = offline_values(fs, "user", users.get(user_id))
        for name, served_value in row["user"].items():
            if name in want_user:
                if degraded:
                    continue
                want, want_age = want_user[name]
                _check(report, name, tuple(served_value), want, want_age, {**where, "user_id": user_id})
            elif name in want_user_off:
                _check(report, name, tuple(served_value), want_user_off[name], None,
                       {**where, "user_id": user_id})  # fmt: skip
        columns = row["items"]
        for i, item_id in enumerate(row["item_ids"]):
            want_rt = state.features("item", item_id, as_of)
            want_off = offline_values(fs, "item", items.get(item_id))
            for name, col in columns.items():
                served_value = (col["values"][i], col["sources"][i], col["ages"][i])
                if name in want_rt:
                    if degraded:
                        continue
                    want, want_age = want_rt[name]
                    _check(report, name, served_value, want, want_age, {**where, "item_id": item_id})
                elif name in want_off:
                    _check(report, name, served_value, want_off[name], None, {**where, "item_id": item_id})
    return report


def format_report(report: CompareReport) -> str:
    lines = [
        f"served rows {report.rows}  (skipped: {report.skipped_version} other feature-set version, "
        f"{report.skipped_degraded} degraded: real-time features not compared)",
        f"{'feature':<22}{'compared':>10}{'mismatched':>12}{'age differs':>13}",
    ]
    for name, t in sorted(report.features.items()):
        lines.append(f"{name:<22}{t.compared:>10}{t.mismatched:>12}{t.age_mismatched:>13}")
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
) -> Dump:
    """Copy every record on `topic` (that `keep` accepts) into `out` as JSON lines.

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
        with out.open("wb") as fh:
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
                positions = {tp: await consumer.position(tp) for tp in partitions}
                if batch or any(positions[tp] < ends[tp] for tp in partitions):
                    quiet = 0
                    continue
                quiet += 1
                ends = await consumer.end_offsets(partitions)  # grown meanwhile? then go on
    finally:
        await consumer.stop()
    return dump
