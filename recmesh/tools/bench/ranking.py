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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recmesh.clients.ranker import RankerClient
from recmesh.errors import RecmeshError
from recmesh.events import Event
from recmesh.features.backfill import LabelRule
from recmesh.features.eventlog import event_times
from recmesh.features.repository import FeatureSet
from recmesh.resilience import request_scope
from recmesh.retrieval import files
from recmesh.retrieval.build import rrf_head_tail
from recmesh.retrieval.table import recency_weights
from recmesh.settings import configured_classes
from recmesh.tools.bench.common import infrastructure
from recmesh.tools.bench.e2e import started_mesh
from recmesh.tools.training.ranking import (
    Histories,
    Popularity,
    Quality,
    RecallAt,
    SequentialKnn,
    Split,
    Target,
    first_k,
    rank_of,
)

RANK_MAX = 500  # the ranker's largest count
WRITE_BATCH = 500
SLO_CLASS = "A"
GROUPS = ("all", "short", "long")


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
    feature_set: FeatureSet,
    split: Split,
    model_dir: Path,
    state_dir: Path,
    k: int = 10,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """HR@k and NDCG@k of the served ranking, recall alone and popularity (module docstring)."""
    progress(f"starting a mesh on {feature_set.name!r} with the held-out model (state in {state_dir}) ...")
    started = time.perf_counter()
    # A throwaway mesh on loopback with this process its only client: its own
    # Redis and broker (no ACL users) and plaintext gRPC, so this process can
    # write the replay and ask the ranker as the gateway would.
    async with infrastructure({}) as infra:
        # Recall lists are not reused across requests (RECALL_CACHE_S=0): each
        # ranking sees exactly what was replayed before it, so runs repeat.
        env = {
            "RECMESH_REPOSITORY": str(feature_set.path),
            "RECMESH_MODEL_DIR": str(model_dir),
            "RECMESH_TLS": "off",
            "REDIS_URL": infra.redis_url,
            "KAFKA_BOOTSTRAP": infra.kafka_bootstrap,
            "RECMESH_RANKER_RECALL_CACHE_S": "0",
        }
        recall = files.load_current(model_dir, feature_set.version)
        async with started_mesh(state_dir, env=env, demo_events=0) as mesh:
            ranker = mesh.addr("RANKER_PORT")
            figures = await _replay_and_rank(feature_set, split, infra.redis_url, ranker, k, progress, recall)
    return {**figures, "total_s": round(time.perf_counter() - started, 1)}


SHORT_HISTORY = 20  # events: a user with fewer is a "short history" user
RECALL_DEPTH = 500


def _offline_lists(
    recall: files.RecallVersion | None,
    seeds: list[str],
    seen: frozenset[str],
    popular: list[str],
    again: list[str],
) -> dict[str, list[str]]:
    """Each learnt table's list for these seeds (seen items dropped, popularity
    to fill), and their fusion (with `again`, the revisit source's list: seeds
    not seen) with the version's learnt weights."""
    if recall is None:
        return {}
    lists: dict[str, list[str]] = {}
    for name, table in recall.tables.items():
        decay = float(recall.sources.get(name, {}).get("decay", 1.0))
        got = [i for i, _ in table.top(seeds, recency_weights(len(seeds), decay), RECALL_DEPTH, seen)]
        lists[name] = got

    fused_from = {**lists, "revisit": again, "popular": popular[:RECALL_DEPTH]}

    def known(weights: dict[str, float]) -> dict[str, float]:
        return {n: w for n, w in weights.items() if n in fused_from}

    fusion, depth = known(recall.card.get("fusion", {})), known(recall.card.get("fusion_depth", {}))
    if fusion:
        lists["learnt_fused"] = rrf_head_tail(fused_from, fusion, depth)[:RECALL_DEPTH]
    return lists


def _fill(ranked: list[str], popular: list[str], k: int) -> list[str]:
    return ranked[:k] + [p for p in popular if p not in ranked[:k]][: max(0, k - len(ranked))]


