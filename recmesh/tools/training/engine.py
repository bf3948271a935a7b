"""The training replay on Dask: the same plan and the same window code as the
single process, partitioned by entity (`recmesh train --engine dask`).

A training row needs its user's features as of a time (the user's events
only) and its item's (the item's events only). recmesh.features.backfill
splits the replay in two: `example_plan` decides, in one pass over the log
and without any feature, which events apply (the id rule, the same-time
rule), which reads happen when, and the rows with their labels and sampled
negatives; `answer_reads` applies events to a ReplayState and answers reads.
The single process runs both against one state. Here the plan pass runs on
the driver and writes each entity's events and reads to the partition that
holds it (users by a hash of the user id, items by the item's); each
partition is one task, run by a Dask worker, which replays its part with the
same ReplayState holding only that entity's streams; the driver then joins
the answers to the rows in the plan's order. A window's state depends only
on its own entity's events, so every value is the single process's, bit for
bit (tests/integration/test_engine.py holds the rows' digests equal).

Files, not messages: the plan's parts, the context (the feature set and the
catalogs, pickled once) and the answers are files under one working
directory that the driver and every worker can read and write: a local
directory for a LocalCluster, a shared file system mounted at the same path
on a cluster's workers (docs/models.md, "Training on a cluster").
"""

from __future__ import annotations

import functools
import logging
import pickle
import socket
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from recmesh.errors import FailedPrecondition
from recmesh.events import Event
from recmesh.features.backfill import (
    ENTITIES,
    Example,
    PlannedRow,
    Read,
    ReadAnswers,
    ReplayState,
    answer_reads,
    example_plan,
)
from recmesh.features.repository import Entity, FeatureSet

CHUNK = 16_384  # records per pickled chunk of a part's file

# A partition's file holds plain tuples (several times faster to pickle than the dataclasses):
# an applied event (event_id, user_id, item_id, behavior, event_time, values), a read
# (entity_id, as_of_ms, n); the rows file (user_id, item_id, t, user_read, item_read, label, weight).
_Applied = tuple[str, str, str, str, int, dict[str, float]]


@dataclass(frozen=True)
class EngineConfig:
    """Where the partitions run: `address` a Dask scheduler's (tcp://host:8786), else
    a LocalCluster of `workers` processes; `partitions` per entity (default 2 per
    worker); `work_dir` where the parts and answers are written (readable by every
    worker at the same path)."""

    work_dir: Path
    workers: int = 2
    partitions: int | None = None
    address: str | None = None
    connect_timeout_s: float = 30.0  # to the scheduler at `address`

    @property
    def parts(self) -> int:
        return self.partitions or 2 * self.workers


def partition_of(entity_id: str, partitions: int) -> int:
    """The partition holding an entity: stable across processes and runs (crc32, not hash())."""
    return zlib.crc32(entity_id.encode()) % partitions


