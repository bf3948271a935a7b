"""The partitioned replay (the engine's logic, run in this process): the rows
of training_examples, in its order, bit for bit, however the entities are split."""

from __future__ import annotations

import dataclasses
import random
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from recmesh.errors import FailedPrecondition
from recmesh.events import Event
from recmesh.features.backfill import (
    Example,
    ExampleDigest,
    PlannedRow,
    Read,
    example_plan,
    training_examples,
)
from recmesh.features.repository import FeatureSet, parse_feature_set
from recmesh.features.repository.load import DEMO_REPOSITORY
from recmesh.tools.training import engine
from recmesh.tools.training.train import TrainConfig, demo_source

DEMO_LABEL = 'label = { behaviors = ["click"], within = "10s" }'


@pytest.fixture(scope="module")
def with_negatives() -> FeatureSet:
    """The demo repository with a label window *and* sampled negatives, half of them hard:
    every path of the plan (rows held for their label, negatives after their example)."""
    text = DEMO_REPOSITORY.read_text()
    assert DEMO_LABEL in text
    text = text.replace(DEMO_LABEL, DEMO_LABEL + "\nnegatives = 3\nhard_negatives = 0.5")
    return parse_feature_set(text, DEMO_REPOSITORY)


@pytest.fixture(scope="module")
def world() -> tuple[list[Event], dict[str, Any], dict[str, Any]]:
    """The demo's sessions, with what a real log has: an app re-sending events (same id,
    later), and many events at one millisecond."""
    events, users, items = demo_source(TrainConfig(sessions=200, hours=0.5))
    rng = random.Random(3)
    resent = [e.model_copy(update={"event_time": e.event_time + 500}) for e in rng.sample(events, 40)]
    same_ms = [e.model_copy(update={"event_time": e.event_time - e.event_time % 1000}) for e in events[::7]]
    kept = [e for n, e in enumerate(events) if n % 7]
    return sorted([*kept, *same_ms, *resent], key=lambda e: e.event_time), users, items


def _rows(examples: Any) -> list[Example]:
    return list(examples)


@pytest.mark.parametrize("partitions", [1, 3, 7])
def test_partitions_give_the_single_process_rows_bit_for_bit(
    tmp_path: Path,
    with_negatives: FeatureSet,
    world: tuple[list[Event], dict[str, Any], dict[str, Any]],
    partitions: int,
) -> None:
    events, users, items = world
    single = _rows(training_examples(with_negatives, events, users, items))
    ran: list[dict[str, Any]] = []

    def run(tasks: list[tuple[str, Any, str, str]]) -> list[dict[str, Any]]:
        ran.extend(engine.in_process(tasks))
        return ran

    config = engine.EngineConfig(tmp_path, partitions=partitions)
    split = _rows(engine.partitioned_examples(with_negatives, events, users, items, config, run))
    assert len(split) == len(single) > 1000
    assert split == single  # same rows, same order, same values
    digests = [ExampleDigest() for _ in range(2)]
    for ex in single:
        digests[0].add(ex)
    for ex in split:
        digests[1].add(ex)
    assert digests[0].hexdigest() == digests[1].hexdigest()
    assert len(ran) == 2 * partitions and all(r["events"] and r["reads"] for r in ran)
    assert sum(r["reads"] for r in ran if r["entity"] == "item") > sum(r["reads"] for r in ran
                                                                      if r["entity"] == "user")  # fmt: skip
    assert not list(tmp_path.iterdir()), "the working files are removed"
    assert any(r.label for r in single) and any(not r.label for r in single)


def test_the_digest_tells_one_changed_value(
    with_negatives: FeatureSet, world: tuple[list[Event], dict[str, Any], dict[str, Any]]
) -> None:
    events, users, items = world
    rows = _rows(training_examples(with_negatives, events[:400], users, items))
    a, b = ExampleDigest(), ExampleDigest()
    for ex in rows:
        a.add(ex)
    changed = rows[5]
    name = next(iter(changed.item))
    value = changed.item[name]
    other = dataclasses.replace(
        changed, item={**changed.item, name: value + 1 if isinstance(value, int) else "x"}
    )
    for ex in [*rows[:5], other, *rows[6:]]:
        b.add(ex)
    assert a.hexdigest() != b.hexdigest() and a.count == b.count


def test_the_plan_reads_before_its_rows_and_each_example_precedes_its_negatives(
    with_negatives: FeatureSet, world: tuple[list[Event], dict[str, Any], dict[str, Any]]
) -> None:
    events, _, items = world
    reads = {"user": -1, "item": -1}
    last: PlannedRow | None = None
    for op in example_plan(with_negatives, events, items):
        if isinstance(op, Read):
            assert op.n == reads[op.entity] + 1  # numbered in order per entity
            reads[op.entity] = op.n
        elif isinstance(op, PlannedRow):
            assert op.user_read <= reads["user"] and op.item_read <= reads["item"]  # read before
            if last is not None:  # rows leave in the order read: the reorder holds later ones
                assert (op.user_read, op.item_read) > (last.user_read, last.item_read)
                if op.user_read == last.user_read:  # a negative: its example's user read, label 0
                    assert op.label == 0 and op.t == last.t
            last = op
    assert last is not None


def test_a_scheduler_that_does_not_answer_is_refused_in_bounded_time(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = engine.EngineConfig(tmp_path, address=f"tcp://127.0.0.1:{port}", connect_timeout_s=1.0)
    started = time.monotonic()
    with (
        pytest.raises(
            FailedPrecondition, match=f"--engine-address tcp://127.0.0.1:{port}: no Dask scheduler"
        ),
        engine.dask_runner(config),
    ):
        pass
    assert time.monotonic() - started < 15


def test_the_engine_check_connects_to_the_scheduler_address_only() -> None:
    with socket.socket() as listening:  # something answers: the check passes (the scheduler is asked later)
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        for address in (f"tcp://127.0.0.1:{port}", f"127.0.0.1:{port}"):
            engine.check_engine(engine.EngineConfig(Path("unused"), address=address, connect_timeout_s=1.0))
    engine.check_engine(engine.EngineConfig(Path("unused")))  # a local cluster: nothing to reach
    for address, why in (
        (f"tcp://127.0.0.1:{port}", "Connection refused"),
        ("tcp://127.0.0.1", "want tcp://HOST:PORT"),
    ):
        with pytest.raises(FailedPrecondition, match=f"--engine-address {address}: no Dask scheduler") as err:
            engine.check_engine(engine.EngineConfig(Path("unused"), address=address, connect_timeout_s=1.0))
        assert why in str(err.value), err.value