Rankings = dict[str, tuple[list[str], list[str]]]  # ranking -> (its first k, its full list)


@dataclass
class _Baselines:
    """The rankings measured beside the mesh's, fed the same replayed events:
    popularity, item-kNN over past sequences, each user's recent items (with
    recall.seen declared: those not seen, then popular), the recall version's
    learnt tables on their own and fused."""

    pop: Popularity
    knn_past: SequentialKnn
    hist: Histories
    revisit: bool  # recall.seen declared: what a user only viewed may be recommended
    recall: files.RecallVersion | None
    tables: list[str]

    @classmethod
    def of(cls, feature_set: FeatureSet, recall: files.RecallVersion | None) -> _Baselines:
        rule = LabelRule.of(feature_set)
        learnt = feature_set.roles.learnt_behaviors or dict.fromkeys(rule.examples, 1.0)
        return cls(
            Popularity(feature_set.roles.popularity_behaviors or rule.examples),
            SequentialKnn(learnt),
            Histories(learnt, feature_set.roles.history_cap or 50),
            feature_set.roles.seen is not None,
            recall,
            sorted(recall.tables) if recall is not None else [],
        )

    def names(self) -> list[str]:
        """Every ranking measured, the mesh's first."""
        names = ["served", "recall_alone", "popularity", "item_knn", *(["recent"] if self.revisit else []),
                 *[f"offline_{t}" for t in self.tables]]  # fmt: skip
        if self.recall is not None and self.recall.card.get("fusion"):
            names.append("offline_learnt_fused")
        return names

    def add(self, batch: Sequence[Event]) -> None:
        for feed in (self.pop, self.knn_past, self.hist):
            feed.add(batch)

    def rank(self, user_id: str, history: set[str], k: int) -> tuple[Rankings, dict[str, list[str]]]:
        """(name -> (first k, full list)) of each baseline, and the lists whose
        recall@N is reported (item-kNN, popularity, the learnt tables)."""
        got: Rankings = {}
        popular = self.pop.top(RECALL_DEPTH, history)
        got["popularity"] = (popular[:k], popular)
        knn_list = self.knn_past.top(user_id, RECALL_DEPTH, history, self.pop)
        got["item_knn"] = (knn_list[:k], knn_list)
        seeds = self.hist.items.get(user_id, [])
        again = [i for i in seeds if i not in history] if self.revisit else []
        if self.revisit:
            recent = again + [p for p in popular if p not in again]
            got["recent"] = (recent[:k], recent)
        offline = _offline_lists(self.recall, seeds, frozenset(history), popular, again)
        for t in (*self.tables, "learnt_fused"):
            if t in offline:
                got[f"offline_{t}"] = (_fill(offline[t], popular, k), offline[t])
        return got, {"item_knn (past only)": knn_list, "popularity": popular, **offline}


@dataclass
class _Tally:
    """The figures so far: quality per ranking and history group, where the
    target sits in each candidate list, the mesh's degradations."""

    quality: dict[str, dict[str, Quality]]
    recall_at: dict[str, RecallAt] = field(
        default_factory=lambda: {"fused (online, recall alone)": RecallAt()}
    )
    degraded: dict[str, Counter[str]] = field(
        default_factory=lambda: {"served": Counter(), "recall_alone": Counter()}
    )
    cold_items: int = 0  # targets on items the learnt tables do not hold

    def add(
        self, target: Target, group: str, history: set[str], got: Rankings, lists: dict[str, list[str]]
    ) -> None:
        for name, (top, full) in got.items():
            for g in ("all", group):
                self.quality[name][g].add(target.item_id, top, full)
        online = [i for i in got["recall_alone"][1] if i not in history]
        self.recall_at["fused (online, recall alone)"].add(rank_of(target.item_id, online))
        for name, ranked in lists.items():
            self.recall_at.setdefault(name, RecallAt()).add(rank_of(target.item_id, ranked))

    def hr_so_far(self) -> str:
        return ", ".join(f"{name} {q['all'].hr:.3f}" for name, q in self.quality.items())

    def to_json(self) -> dict[str, Any]:
        quality = self.quality
        return {
            **{name: q["all"].to_json() for name, q in quality.items()},
            "by_history": {
                g: {name: q[g].to_json() for name, q in quality.items()} for g in ("short", "long")
            },
            "recall_at": {name: r.to_json() for name, r in self.recall_at.items()},
            "degraded": {name: dict(c.most_common()) for name, c in self.degraded.items()},
        }


