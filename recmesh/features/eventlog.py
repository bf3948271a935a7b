"""Event logs on disk: canonical events as JSON lines, one per line, in any order.

`sorted_events` yields them in event-time order (ties by event id) using an
external merge sort (sorted runs of `run_size` events spilled to temporary
files, then merged), so a log larger than memory can be replayed.
`recmesh events import --to log` writes such a log from a team's own records.

`EventTable` holds a sorted log in memory as columns (about 40 bytes an event
and its id's bytes, against about 1.7 KB as Event objects) for the passes that
read it several times (`recmesh train`: the checks, the held-out split,
learnt retrieval, the replay); it is a Sequence of Events, made one at a time
as they are read.
"""

from __future__ import annotations

import heapq
import math
import mmap
import tempfile
from array import array
from collections.abc import Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, overload

import numpy as np
import orjson

from recmesh.errors import InvalidArgument
from recmesh.events import Event, EventSchema, validate_event
from recmesh.heap import Spill, give_back


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


READ_CHUNK = 4096  # events made into objects at a time when a table is iterated
SPILL_ROWS = 1 << 16  # events whose ids are written (or sorted) at a time by a table spilling them
# A view (take) of a log in files this long or longer holds its row numbers in a file too
# (the tuning split's view of a whole 4 M-event log: 16 MB held through retrieval's build)
VIEW_SPILL_ROWS = 1 << 20
# The columns a sorted log holds in files, read through mappings (besides its ids' bytes)
_MAPPED = ("_id_ends", "_t", "_user", "_item", "_behavior")


def first_seen(codes: np.ndarray, size: int) -> np.ndarray:
    """The distinct codes (each below `size`) in the order they first appear in
    `codes`: no sort of the column (np.unique's), a pass and a `size`-long array."""
    if not len(codes):
        return np.zeros(0, np.int64)
    first = np.full(size, len(codes), np.int64)
    np.minimum.at(first, codes, np.arange(len(codes), dtype=np.int64 if len(codes) >= 2**31 else np.int32))
    present = np.flatnonzero(first < len(codes))
    return present[np.argsort(first[present], kind="stable")]


def _spilled(spills: tuple[Spill, Spill], ids: bytearray, ends: array[int]) -> tuple[bytearray, array[int]]:
    """The ids read since the last call written to the ids' file and their ends
    (offsets in the whole file) to theirs; empty buffers for the next ones."""
    if ends:
        spills[1].write(spills[0].rows + np.frombuffer(ends, np.int64))
        spills[0].write(np.frombuffer(ids, np.uint8))
    return bytearray(), array("q")


