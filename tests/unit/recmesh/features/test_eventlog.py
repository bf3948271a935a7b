"""Event logs: the external sort, and the event table training's passes read."""

from __future__ import annotations

import gc
import mmap
import pickle
import random
import warnings
from pathlib import Path

import numpy as np
import pytest

from recmesh.errors import InvalidArgument
from recmesh.events import Event, EventSchema, validate_event
from recmesh.features import eventlog
from recmesh.features.eventlog import (
    EventTable,
    event_times,
    load_log,
    select,
    sorted_events,
    write_events,
)

SCHEMA = EventSchema(("view", "rate"), {}, ("rating", "dwell"))
T0 = 1_767_225_600_000


def _events(n: int, seed: int = 1) -> list[Event]:
    rng = random.Random(seed)
    out = []
    for k in range(n):
        obj: dict[str, object] = {
            "event_id": f"e{k}-{rng.randrange(10**6)}", "user_id": f"u{rng.randrange(40)}",
            "item_id": f"i{rng.randrange(90)}", "behavior": rng.choice(["view", "rate"]),
            "event_time": T0 + rng.randrange(10**7),
        }  # fmt: skip
        if obj["behavior"] == "rate":
            obj["rating"] = rng.choice([1, 2.5, 5, 0, -1.25])
        if rng.random() < 0.2:
            obj["dwell"] = rng.random() * 100
        if rng.random() < 0.1:
            obj["request_id"] = f"r{k}"
        out.append(validate_event(obj, SCHEMA))
    return sorted(out, key=lambda e: (e.event_time, e.event_id))


def _same(a: Event, b: Event) -> bool:
    return a.to_dict() == b.to_dict() and a.values == b.values and a.request_id == b.request_id


def test_a_table_gives_back_every_event_with_its_values_and_request_id() -> None:
    events = _events(10_000)
    table = EventTable.of(events, SCHEMA.values)
    assert len(table) == len(events)
    assert all(_same(a, b) for a, b in zip(table, events, strict=True))
    assert any(e.values == {} for e in table) and any(len(e.values) == 2 for e in table)
    assert _same(table[0], events[0]) and _same(table[-1], events[-1]) and _same(table[4321], events[4321])
    assert all(_same(a, b) for a, b in zip(reversed(table), reversed(events), strict=True))
    assert np.array_equal(event_times(table), [e.event_time for e in events])


def test_take_and_slices_are_views_in_the_order_given() -> None:
    events = _events(9000, seed=2)
    table = EventTable.of(events, SCHEMA.values)
    rows = [8999, 3, 3, 4500, 0]
    picked = select(table, rows)
    assert isinstance(picked, EventTable) and picked._t is table._t  # the columns are shared
    assert [e.event_id for e in picked] == [events[n].event_id for n in rows]
    again = picked.take([4, 0])  # a view of a view
    assert [e.event_id for e in again] == [events[0].event_id, events[8999].event_id]
    assert [e.event_id for e in table[100:110:3]] == [e.event_id for e in events[100:110:3]]
    assert [e.event_id for e in select(events, rows)] == [events[n].event_id for n in rows]  # a list
    assert np.array_equal(event_times(picked), [events[n].event_time for n in rows])


def test_an_empty_table_and_a_log_read_back(tmp_path: Path) -> None:
    empty = EventTable.of([], SCHEMA.values)
    assert len(empty) == 0 and list(empty) == [] and list(reversed(empty)) == []
    events = _events(500, seed=3)
    log = tmp_path / "events.jsonl"
    shuffled = events[:]
    random.Random(0).shuffle(shuffled)
    write_events(log, shuffled)
    table = EventTable.of(sorted_events(log, SCHEMA, run_size=64), SCHEMA.values)
    assert [e.event_id for e in table] == [e.event_id for e in events]
    assert [e.values for e in table] == [e.values for e in events]


def _columns(table: EventTable) -> list[object]:
    return [table._t.tolist(), table._user.tolist(), table._item.tolist(), table._behavior.tolist(),
            table._id_ends.tolist(), bytes(table._ids), table._values.tobytes(), table._requests, table.users,
            table.items, table.behaviors]  # fmt: skip