async def _mesh_rankings(
    ranker: RankerClient, target: Target, history: set[str], k: int, budget_s: float, tally: _Tally
) -> Rankings:
    """The served ranking and recall alone for one target: (first k, full list) each."""
    got: Rankings = {}
    for name, skip in (("served", ()), ("recall_alone", ("inference",))):
        # recall alone: every candidate (its list is the fused recall order)
        count = min(RANK_MAX, k + len(history)) if name == "served" else RANK_MAX
        ranked, notes = await _ranking(ranker, target.user_id, count, target.as_of_ms, skip, budget_s)
        tally.degraded[name].update(notes)
        got[name] = (first_k(ranked, history, k), ranked)
    return got


def _before(times: np.ndarray, start: int, t_ms: int) -> int:
    """The index of the first event from `start` on at or after `t_ms` (`times`: sorted)."""
    return max(start, int(np.searchsorted(times, t_ms, side="left")))


async def _replay_and_rank(
    feature_set: FeatureSet,
    split: Split,
    redis_url: str,
    ranker_addr: str,
    k: int,
    progress: Callable[[str], None],
    recall: files.RecallVersion | None = None,
) -> dict[str, Any]:
    from recmesh.redis_client import connect
    from services.feature.store import FeatureStore
    from services.feature.writer import EventWriter

    base = _Baselines.of(feature_set, recall)
    tally = _Tally({n: {g: Quality(k) for g in GROUPS} for n in base.names()})
    budget_s = configured_classes()[SLO_CLASS].budget_ms / 1000
    client = connect(redis_url, 8)
    writer = EventWriter(client, feature_set, FeatureStore(client, feature_set).offline.attributes)
    ranker = RankerClient(ranker_addr, "ranking-eval", plaintext=True)
    events, written, replay_s, rank_s = split.training, 0, 0.0, 0.0
    times = event_times(events)
    try:
        for n, target in enumerate(split.targets):
            t0 = time.perf_counter()
            upto = _before(times, written, target.event_time)
            batch = events[written:upto]
            await _write(writer, batch)
            base.add(batch)
            written = upto
            t1 = time.perf_counter()
            history = split.history[target.user_id]
            group = "short" if base.hist.events[target.user_id] < SHORT_HISTORY else "long"
            got = await _mesh_rankings(ranker, target, history, k, budget_s, tally)
            baselines, lists = base.rank(target.user_id, history, k)
            tally.add(target, group, history, got | baselines, lists)
            if recall is not None and not any(target.item_id in t.row_of for t in recall.tables.values()):
                tally.cold_items += 1
            replay_s += t1 - t0
            rank_s += time.perf_counter() - t1
            if (n + 1) % max(1, len(split.targets) // 10) == 0 or n + 1 == len(split.targets):
                progress(f"  ranked {n + 1}/{len(split.targets)} ({written:,} events replayed): "
                         f"HR@{k} {tally.hr_so_far()}")  # fmt: skip
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
        "recall_version": None if recall is None else recall.version,
        "targets_on_items_outside_the_tables": tally.cold_items,
        **tally.to_json(),
    }


async def _write(writer: Any, events: Sequence[Event]) -> None:
    for start in range(0, len(events), WRITE_BATCH):
        await writer.apply(events[start : start + WRITE_BATCH])


