"""The guard against a real Redis and a model directory: the sums attribution adds up
(AttributionStore.finalise, per minute) decide a running experiment, and the guard
rolls a worse candidate back, promotes a good one (CURRENT names it), waits on too few
answers and validates a degradation level, writing the experiment's end on file."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest
import redis.asyncio as redis
from prometheus_client import REGISTRY

from recmesh.evaluation.experiment import Experiment, new_experiment, read_experiment, write_experiment
from recmesh.evaluation.impression import Group, Shadow, Shown
from recmesh.evaluation.outcome import outcome
from recmesh.evaluation.sums import increments
from recmesh.features.repository import DEMO_REPOSITORY, Evaluation, Guard
from recmesh.modeldir import MODEL_NAME, variant_file
from recmesh.topics import ensure_topics
from services.attribution.guard import ExperimentGuard, watch
from services.attribution.store import MINUTE_MS, AttributionStore, Due, pending_member
from tests.helpers import free_port, poll_until

ROOT = Path(__file__).resolve().parents[2]

ITEMS = ("a", "b", "c", "d")
SCORES = (4.0, 3.0, 2.0, 1.0)  # a click at position p: AUC (4 - p) / 3
GOOD = (1, 1, 2, 3)  # AUC ~0.75
EVEN = (1, 2, 3, 4)  # AUC ~0.5
BETTER = (1, 1, 1, 2)  # AUC ~0.92
EVALUATION = Evaluation(frozenset({"click"}), window_ms=60_000, lateness_ms=1_000, k=10)


def model_dir(tmp_path: Path) -> Path:
    """Two versions, `base` served."""
    root = tmp_path / "models"
    for version in ("base", "cand"):
        (root / MODEL_NAME / version).mkdir(parents=True)
        (root / MODEL_NAME / version / "card.json").write_text("{}")
        (root / MODEL_NAME / version / variant_file(0)).write_bytes(b"")
    (root / MODEL_NAME / "CURRENT").write_text("base\n")
    return root


def current(root: Path) -> str:
    return (root / MODEL_NAME / "CURRENT").read_text().strip()


async def served(
    client: redis.Redis, group: Group, positions: Iterable[int], n: int, as_of_ms: int, tag: str,
    shadow: Shadow | None = None,
) -> None:  # fmt: skip
    """n answers of `group` made final as attribution does, one click each at the next of
    `positions`, as of `as_of_ms` onwards (one per ms); `shadow`: scored by it too."""
    store = AttributionStore(client, EVALUATION, grace_ms=3_600_000, retention_ms=86_400_000)
    done = []
    for i, p in enumerate(itertools.islice(itertools.cycle(positions), n)):
        user, rid = f"{tag}-u{i}", f"{tag}-r{i}"
        s = Shown(rid, user, as_of_ms + i, ITEMS, SCORES, group, shadow=shadow)
        due = Due(pending_member(user, rid), s, [], [])
        clicked = {ITEMS[p - 1]}
        by_shadow = None if shadow is None else outcome(s, clicked, EVALUATION.k, shadow.scores)
        done.append((due, increments(s, outcome(s, clicked, EVALUATION.k), by_shadow)))
    for start in range(0, len(done), 500):
        assert all(await store.finalise(done[start : start + 500]))


def arm(name: str, model: str = "base") -> Group:
    return Group(model, "full", "A", name)


def decisions(verdict: str) -> float:
    return REGISTRY.get_sample_value("recmesh_guard_decisions_total", {"decision": verdict}) or 0.0


def running() -> float | None:
    return REGISTRY.get_sample_value("recmesh_experiment_running")


def started(tmp: Path, experiment: Experiment) -> Path:
    root = model_dir(tmp)
    write_experiment(root, experiment)
    return root


async def test_a_clearly_worse_candidate_is_rolled_back_and_current_stays(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    exp = new_experiment("model", 10.0, candidate="cand")
    root = started(tmp_path, exp)
    await served(redis_client, arm("control"), GOOD, 2500, exp.started_ms, "c")
    await served(redis_client, arm("candidate", "cand"), EVEN, 2500, exp.started_ms, "t")
    before = decisions("rollback")

    decision = await ExperimentGuard(redis_client, root, Guard()).check()

    assert decision is not None and decision.verdict == "rollback", decision
    assert decision.candidate is not None and decision.candidate.mean == pytest.approx(0.5, abs=1e-3)
    assert decision.control is not None and decision.control.mean == pytest.approx(0.75, abs=1e-3)
    ended = read_experiment(root)
    assert ended is not None and ended.state == "rolled_back" and ended.decided_ms is not None
    assert ended.reason.startswith("guard: worse than control by more than max_drop 0.01")
    assert current(root) == "base"
    assert decisions("rollback") == before + 1 and running() == 0
    assert await ExperimentGuard(redis_client, root, Guard()).check() is None, "it has ended"


async def test_a_good_candidate_is_promoted_from_the_minutes_since_it_started(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    exp = new_experiment("model", 10.0, candidate="cand")
    root = started(tmp_path, exp)
    # An earlier experiment's candidate of the same name, clearly worse, minutes before this one: not counted.
    await served(redis_client, arm("candidate", "cand"), EVEN, 3000, exp.started_ms - 3 * MINUTE_MS, "old")
    await served(redis_client, arm("control"), GOOD, 2000, exp.started_ms, "c")
    await served(redis_client, arm("candidate", "cand"), BETTER, 2000, exp.started_ms, "t")

    decision = await ExperimentGuard(redis_client, root, Guard()).check()

    assert decision is not None and decision.verdict == "promote", decision
    assert decision.candidate is not None and decision.candidate.n == 2000
    assert current(root) == "cand"
    ended = read_experiment(root)
    assert ended is not None and ended.state == "promoted" and "not worse than control" in ended.reason


async def test_too_few_answers_wait_and_change_nothing(redis_client: redis.Redis, tmp_path: Path) -> None:
    exp = new_experiment("model", 10.0, candidate="cand")
    root = started(tmp_path, exp)
    await served(redis_client, arm("control"), GOOD, 2000, exp.started_ms, "c")
    await served(redis_client, arm("candidate", "cand"), EVEN, 300, exp.started_ms, "t")
    guard = ExperimentGuard(redis_client, root, Guard())

    decision = await guard.check()

    assert decision is not None and decision.verdict == "wait" and "1000 needed in each" in decision.reason
    assert read_experiment(root) == exp and current(root) == "base" and running() == 1
    assert await ExperimentGuard(redis_client, root, None).check() is None, (
        "no [evaluation.guard]: no decision"
    )
    assert read_experiment(root) == exp


async def test_a_level_within_max_drop_is_validated(redis_client: redis.Redis, tmp_path: Path) -> None:
    exp = new_experiment("level", 10.0, level=2)
    root = started(tmp_path, exp)
    await served(redis_client, arm("control"), GOOD, 2000, exp.started_ms, "c")
    await served(redis_client, Group("base", "no_crosses", "A", "level:2"), GOOD, 2000, exp.started_ms, "t")

    decision = await ExperimentGuard(redis_client, root, Guard(max_drop=0.03)).check()

    assert decision is not None and decision.verdict == "promote" and decision.difference == 0.0
    ended = read_experiment(root)
    assert ended is not None and ended.state == "validated" and current(root) == "base"


async def test_a_shadow_that_holds_is_validated_and_never_made_current(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    exp = new_experiment("model", 0.0, candidate="cand", shadow=True)
    root = started(tmp_path, exp)
    # Control's answers, each clicked at its last position, which the shadow scores first.
    await served(redis_client, arm("control"), [len(ITEMS)], 1200, exp.started_ms, "c",
                 shadow=Shadow("cand", tuple(reversed(SCORES))))  # fmt: skip

    decision = await ExperimentGuard(redis_client, root, Guard()).check()

    assert decision is not None and decision.verdict == "promote", decision
    assert decision.candidate is not None and decision.candidate.mean == 1.0, (
        "the shadow ranks the click first"
    )
    ended = read_experiment(root)
    assert ended is not None and ended.state == "validated" and current(root) == "base"
    assert "a shadow is validated, never promoted" in ended.reason


async def test_a_failing_check_is_logged_and_tried_again(redis_client: redis.Redis, tmp_path: Path) -> None:
    exp = new_experiment("model", 10.0, candidate="cand")
    root = started(tmp_path, exp)
    await served(redis_client, arm("control"), GOOD, 2000, exp.started_ms, "c")
    await served(redis_client, arm("candidate", "cand"), EVEN, 2000, exp.started_ms, "t")
    (root / MODEL_NAME / "EXPERIMENT").write_text("{not json")
    guard = ExperimentGuard(redis_client, root, Guard())
    task = asyncio.create_task(watch(guard, every_s=0.01))
    await asyncio.sleep(0.1)
    assert not task.done(), "a failed check never ends the watch"
    write_experiment(root, exp)
    for _ in range(200):
        ended = read_experiment(root)
        if ended is not None and not ended.running:
            break
        await asyncio.sleep(0.02)
    task.cancel()
    await asyncio.wait({task})
    assert ended is not None and ended.state == "rolled_back"


def _process(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "services.attribution"], env=env, stdout=fh,
                                stderr=subprocess.STDOUT, cwd=ROOT)  # fmt: skip


async def test_the_attribution_process_runs_the_guard(
    kafka_bootstrap: str, topics: dict[str, str], redis_client: redis.Redis, scratch_redis_url: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    impressions = f"imp-{topics['events']}"
    await ensure_topics(kafka_bootstrap, {impressions: 1})
    repository = tmp_path / "recmesh.toml"
    repository.write_text(DEMO_REPOSITORY.read_text() + "\n[evaluation.guard]\nmax_drop = 0.02\n")
    exp = new_experiment("model", 10.0, candidate="cand")
    root = started(tmp_path, exp)
    await served(redis_client, arm("control"), GOOD, 2000, exp.started_ms, "c")
    await served(redis_client, arm("candidate", "cand"), BETTER, 2000, exp.started_ms, "t")
    env = dict(
        os.environ, REDIS_URL=scratch_redis_url, KAFKA_BOOTSTRAP=kafka_bootstrap,
        RECMESH_EVENTS_TOPIC=topics["events"], RECMESH_IMPRESSIONS_TOPIC=impressions,
        RECMESH_ATTRIBUTION_GROUP=f"guard-{free_port()}", ATTRIBUTION_METRICS_PORT=str(free_port()),
        RECMESH_REPOSITORY=str(repository), RECMESH_MODEL_DIR=str(root),
    )  # fmt: skip
    log = tmp_path / "attribution.log"
    proc = _process(env, log)
    try:

        async def promoted() -> bool:
            ended = read_experiment(root)
            return ended is not None and ended.state == "promoted"

        await poll_until(promoted, "the guard in the attribution process promotes the candidate", 60)
        assert current(root) == "cand"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
    text = log.read_text()
    assert "guard_decision" in text and "guard_check_failed" not in text and "stopped" in text, text
