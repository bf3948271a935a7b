"""Ranking quality of the served mesh: HR@k and NDCG@k by leave-last-out.

The split is recmesh.tools.training.ranking's (each held-out user's last positive
example is the target; see there for exactly how). The model is trained on
the training part only (`recmesh train --ranking` does that, then calls
`evaluate`). Then a mesh is started exactly as `recmesh up` starts it (own
ports and state, the repository and that model), and the training part is
replayed into it in time order through the feature service's own write path
(services.feature.writer, what the ingest consumer runs). Before the replay
reaches a target's time it stops, so the store holds exactly the events
before it, and asks the ranker, as of 1 ms before the target:

- served: `Rank` as an app's request gets it (class A; recall, features,
  the model, final ordering);
- recall alone: the same `Rank` with scoring skipped (the ranker's own
  "inference cold" path: the fused recall order);
- popularity: counted here from the same replayed events.

Each ranking drops the user's history and keeps the first k. The ranker
returns at most RANK_MAX items from its candidates; a target outside them is
a miss for served and recall alike (`target_in_list` says how often).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from recmesh.clients.ranker import RankerClient
from recmesh.errors import RecmeshError
from recmesh.events import Event
from recmesh.features.backfill import LabelRule
from recmesh.features.repository import FeatureSet
from recmesh.resilience import request_scope
from recmesh.settings import configured_classes
from recmesh.tools.bench.common import infrastructure
from recmesh.tools.bench.e2e import started_mesh
from recmesh.tools.training.ranking import Popularity, Quality, Split, first_k

RANK_MAX = 500  # the ranker's largest count
WRITE_BATCH = 500
SLO_CLASS = "A"


async def _ranking(
    ranker: RankerClient, user_id: str, count: int, as_of_ms: int, skip: Sequence[str], budget_s: float
) -> tuple[list[str], list[str]]:
    """(item ids, degradations) of one Rank call; a failed call ranks nothing."""
    try:
        with request_scope(SLO_CLASS, budget_s):
            resp = await ranker.rank(user_id, count, {}, as_of_ms, skip=skip)
    except RecmeshError as err:
        return [], [f"error:{type(err).__name__}"]
    return [i.item_id for i in resp.items], list(resp.degraded)


async def evaluate(
    fs: FeatureSet,
    split: Split,
    model_dir: Path,
    state_dir: Path,
    k: int = 10,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """HR@k and NDCG@k of the served ranking, recall alone and popularity (module docstring)."""
    progress(f"starting a mesh on {fs.name!r} with the held-out model (state in {state_dir}) ...")
    started = time.perf_counter()
    # A throwaway mesh on loopback with this process its only client: its own
    # Redis and broker (no ACL users) and plaintext gRPC, so this process can
    # write the replay and ask the ranker as the gateway would.
    async with infrastructure({}) as infra:
        env = {"RECMESH_REPOSITORY": str(fs.path), "RECMESH_MODEL_DIR": str(model_dir), "RECMESH_TLS": "off",
               "REDIS_URL": infra.redis_url, "KAFKA_BOOTSTRAP": infra.kafka_bootstrap}  # fmt: skip
        async with started_mesh(state_dir, env=env, demo_events=0) as mesh:
            ranker = mesh.addr("RANKER_PORT")
            figures = await _replay_and_rank(fs, split, infra.redis_url, ranker, k, progress)
    return {**figures, "total_s": round(time.perf_counter() - started, 1)}


async def _replay_and_rank(
    fs: FeatureSet, split: Split, redis_url: str, ranker_addr: str, k: int, progress: Callable[[str], None]
) -> dict[str, Any]:
    from recmesh.redis_client import connect
    from services.feature.store import FeatureStore
    from services.feature.writer import EventWriter

    rule = LabelRule.of(fs)
    pop = Popularity(fs.roles.popularity_behaviors or rule.examples)
    quality = {"served": Quality(k), "recall_alone": Quality(k), "popularity": Quality(k)}
    degraded: dict[str, Counter[str]] = {"served": Counter(), "recall_alone": Counter()}
    budget_s = configured_classes()[SLO_CLASS].budget_ms / 1000
    client = connect(redis_url, 8)
    writer = EventWriter(client, fs, FeatureStore(client, fs).offline.attributes)
    ranker = RankerClient(ranker_addr, "ranking-eval", plaintext=True)
    events, written, replay_s, rank_s = split.training, 0, 0.0, 0.0
    try:
        for n, target in enumerate(split.targets):
            t0 = time.perf_counter()
            upto = written
            while upto < len(events) and events[upto].event_time < target.event_time:
                upto += 1
            await _write(writer, events[written:upto])
            pop.add(events[written:upto])
            written = upto
            t1 = time.perf_counter()
            history = split.history[target.user_id]
            count = min(RANK_MAX, k + len(history))
            for name, skip in (("served", ()), ("recall_alone", ("inference",))):
                ranked, notes = await _ranking(ranker, target.user_id, count, target.as_of_ms, skip, budget_s)
                degraded[name].update(notes)
                quality[name].add(target.item_id, first_k(ranked, history, k), ranked)
            quality["popularity"].add(target.item_id, pop.top(k, history))
            replay_s += t1 - t0
            rank_s += time.perf_counter() - t1
            if (n + 1) % max(1, len(split.targets) // 10) == 0 or n + 1 == len(split.targets):
                so_far = ", ".join(f"{name} HR@{k} {q.hr:.3f}" for name, q in quality.items())
                progress(f"  ranked {n + 1}/{len(split.targets)} ({written:,} events replayed): {so_far}")
    finally:
        await ranker.close()
        await client.aclose()
    return {
        "k": k,
        "slo_class": SLO_CLASS,
        "targets": len(split.targets),
        "held_out_events": split.held_out_events,
        "training_events": len(split.training),
        "events_replayed": written,
        "replay_s": round(replay_s, 1),
        "rank_s": round(rank_s, 1),
        **{name: q.to_json() for name, q in quality.items()},
        "degraded": {name: dict(c.most_common()) for name, c in degraded.items()},
    }


async def _write(writer: Any, events: Sequence[Event]) -> None:
    for start in range(0, len(events), WRITE_BATCH):
        await writer.apply(events[start : start + WRITE_BATCH])


def table(f: dict[str, Any]) -> str:
    k = f["k"]
    lines = [
        f"ranking quality, leave-last-out ({f['targets']} users' last positive example; "
        f"history removed; class {f['slo_class']})",
        f"  {'ranker':<14} {'HR@' + str(k):>8} {'NDCG@' + str(k):>9} {'target in list':>15}",
    ]
    for name in ("served", "recall_alone", "popularity"):
        q = f[name]
        lines.append(f"  {name:<14} {q[f'hr@{k}']:>8.4f} {q[f'ndcg@{k}']:>9.4f} {q['target_in_list']:>15.3f}")
    for name, notes in f["degraded"].items():
        if notes:
            lines.append(f"  {name} degraded: " + ", ".join(f"{n} x{c}" for n, c in notes.items()))
    lines.append(f"  replay {f['events_replayed']:,} events {f['replay_s']} s, ranking {f['rank_s']} s, "
                 f"total {f['total_s']} s")  # fmt: skip
    return "\n".join(lines)


def run(
    fs: FeatureSet, split: Split, model_dir: Path, state_dir: Path, k: int, progress: Callable[[str], None]
) -> dict[str, Any]:
    state_dir.mkdir(parents=True, exist_ok=True)
    return asyncio.run(evaluate(fs, split, model_dir.resolve(), state_dir, k, progress))