LABELS = {
    "served": "served (recall + model + ordering)",
    "recall_alone": "recall alone (fused, unscored)",
    "popularity": "popularity (past counts)",
    "item_knn": "item-kNN (past only, last 10 items)",
    "recent": "recent items not seen, then popular",
    "offline_knn": "item-kNN table on its own",
    "offline_ease": "EASE on its own",
    "offline_sequence": "sequence model on its own",
    "offline_similar": "your similar-items table on its own",
    "offline_learnt_fused": "learnt tables fused (offline)",
}
BASELINES = ("popularity", "item_knn", "recent", "offline_knn", "offline_ease", "offline_sequence")


def best_baseline(f: dict[str, Any]) -> tuple[str, float, float]:
    """(name, HR@k, NDCG@k) of the strongest baseline printed (by HR@k)."""
    k = f["k"]
    present = [b for b in BASELINES if b in f]
    name = max(present, key=lambda b: (f[b][f"hr@{k}"], f[b][f"ndcg@{k}"]))
    return name, f[name][f"hr@{k}"], f[name][f"ndcg@{k}"]


def table(f: dict[str, Any]) -> str:
    k = f["k"]
    rankers = [n for n in LABELS if n in f]
    lines = [
        f"ranking quality, leave-last-out ({f['targets']} users' last positive example; "
        f"history removed; class {f['slo_class']}; recall version {f.get('recall_version')})",
        f"  {'ranker':<38} {'HR@' + str(k):>7} {'NDCG@' + str(k):>8} {'short HR':>9} {'long HR':>8} "
        f"{'in list':>8}",
    ]
    for name in rankers:
        q = f[name]
        short, long_ = f["by_history"]["short"][name], f["by_history"]["long"][name]
        lines.append(
            f"  {LABELS[name]:<38} {q[f'hr@{k}']:>7.4f} {q[f'ndcg@{k}']:>8.4f} {short[f'hr@{k}']:>9.4f} "
            f"{long_[f'hr@{k}']:>8.4f} {q['target_in_list']:>8.3f}"
        )
    short_n = f["by_history"]["short"]["served"]["targets"]
    lines.append(
        f"  (short: users with < {SHORT_HISTORY} events before the target, {short_n} of them; long: the rest)"
    )
    name, hr, nd = best_baseline(f)
    served = f["served"]
    hr_x = served[f"hr@{k}"] / hr if hr else float("nan")
    nd_x = served[f"ndcg@{k}"] / nd if nd else float("nan")
    lines.append(f"  served / best baseline ({LABELS[name]}): HR@{k} {hr_x:.2f}x, NDCG@{k} {nd_x:.2f}x")
    lines.append(
        f"  {'candidates: target among the first N':<38} "
        + " ".join(f"{c:>10}" for c in ("@100", "@200", "@500"))
    )
    for src, r in f["recall_at"].items():
        lines.append(
            f"  {src:<38} " + " ".join(f"{r[c]:>10.3f}" for c in ("recall@100", "recall@200", "recall@500"))
        )
    if f.get("recall_version"):
        lines.append(f"  targets on items the learnt tables do not hold (cold items): "
                     f"{f['targets_on_items_outside_the_tables']}")  # fmt: skip
    for name, notes in f["degraded"].items():
        if notes:
            lines.append(f"  {name} degraded: " + ", ".join(f"{n} x{c}" for n, c in notes.items()))
    lines.append(f"  replay {f['events_replayed']:,} events {f['replay_s']} s, ranking {f['rank_s']} s, "
                 f"total {f['total_s']} s")  # fmt: skip
    return "\n".join(lines)


def run(
    feature_set: FeatureSet,
    split: Split,
    model_dir: Path,
    state_dir: Path,
    k: int,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    state_dir.mkdir(parents=True, exist_ok=True)
    return asyncio.run(evaluate(feature_set, split, model_dir.resolve(), state_dir, k, progress))