@pytest.mark.parametrize("spill_rows", [eventlog.SPILL_ROWS, 1000, 50])
def test_a_loaded_log_is_the_table_of_the_merge_sorted_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spill_rows: int
) -> None:
    """load_log sorts the columns it read instead of merge-sorting the events:
    the same table column for column (codes by first appearance in time order),
    with ties in time ordered by id as Python orders the strings (non-ASCII ids,
    one a prefix of another), and ties in both kept in the file's order;
    whether its ids are sorted and written in one batch, in batches of several
    whole runs of one time (1000), or in runs longer than a batch (50)."""
    monkeypatch.setattr(eventlog, "SPILL_ROWS", spill_rows)
    rng = random.Random(4)
    events = [e.model_copy(update={"event_time": T0 + 1000 * (e.event_time % 7)})  # 7 times: ties
              for e in _events(3000, seed=5)]  # fmt: skip
    odd = [{"event_id": i, "user_id": "ü", "item_id": "i1", "behavior": "view", "event_time": T0}
           for i in ("é1", "e1", "z", "\u20ac", "e1", "e10", "e")]  # fmt: skip
    shuffled = [*events, *(validate_event(o, SCHEMA) for o in odd)]
    rng.shuffle(shuffled)
    log = tmp_path / "events.jsonl"
    write_events(log, shuffled)
    want = EventTable.of(sorted_events(log, SCHEMA, run_size=10**6), SCHEMA.values)
    got = load_log(log, SCHEMA)
    assert _columns(got) == _columns(want) and got._rows is None
    merged = EventTable.of(sorted_events(log, SCHEMA, run_size=700), SCHEMA.values)  # runs spilled
    assert _columns(got)[:7] == _columns(merged)[:7] and _columns(got)[8:] == _columns(merged)[8:]
    assert len(got._requests) > 0 and [e.to_dict() for e in got] == [e.to_dict() for e in want]
    assert [e.request_id for e in got] == [e.request_id for e in want]
    # its ids are a file's mapping, let go of as a pass reads on: read again, pickled, reversed
    assert isinstance(got._ids, mmap.mmap) and [e.to_dict() for e in got] == [e.to_dict() for e in want]
    # so are its times and codes (read-only), still read after a pass lets go of their pages
    for column in got.codes():
        assert isinstance(column.base, memoryview) and isinstance(column.base.obj, mmap.mmap)
        assert not column.flags.writeable
    got.let_go()
    assert [c.tolist() for c in got.codes()] == [c.tolist() for c in want.codes()]
    unpickled = pickle.loads(pickle.dumps(got))
    assert _columns(unpickled) == _columns(want) and unpickled._spills == ()
    assert [e.to_dict() for e in reversed(got)] == [e.to_dict() for e in reversed(want)]
    picked = [9, 2, 2, 500, 3001]
    view = EventTable.of(shuffled, SCHEMA.values).take(picked)
    by_time = sorted((shuffled[k] for k in picked), key=lambda e: (e.event_time, e.event_id))
    assert [e.to_dict() for e in view.sorted_by_time()] == [e.to_dict() for e in by_time]
    assert len(EventTable.of([], SCHEMA.values).sorted_by_time()) == 0
    spilled = EventTable.of(shuffled, SCHEMA.values, spill=True)  # its ids in a file as read
    assert isinstance(spilled._ids, mmap.mmap) and _columns(spilled) == _columns(
        EventTable.of(shuffled, SCHEMA.values)
    )
    assert len(EventTable.of([], SCHEMA.values, spill=True)) == 0


def test_a_long_view_of_a_loaded_log_holds_its_rows_in_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """take of a log in files: a view at least VIEW_SPILL_ROWS long reads its
    row numbers through a mapping let go of with the columns, and gives what
    the same view in memory gives (its events, codes, blocks of codes, a view
    of it, pickled); a shorter one holds them in memory."""
    log = tmp_path / "events.jsonl"
    write_events(log, _events(600, seed=3))
    table = load_log(log, SCHEMA)
    rows = np.flatnonzero(np.arange(len(table)) % 3 != 1)
    want = EventTable.of(list(table), SCHEMA.values).take(rows)
    monkeypatch.setattr(eventlog, "VIEW_SPILL_ROWS", 100)
    view = table.take(rows)
    assert view._rows is not None and isinstance(view._rows.base, memoryview)
    assert isinstance(view._rows.base.obj, mmap.mmap) and not view._rows.flags.writeable
    assert len(view._spills) == len(table._spills) + 1
    assert [e.to_dict() for e in view] == [e.to_dict() for e in want]
    view.let_go()
    assert [c.tolist() for c in view.codes()] == [c.tolist() for c in want.codes()]
    blocks = [np.concatenate(c).tolist() for c in zip(*view.code_blocks(37), strict=True)]
    assert blocks == [c.tolist() for c in want.codes()]
    again = view.take(np.arange(0, len(view), 2))
    assert [e.to_dict() for e in again] == [e.to_dict() for e in want.take(np.arange(0, len(want), 2))]
    unpickled = pickle.loads(pickle.dumps(view))
    assert unpickled._spills == () and [e.to_dict() for e in unpickled] == [e.to_dict() for e in want]
    short = table.take(rows[:99])._rows
    assert type(short) is np.ndarray and short.flags.writeable


def test_a_log_that_fails_to_load_leaves_no_file_open(tmp_path: Path) -> None:
    """A bad line half-way, or no file at all: the error, and the ids' files
    the table had begun closed with it (no ResourceWarning when collected)."""
    log = tmp_path / "events.jsonl"
    write_events(log, _events(300))
    with log.open("ab") as fh:
        fh.write(b"{not json\n")
    for path in (log, tmp_path / "missing.jsonl"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises((InvalidArgument, FileNotFoundError)):
                load_log(path, SCHEMA)
            gc.collect()
        assert not [w for w in caught if issubclass(w.category, ResourceWarning)], path.name