class EventTable(Sequence[Event]):
    """Events as columns: times, user and item codes (into their vocabularies),
    behaviour codes, the ids' bytes, each declared value (NaN when absent), and
    the rare request ids. `take` gives a table of some of its rows without
    copying the columns. Events come back as they went in, minus fields
    training never reads (extras beyond the declared values)."""

    def __init__(self, values: tuple[str, ...]) -> None:
        self.value_names = values
        self._t = np.zeros(0, np.int64)
        self._user = np.zeros(0, np.int32)
        self._item = np.zeros(0, np.int32)
        self._behavior = np.zeros(0, np.int8)
        self._id_ends = np.zeros(0, np.int64)
        self._ids: bytes | mmap.mmap = b""
        self._values = np.zeros((0, len(values)), np.float64)
        self._requests: dict[int, str] = {}
        self.users: list[str] = []
        self.items: list[str] = []
        self.behaviors: list[str] = []
        self._rows: np.ndarray | None = None  # take(): the rows of the columns this table holds
        self._spills: tuple[Spill, ...] = ()  # the ids' files, when they are mapped (of, sorted_by_time)

    @classmethod
    def of(cls, events: Iterable[Event], values: tuple[str, ...] = (), spill: bool = False) -> EventTable:
        """The events as columns, in their order. `spill`: their ids (about 30
        bytes an event) written to a file as they come and read through a
        mapping (a log loaded whole: `load_log`), not held."""
        table = cls(values)
        t, user, item, behavior, ends = array("q"), array("i"), array("i"), array("b"), array("q")
        vals = array("d")
        ids = bytearray()
        spills = (Spill(np.uint8), Spill(np.int64)) if spill else None
        codes: tuple[dict[str, int], dict[str, int], dict[str, int]] = ({}, {}, {})
        user_codes, item_codes, behavior_codes = codes
        nan = float("nan")
        try:
            for n, ev in enumerate(events):
                t.append(ev.event_time)
                user.append(user_codes.setdefault(ev.user_id, len(user_codes)))
                item.append(item_codes.setdefault(ev.item_id, len(item_codes)))
                behavior.append(behavior_codes.setdefault(ev.behavior, len(behavior_codes)))
                ids += ev.event_id.encode()
                ends.append(len(ids))
                if spills is not None and len(ends) == SPILL_ROWS:
                    ids, ends = _spilled(spills, ids, ends)
                if values:
                    got = ev.values
                    vals.extend(got.get(name, nan) for name in values)
                if ev.request_id is not None:
                    table._requests[n] = ev.request_id
            if len(behavior_codes) > 127:
                raise InvalidArgument(f"{len(behavior_codes)} behaviours: an event table holds at most 127")
        except BaseException:  # a bad line, a missing file: the ids' files go with the table
            for each in spills or ():
                each.close()
            raise
        table._t = np.frombuffer(t, np.int64) if len(t) else table._t
        table._user = np.frombuffer(user, np.int32) if len(user) else table._user
        table._item = np.frombuffer(item, np.int32) if len(item) else table._item
        table._behavior = np.frombuffer(behavior, np.int8) if len(behavior) else table._behavior
        if spills is not None:
            _spilled(spills, ids, ends)
            table._ids, table._id_ends, table._spills = spills[0].mapping(), spills[1].mapped(), spills
        else:
            table._id_ends = np.frombuffer(ends, np.int64) if len(ends) else table._id_ends
            table._ids = bytes(ids)
        if values and len(vals):
            table._values = np.frombuffer(vals, np.float64).reshape(-1, len(values))
        table.users, table.items, table.behaviors = (list(c) for c in codes)
        return table

    def sorted_by_time(self) -> EventTable:
        """This table's events in sorted_events' order (time, then event id; in
        their order here where both tie), as a table of its own whose codes
        number users, items and behaviours in order of first appearance, as
        EventTable.of would from the sorted events. Sorted by time first, then
        each run of one time by id, whole runs of about SPILL_ROWS events at a
        time: no column of every id is made (at 4 M events, a list of their
        bytes and a fixed-width copy were 0.4 GB), and the ids go, in the new
        order, to a file read through a mapping that a pass in order lets go
        of as it goes (__iter__); so do the times and codes once sorted
        (`_to_file`), which a pass over `codes` lets go of after it (`let_go`)."""
        n = len(self)
        rows = self._rows if self._rows is not None else np.arange(n)
        t = self._t[rows]
        order = np.argsort(t, kind="stable")
        t = t[order]
        new_time = np.flatnonzero(t[1:] != t[:-1]) + 1
        spills = Spill(np.uint8), Spill(np.int64)
        ends = self._id_ends
        lo = 0
        while lo < n:
            cut = int(np.searchsorted(new_time, lo + SPILL_ROWS))  # the first time starting past the batch
            hi = int(new_time[cut]) if cut < len(new_time) else n
            src = rows[order[lo:hi]]
            starts = np.where(src > 0, ends[np.maximum(src - 1, 0)], 0)
            ids = [self._ids[a:b] for a, b in zip(starts.tolist(), ends[src].tolist(), strict=True)]
            if hi - lo > 1:
                # UTF-8 bytes order as their strings do; numpy's fixed-width bytes pad with
                # NULs, which an event id never holds (events.py refuses control characters)
                width = max(map(len, ids)) or 1
                by_id = np.lexsort((np.array(ids, dtype=f"S{width}"), t[lo:hi]))  # stable
                order[lo:hi] = order[lo:hi][by_id]
                ids = [ids[k] for k in by_id.tolist()]
            spills[1].write(spills[0].rows + np.cumsum(np.fromiter(map(len, ids), np.int64, len(ids))))
            spills[0].write(np.frombuffer(b"".join(ids), np.uint8))
            self.let_go()
            lo = hi
        table = EventTable(self.value_names)
        table._t = t
        for name, names in (("_user", "users"), ("_item", "items"), ("_behavior", "behaviors")):
            column = getattr(self, name)[rows][order]
            old = getattr(self, names)
            by_first = first_seen(column, len(old))  # old codes in order of first appearance
            recode = np.zeros(max(len(old), 1), column.dtype)
            recode[by_first] = np.arange(len(by_first), dtype=column.dtype)
            setattr(table, name, recode[column])
            setattr(table, names, [old[c] for c in by_first.tolist()])
        del column, recode
        table._ids, table._id_ends = spills[0].mapping(), spills[1].mapped()
        table._spills = (*spills, *(table._to_file(name) for name in _MAPPED if name != "_id_ends"))
        if self.value_names:
            table._values = self._values[rows][order]
        if self._requests:  # rare: where each one's row went
            at = np.empty(n, np.int64)
            at[order] = np.arange(n)
            held = np.flatnonzero(np.isin(rows, np.fromiter(self._requests, np.int64)))
            table._requests = {int(at[k]): self._requests[int(rows[k])] for k in held.tolist()}
        return table

    def _to_file(self, name: str) -> Spill:
        """Column `name` written to a file of its own and read through a mapping
        (17 bytes an event for the times and codes, held in no process's memory
        but while a pass reads them: `let_go`)."""
        column = getattr(self, name)
        spill = Spill(column.dtype)
        for start in range(0, len(column), SPILL_ROWS):  # no copy of the whole column
            spill.write(column[start : start + SPILL_ROWS])
        setattr(self, name, spill.mapped())
        return spill

    def __len__(self) -> int:
        return len(self._t) if self._rows is None else len(self._rows)

    def _row(self, n: int) -> int:
        if self._rows is None:
            return n
        return int(self._rows[n])

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Event]: ...

    def __getitem__(self, index: int | slice) -> Event | Sequence[Event]:
        if isinstance(index, slice):
            return self.take(np.arange(len(self))[index])
        size = len(self)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError(f"event {index} of {size}")
        return next(self._events(np.asarray([self._row(index)], np.int64)))

    def __iter__(self) -> Iterator[Event]:
        for start in range(0, len(self), READ_CHUNK):
            yield from self._events(self._chunk(start, start + READ_CHUNK))
            self.let_go()

    def __reversed__(self) -> Iterator[Event]:
        for end in range(len(self), 0, -READ_CHUNK):
            yield from reversed(list(self._events(self._chunk(max(0, end - READ_CHUNK), end))))
            self.let_go()

    def _chunk(self, start: int, stop: int) -> np.ndarray:
        """The column rows of the table's events start..stop (no row number is made
        for the rest: a pass over a whole 4 M-event log held 32 MB of them)."""
        if self._rows is not None:
            return self._rows[start:stop]
        return np.arange(start, min(stop, len(self._t)))

    def let_go(self) -> None:
        """Let go of the pages of the mapped columns read so far (they stay readable,
        from the page cache): after a pass over the columns (`codes`, `times`), so
        the process holds the log's columns only while it reads them."""
        for spill in self._spills:
            spill.drop()

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (sent to another process) with its columns as bytes and arrays, not mappings."""
        state = dict(self.__dict__)
        if self._spills:
            state |= {"_ids": bytes(self._ids), "_spills": ()}
            state |= {name: np.array(getattr(self, name)) for name in _MAPPED}
            state["_rows"] = None if self._rows is None else np.array(self._rows)
        return state

    def times(self) -> np.ndarray:
        return self._t if self._rows is None else self._t[self._rows]

    def codes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The rows' times, and their user, item and behaviour codes (indices into
        `users`, `items`, `behaviors`), in the table's order: a pass that needs
        only these makes no event. Read them, never write them: a whole table
        hands out its own columns (a view's are copies)."""
        cols = (self._t, self._user, self._item, self._behavior)
        if self._rows is None:
            return cols
        t, user, item, behavior = (c[self._rows] for c in cols)
        return t, user, item, behavior

    def code_blocks(self, size: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """codes() `size` events at a time (in the table's order), the pages
        read let go after each block: a pass over a long log that holds a
        block of its columns, not the whole (codes() of a view copies them)."""
        cols = (self._t, self._user, self._item, self._behavior)
        for start in range(0, len(self), size):
            rows = self._chunk(start, start + size)
            if self._rows is None:
                at = slice(start, start + len(rows))
                yield self._t[at], self._user[at], self._item[at], self._behavior[at]
            else:
                t, user, item, behavior = (c[rows] for c in cols)
                yield t, user, item, behavior
            self.let_go()

    def value(self, name: str) -> np.ndarray:
        """The rows' values of a declared value field (float64, NaN where absent)."""
        column = self._values[:, self.value_names.index(name)]
        return column if self._rows is None else column[self._rows]

    def take(self, rows: Sequence[int] | np.ndarray) -> EventTable:
        """The table of these rows of this one (in this order), sharing its columns;
        the rows as 4-byte numbers while the columns are shorter than 2^31 (a
        view of nearly the whole log, as learnt retrieval's tuning split is,
        holds 4 bytes an event, not 8), in a file read through a mapping (let
        go of with the columns) when the log's columns are files and the view
        is VIEW_SPILL_ROWS long or longer."""
        taken = EventTable.__new__(EventTable)
        taken.__dict__.update(self.__dict__)
        picked = np.asarray(rows, np.int32 if len(self._t) < 2**31 else np.int64)
        taken._rows = picked if self._rows is None else self._rows[picked]
        if self._spills and len(taken._rows) >= VIEW_SPILL_ROWS:  # a long view of a log in files: a file too
            spill = Spill(taken._rows.dtype)
            for start in range(0, len(taken._rows), SPILL_ROWS):
                spill.write(taken._rows[start : start + SPILL_ROWS])
            taken._rows, taken._spills = spill.mapped(), (*self._spills, spill)
        return taken

    def _events(self, rows: np.ndarray) -> Iterator[Event]:
        users, items, behaviors, ids, names = (
            self.users,
            self.items,
            self.behaviors,
            self._ids,
            self.value_names,
        )
        ends = self._id_ends
        starts = np.where(rows > 0, ends[np.maximum(rows - 1, 0)], 0).tolist()
        values = self._values[rows].tolist() if names else None
        requests = self._requests
        columns = zip(
            rows.tolist(), self._t[rows].tolist(), self._user[rows].tolist(), self._item[rows].tolist(),
            self._behavior[rows].tolist(), starts, ends[rows].tolist(), strict=True,
        )  # fmt: skip
        for k, (row, t, user, item, behavior, start, end) in enumerate(columns):
            yield Event.of_validated(
                ids[start:end].decode(), users[user], items[item], behaviors[behavior], t, requests.get(row),
                {} if values is None
                else {name: v for name, v in zip(names, values[k], strict=True) if not math.isnan(v)},
            )  # fmt: skip


def load_log(path: Path, schema: EventSchema) -> EventTable:
    """A log sorted by time and held as a table (what a command reading it
    several times holds): the events read into columns as they come, then the
    columns sorted (the table EventTable.of(sorted_events(...)) makes, without
    the merge sort's runs written and parsed again)."""
    table = EventTable.of(read_events(path, schema), schema.values, spill=True).sorted_by_time()
    give_back()  # the columns as read, the ids' sort
    return table


def event_times(events: Sequence[Event]) -> np.ndarray:
    """Every event's time (int64), without making the events of a table."""
    if isinstance(events, EventTable):
        return events.times()
    return np.fromiter((ev.event_time for ev in events), np.int64, len(events))


def behaviour_codes(events: Sequence[Event]) -> tuple[np.ndarray, list[str]]:
    """Each event's behaviour as a code (int64) into the names: a table's own
    codes, without making its events."""
    if isinstance(events, EventTable):
        own = events.codes()[3].astype(np.int64)
        events.let_go()
        return own, list(events.behaviors)
    names: dict[str, int] = {}
    codes = [names.setdefault(ev.behavior, len(names)) for ev in events]
    return np.asarray(codes, np.int64), list(names)


def behaviour_flags(events: Sequence[Event], behaviors: Collection[str]) -> np.ndarray:
    """Per event: is its behaviour one of `behaviors`."""
    codes, names = behaviour_codes(events)
    return np.isin(codes, [c for c, name in enumerate(names) if name in behaviors])


def select(events: Sequence[Event], rows: Sequence[int]) -> Sequence[Event]:
    """Some of a sequence's events, in the order given: a table's view when it is one."""
    if isinstance(events, EventTable):
        return events.take(rows)
    return [events[n] for n in rows]