class _ChunkWriter:
    """Records appended to a file as pickled lists of CHUNK."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh = path.open("wb")
        self._buf: list[Any] = []
        self.count = 0

    def add(self, record: Any) -> None:
        self._buf.append(record)
        self.count += 1
        if len(self._buf) >= CHUNK:
            self._flush()

    def _flush(self) -> None:
        pickle.dump(self._buf, self._fh, protocol=pickle.HIGHEST_PROTOCOL)
        self._buf = []

    def close(self) -> None:
        if self._buf:
            self._flush()
        self._fh.close()


def _records(path: Path) -> Iterator[Any]:
    """What a _ChunkWriter wrote, in order (our own files: the engine's working directory)."""
    with path.open("rb") as fh:
        while True:
            try:
                chunk = pickle.load(fh)
            except EOFError:
                return
            yield from chunk


@functools.lru_cache(maxsize=2)
def _context(path: str) -> tuple[FeatureSet, dict[str, Any], dict[str, Any]]:
    """The feature set and catalogs a run's partitions share, loaded once per worker process."""
    with open(path, "rb") as fh:
        loaded: tuple[FeatureSet, dict[str, Any], dict[str, Any]] = pickle.load(fh)
    return loaded


def _ops(path: Path, entity: Entity) -> Iterator[Event | Read]:
    for record in _records(path):
        if len(record) == 3:
            entity_id, as_of_ms, n = record
            yield Read(entity, entity_id, as_of_ms, n)
        else:
            event_id, user_id, item_id, behavior, t, values = record
            ev = Event.model_construct(
                event_id=event_id, user_id=user_id, item_id=item_id, behavior=behavior, event_time=t
            )
            ev._values = values
            yield ev


def replay_partition(context: str, entity: Entity, ops: str, out: str) -> dict[str, Any]:
    """One partition's part of the plan (a Dask task): its entity's events
    applied to a ReplayState keeping that entity's streams, its reads answered,
    the answers written to `out` in order."""
    started = time.perf_counter()
    feature_set, users, items = _context(context)
    state = ReplayState(feature_set, users, items, entities=(entity,))
    writer = _ChunkWriter(Path(out))
    for answer in answer_reads(state, _ops(Path(ops), entity)):
        writer.add(answer)
    writer.close()
    return {
        "entity": entity,
        "events": state.applied,
        "reads": writer.count,
        "seconds": round(time.perf_counter() - started, 3),
    }


Runner = Callable[[list[tuple[str, Entity, str, str]]], list[dict[str, Any]]]


def in_process(tasks: list[tuple[str, Entity, str, str]]) -> list[dict[str, Any]]:
    """Every partition in this process, one after another (the engine's logic without Dask)."""
    return [replay_partition(*task) for task in tasks]


def check_engine(config: EngineConfig) -> None:
    """Refuse an engine that cannot run before any work is done for it (the log's
    checks, learnt retrieval's build and the plan come first and can take many
    minutes): Dask not installed, or nothing accepting a connection at a tcp:// or
    tls:// `config.address` within its connect timeout. The scheduler itself is
    asked only when the replay starts (`dask_runner`)."""
    _distributed()
    if not config.address:
        return
    where = urlsplit(config.address if "://" in config.address else f"tcp://{config.address}")
    if where.scheme not in ("tcp", "tls"):
        return  # another transport (ucx, inproc): left to the client
    try:
        port = where.port
        if not where.hostname or port is None:
            raise ValueError("want tcp://HOST:PORT")
        with socket.create_connection((where.hostname, port), timeout=config.connect_timeout_s):
            pass
    except (OSError, ValueError) as err:
        raise _unreachable(config.address, err) from None


def _unreachable(address: str, err: Exception) -> FailedPrecondition:
    return FailedPrecondition(f"--engine-address {address}: no Dask scheduler answers ({err})")


def _distributed() -> Any:
    """Dask's `distributed` package, or the error that says how to install it."""
    try:
        import distributed
    except ImportError:
        raise FailedPrecondition(
            "--engine dask needs Dask: pip install 'recmesh[engine]' (dask[distributed])"
        ) from None
    return distributed


@contextmanager
def dask_runner(config: EngineConfig) -> Iterator[Runner]:
    """Partitions as Dask tasks: on the scheduler at `config.address`, else on a
    LocalCluster of `config.workers` single-threaded worker processes (the
    replay is pure Python: threads would share one interpreter lock)."""
    distributed = _distributed()
    Client, LocalCluster = distributed.Client, distributed.LocalCluster
    cluster = None
    if config.address:
        try:
            client = Client(config.address, timeout=f"{config.connect_timeout_s}s")
        except (OSError, TimeoutError) as err:
            raise _unreachable(config.address, err) from None
    else:
        cluster = LocalCluster(
            n_workers=config.workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.WARNING,
        )
        client = Client(cluster)

    def run(tasks: list[tuple[str, Entity, str, str]]) -> list[dict[str, Any]]:
        futures = [client.submit(replay_partition, *task, pure=False) for task in tasks]
        done: list[dict[str, Any]] = client.gather(futures)
        return done

    try:
        yield run
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _applied(ev: Event) -> _Applied:
    return (ev.event_id, ev.user_id, ev.item_id, ev.behavior, ev.event_time, ev.values)


def partitioned_examples(
    feature_set: FeatureSet,
    events: Iterable[Event],
    users: Mapping[str, Mapping[str, Any]],
    items: Mapping[str, Mapping[str, Any]],
    config: EngineConfig,
    run: Runner,
    say: Callable[[str], None] | None = None,
) -> Iterator[Example]:
    """The examples training_examples gives, in its order, with the features
    computed by `run` over entity partitions (see the module's text): plan,
    replay, join. The working files go when the examples are all read."""
    n = config.parts
    config.work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=config.work_dir, prefix="engine-") as tmp:
        work = Path(tmp)
        context = work / "context.pickle"
        with context.open("wb") as fh:
            pickle.dump((feature_set, dict(users), dict(items)), fh, protocol=pickle.HIGHEST_PROTOCOL)
        started = time.perf_counter()
        planned = _write_plan(feature_set, events, items, work, n)
        if say is not None:
            say(f"engine: planned {planned:,} rows in {time.perf_counter() - started:.1f} s; "
                f"replaying {2 * n} partitions ...")  # fmt: skip
        started = time.perf_counter()
        stats = run([(str(context), e, str(_part(work, e, p)), str(_answers(work, e, p)))
                     for e in ENTITIES for p in range(n)])  # fmt: skip
        if say is not None:
            slowest = max((s["seconds"] for s in stats), default=0.0)
            say(f"engine: {len(stats)} partitions replayed in {time.perf_counter() - started:.1f} s "
                f"(slowest {slowest:.1f} s)")  # fmt: skip
        user_answers, item_answers = (
            [ReadAnswers(_records(_answers(work, e, p))) for p in range(n)] for e in ENTITIES
        )
        for user_id, item_id, t, user_read, item_read, label, weight in _records(work / "rows"):
            user = user_answers[partition_of(user_id, n)].get(user_read)
            item = item_answers[partition_of(item_id, n)].get(item_read)
            yield Example(user_id, item_id, t - 1, user, item, label, weight)


def _part(work: Path, entity: Entity, p: int) -> Path:
    return work / f"{entity}-{p:04d}.ops"


def _answers(work: Path, entity: Entity, p: int) -> Path:
    return work / f"{entity}-{p:04d}.answers"


def _write_plan(
    feature_set: FeatureSet, events: Iterable[Event], items: Mapping[str, Any], work: Path, n: int
) -> int:
    """The plan written out: each event to the user and item partitions whose
    streams take it, each read to its entity's partition, the rows to `rows`;
    the number of rows."""
    takes = {e: frozenset(b for s in feature_set.streams_of(e) for b in s.behaviors) for e in ENTITIES}
    parts = {(e, p): _ChunkWriter(_part(work, e, p)) for e in ENTITIES for p in range(n)}
    rows = _ChunkWriter(work / "rows")
    for op in example_plan(feature_set, events, items):
        if isinstance(op, PlannedRow):
            rows.add((op.user_id, op.item_id, op.t, op.user_read, op.item_read, op.label, op.weight))
        elif isinstance(op, Read):
            parts[(op.entity, partition_of(op.entity_id, n))].add((op.entity_id, op.as_of_ms, op.n))
        else:
            record = _applied(op)
            if op.behavior in takes["user"]:
                parts[("user", partition_of(op.user_id, n))].add(record)
            if op.behavior in takes["item"]:
                parts[("item", partition_of(op.item_id, n))].add(record)
    for writer in (*parts.values(), rows):
        writer.close()
    return rows.count
