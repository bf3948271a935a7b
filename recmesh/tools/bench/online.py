"""`recmesh bench online`: an event log replayed as live traffic, two arms served side by side,
and what online evaluation says about them.

The simulation, exactly:
- The log is sorted by event time. Its first `--live-from` share of events (0.8) is the past:
  sent to the events topic and applied by the ingest before anything is served.
- The rest is live. A *visit* starts at a user's live event that follows their previous event
  by at least `--visit-gap-h` (1 h; MovieLens users rate in sittings), or is their first. At a
  visit's start, and again after every `--every` (10) events of the user in it (back on the
  recommendations page), at the time t of that event, the user asks for `--count` (10)
  recommendations as of t - 1 ms: the ranker is
  called over gRPC with that as-of time (the gateway cannot be told a past time, so this tool
  takes the gateway's place and writes the impression record itself, with the same code,
  recmesh.evaluation.impression, to the same topic). The answers see features from the events
  applied before the hour the visit falls in (the log is sent an hour at a time, and each hour
  waits for the ingest to commit the previous one).
- What the user does next is the log itself: every event of the live period goes to the events
  topic, and the behaviours the repository's `[evaluation]` names (MovieLens: click, a rating of
  4 or 5) credit an answer that showed the item within its window (7 d), by last touch
  (docs/operations.md). Visits stop window + lateness before the log ends, so every answer's
  window closes inside the log; attribution makes all of them final before the figures are read.
- The served order is the ranker's blend of the model's order and the recall order
  (`--blend`: RECMESH_RANKER_RECALL_BLEND; default, the tuned weight of the learnt recall's
  card); `--blend 0` serves the model's order alone.
- `--shadow` (with a candidate): control's answers are scored by the candidate too, never
  served by it (`--share 0`: nobody is served the candidate); the AUC is then held against the
  shadow's, on the very items and clicks control's answers had.
- The arms: a degradation level served to `--share` percent of users (`--level 3`, the
  weaker model the ladder falls back to), or a candidate model (`--candidate shuffled`: the
  served model with its weights shuffled; `--candidate inverted`: the served model scoring
  backwards; `--candidate copy`: the served model itself; `--candidate offline-only`: the
  baseline trained beside it without the real-time features; or any other version in the
  model directory; `--control VERSION` serves another than its CURRENT), which the repository's
  `[evaluation.guard]` promotes or rolls back during the replay (`--no-guard`: figures only,
  the split runs to the end).

Printed: per arm its offline holdout AUC (the model card) and its online figures with 95%
intervals, whether the online order agrees with the offline one, after how many answers the
intervals separated for good, and for a candidate what the guard decided, when.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from recmesh.clients.ranker import RankerClient
from recmesh.credentials import RedisAuth
from recmesh.evaluation import impression
from recmesh.evaluation.experiment import Experiment, new_experiment, read_experiment, write_experiment
from recmesh.evaluation.sums import SHADOW, Estimate, add, rows
from recmesh.events import Event
from recmesh.features.eventlog import sorted_events
from recmesh.features.repository import FeatureSet, load_feature_set
from recmesh.modeldir import MODEL_NAME, current_model, point_current
from recmesh.redis_client import connect
from recmesh.tools.bench.common import emit, plaintext_unless_set
from recmesh.tools.bench.e2e import StartedMesh, started_mesh
from recmesh.tools.cli.clienv import parse as parse_cli_env
from recmesh.tools.training.derive import derive_version
from services.attribution.store import read_minutes

HOUR_MS = 3_600_000
INGEST_GROUP = "recmesh-feature-ingest"
EVENTS_TOPIC, IMPRESSIONS_TOPIC = "user_behavior", "impressions"
CONCURRENCY = 8  # rank calls in flight


@dataclass(frozen=True)
class Visit:
    user_id: str
    at_ms: int  # the as-of time of its request


def visits(
    live: Sequence[Event], last_ms: int, gap_ms: int, before: dict[str, int], every: int = 0
) -> list[Visit]:
    """A request at the start of each visit, and again after every `every` events of the
    user within it (0: only at the start); `before`: each user's last past event."""
    last = dict(before)
    since: dict[str, int] = {}  # events of the user since their last request
    out = []
    for e in live:
        previous = last.get(e.user_id)
        starts = previous is None or e.event_time - previous >= gap_ms
        again = every > 0 and since.get(e.user_id, 0) >= every
        if (starts or again) and e.event_time <= last_ms and (previous is None or e.event_time > previous):
            out.append(Visit(e.user_id, e.event_time - 1))
            since[e.user_id] = 0
        since[e.user_id] = since.get(e.user_id, 0) + 1
        last[e.user_id] = e.event_time
    return out


def separated_after(curve: Sequence[tuple[int, Estimate | None, Estimate | None]]) -> int | None:
    """The answers (both arms) from which the two intervals no longer overlap, in the final order."""
    if not curve or curve[-1][1] is None or curve[-1][2] is None:
        return None
    final_sign = curve[-1][1].mean > curve[-1][2].mean
    at = None
    for n, a, b in curve:
        apart = (
            a is not None and b is not None and (a.mean > b.mean) == final_sign
            and abs(a.mean - b.mean) > a.half_width + b.half_width
        )  # fmt: skip
        if apart and at is None:
            at = n
        elif not apart:
            at = None
    return at


class Replay:
    def __init__(self, mesh: StartedMesh, state: Path, feature_set: FeatureSet) -> None:
        self.mesh = mesh
        self.state = state
        self.feature_set = feature_set
        self.kafka = mesh.addr("RECMESH_KAFKA_PORT")
        self.ranker = RankerClient(mesh.addr("RANKER_PORT"), "gateway")
        self.producer = AIOKafkaProducer(bootstrap_servers=self.kafka, acks="all", linger_ms=5)
        self.sent: dict[int, int] = {}  # events partition -> the highest offset sent
        self.answers = 0

    async def send(self, events: Sequence[Event]) -> None:
        futures = [
            await self.producer.send(EVENTS_TOPIC, key=e.user_id.encode(), value=orjson.dumps(e.to_dict()))
            for e in events
        ]
        for meta in await asyncio.gather(*futures):
            self.sent[meta.partition] = max(self.sent.get(meta.partition, -1), meta.offset)

    async def applied(self, timeout_s: float = 300.0) -> None:
        """Until the ingest has committed every event sent (it commits after its write)."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.kafka, group_id=INGEST_GROUP, enable_auto_commit=False
        )
        await consumer.start()
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                behind = [
                    p for p, o in self.sent.items()
                    if (await consumer.committed(TopicPartition(EVENTS_TOPIC, p)) or 0) <= o
                ]  # fmt: skip
                if not behind:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the ingest did not apply the replayed events within {timeout_s} s")
                await asyncio.sleep(0.05)
        finally:
            await consumer.stop()

    async def serve(self, batch: Sequence[Visit], count: int) -> None:
        """Rank for each visit as of its time and log the answer as the gateway would."""
        slots = asyncio.Semaphore(CONCURRENCY)

        async def one(v: Visit) -> None:
            async with slots:
                ranked = await self.ranker.rank(v.user_id, count, {}, v.at_ms)
            shadow = (
                impression.Shadow(ranked.shadow_model_version, tuple(ranked.shadow_scores))
                if ranked.shadow_model_version
                else None
            )
            rec = impression.record(
                request_id=f"replay-{v.user_id}-{v.at_ms}", user_id=v.user_id,
                items=[(i.item_id, i.score) for i in ranked.items], model_version=ranked.model_version,
                feature_version=ranked.feature_version, degraded=list(ranked.degraded), slo_class="B",
                arm=ranked.arm or impression.CONTROL, as_of_ms=v.at_ms, served_at_ms=int(time.time() * 1000),
                trace_id="", shadow=shadow,
            )  # fmt: skip
            await self.producer.send(IMPRESSIONS_TOPIC, key=v.user_id.encode(), value=orjson.dumps(rec))
            self.answers += 1

        await asyncio.gather(*(one(v) for v in batch))

    async def final(self, stall_s: float = 30.0) -> dict[str, float]:
        """Until attribution has made every answer final, or made none final for `stall_s`;
        what its counters say then."""
        url = f"http://127.0.0.1:{self.mesh.ports['ATTRIBUTION_METRICS_PORT']}/metrics"
        last, since = -1.0, time.monotonic()
        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                text = (await http.get(url)).text
                seen = {
                    o: _metric(text, "recmesh_attribution_answers_total", {"outcome": o})
                    for o in ("added", "expired", "already_added")
                }
                seen["pending"] = _metric(text, "recmesh_attribution_pending")
                seen["invalid_impressions"] = _metric(
                    text, "recmesh_attribution_records_total", {"kind": "impressions", "outcome": "invalid"}
                )
                seen["clock_behind_s"] = _metric(text, "recmesh_attribution_clock_behind_seconds")
                done = seen["added"] + seen["expired"]
                if done >= self.answers and seen["pending"] == 0:
                    return seen
                if done != last:
                    last, since = done, time.monotonic()
                elif time.monotonic() - since > stall_s:
                    return seen
                await asyncio.sleep(0.5)

    async def curves(self) -> tuple[dict[str, float], list[dict[str, float]]]:
        """The sums of every answer, and their cumulative sums minute by minute (as-of time)."""
        cli = parse_cli_env((self.state / "secrets" / "cli.env").read_text(), self.state / "cli.env")
        auth = RedisAuth(
            REDIS_USERNAME=cli.get("REDIS_USERNAME"), REDIS_PASSWORD=SecretStr(cli["REDIS_PASSWORD"])
        )
        client = connect(f"redis://{self.mesh.addr('RECMESH_REDIS_PORT')}/0", 4, auth)
        try:
            running: dict[str, float] = {}
            cumulative = []
            for _, part in await read_minutes(client):
                cumulative.append(dict(add(running, part)))
            return running, cumulative
        finally:
            await client.aclose()

    async def close(self) -> None:
        await self.ranker.close()
        await self.producer.stop()


def _metric(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """A sample's value in Prometheus text (prometheus_client's parser): 0 when absent."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items()):
                return float(sample.value)
    return 0.0


DERIVED = ("shuffled", "inverted", "copy")


def _experiment(args: Any, models: Path) -> Experiment:
    """The experiment the replay runs, in `models` (a copy: `--control` points its CURRENT)."""
    if args.control:
        if not (models / MODEL_NAME / args.control / "card.json").exists():
            raise SystemExit(f"--control {args.control}: no such model version in {args.model_dir}")
        point_current(models, args.control)
    current = current_model(models)
    if current is None:
        raise SystemExit(f"no current model in {args.model_dir}: train one (`recmesh train --events LOG`)")
    if args.candidate is None:
        if args.shadow:
            raise SystemExit("--shadow scores with a candidate model: name one (--candidate)")
        return new_experiment("level", args.share, level=args.level)
    if args.candidate == "offline-only":
        card = json.loads((current / "card.json").read_text())
        base = card.get("offline_only_version")
        if not base or not (models / MODEL_NAME / base / "card.json").exists():
            raise SystemExit(f"{current.name} names no offline-only baseline in {args.model_dir}: "
                             "train it again (`recmesh train` exports one beside every model)")  # fmt: skip
        return new_experiment("model", args.share, candidate=base, shadow=args.shadow)
    if args.candidate not in DERIVED:
        named = models / MODEL_NAME / args.candidate / "card.json"
        if args.candidate == current.name or not named.exists():
            kinds = ", ".join((*DERIVED, "offline-only"))
            raise SystemExit(f"--candidate {args.candidate}: not one of {kinds} nor a model version in "
                             f"{args.model_dir} other than the served one")  # fmt: skip
        return new_experiment("model", args.share, candidate=args.candidate, shadow=args.shadow)
    name = f"{current.name}-{args.candidate}"
    seed = 7 if args.candidate == "shuffled" else None
    derive_version(models, current.name, name, shuffle_seed=seed, invert=args.candidate == "inverted")
    return new_experiment("model", args.share, candidate=name, shadow=args.shadow)


@dataclass(frozen=True)
class Plan:
    past: list[Event]
    live: list[Event]
    visits: list[Visit]


def plan(args: Any, feature_set: FeatureSet) -> Plan:
    ev = feature_set.evaluation
    events = list(sorted_events(Path(args.events), feature_set.event_schema))
    split = events[int(len(events) * args.live_from)].event_time
    past = [e for e in events if e.event_time < split]
    live = [e for e in events if e.event_time >= split]
    last_request = events[-1].event_time - ev.window_ms - ev.lateness_ms
    before: dict[str, int] = {}
    for e in past:
        before[e.user_id] = e.event_time
    gap = int(args.visit_gap_h * HOUR_MS)
    return Plan(past, live, visits(live, last_request, gap, before, args.every))


async def drive(run: Replay, p: Plan, count: int) -> None:
    """The live period, an hour of event time at a time: the hour's visits are answered once
    every earlier event is applied, then the hour's events are sent."""
    live, pending, i = p.live, list(p.visits), 0
    while i < len(live):
        end = (live[i].event_time // HOUR_MS + 1) * HOUR_MS
        chunk = []
        while i < len(live) and live[i].event_time < end:
            chunk.append(live[i])
            i += 1
        now = [v for v in pending if v.at_ms < end]
        pending = pending[len(now) :]
        if now:
            await run.applied()
            await run.serve(now, count)
        await run.send(chunk)
    await run.applied()
    await run.producer.flush()


async def replay(args: Any) -> dict[str, Any]:
    plaintext_unless_set()
    repo = args.repository  # absolute (main)
    feature_set = load_feature_set(Path(repo))
    p = await asyncio.to_thread(plan, args, feature_set)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="recmesh-online-") as tmp:
        state = Path(tmp)
        models = state / "models"
        await asyncio.to_thread(shutil.copytree, args.model_dir, models)
        # The experiment starts with the live period, in the replay's time (the guard reads the
        # figures of the minutes of as-of time since it started).
        exp = replace(_experiment(args, models), started_ms=p.live[0].event_time)
        offline = _offline_aucs(models, exp)
        env = {"RECMESH_REPOSITORY": repo, "RECMESH_MODEL_DIR": str(models),
               "RECMESH_GUARD": "on" if args.guard else "off"}  # fmt: skip
        if args.blend is not None:
            env["RECMESH_RANKER_RECALL_BLEND"] = str(args.blend)
        async with started_mesh(state, env=env, demo_events=0) as mesh:
            run = Replay(mesh, state, feature_set)
            await run.producer.start()
            try:
                await run.send(p.past)
                await run.applied()
                write_experiment(models, exp)
                await asyncio.sleep(3.0)  # the inference service follows EXPERIMENT within 2 s
                await drive(run, p, args.count)
                attribution = await run.final()
                total, cumulative = await run.curves()
                decided = read_experiment(models)
            finally:
                await run.close()
    figures = report(args, exp, decided, total, cumulative, offline, p, started)
    return {**figures, "answers_served": run.answers, "attribution": attribution}


def _offline_auc(models: Path, version: str, level: int) -> float | None:
    """A version's holdout AUC at `level` from its card (None where the card has none:
    a derived version whose weights changed)."""
    card = json.loads((models / MODEL_NAME / version / "card.json").read_text())
    for v in card.get("variants", []):
        if v.get("level") == level:
            value = v.get("auc_holdout")
            return float(value) if value is not None else None
    return None


def _offline_aucs(models: Path, exp: Experiment) -> dict[str, float | None]:
    """Each arm's offline holdout AUC, by arm name."""
    current = current_model(models)
    if current is None:
        return {}
    if exp.kind == "level":
        return {impression.CONTROL: _offline_auc(models, current.name, 0),
                exp.arm_name: _offline_auc(models, current.name, exp.level)}  # fmt: skip
    candidate = _offline_auc(models, exp.candidate, 0)
    return {impression.CONTROL: _offline_auc(models, current.name, 0), exp.arm_name: candidate,
            **({SHADOW: candidate} if exp.shadow else {})}  # fmt: skip


def report(
    args: Any, exp: Experiment, decided: Experiment | None, total: dict[str, float],
    cumulative: list[dict[str, float]], offline: dict[str, float | None], p: Plan, started: float,
) -> dict[str, Any]:  # fmt: skip
    arms = {r.key[3]: r for r in rows(total, by=["arm"])}
    # Whom control is held against, per figure: the other arm; for the AUC the shadow
    # when there is one (the candidate's scores of the very answers control served).
    against = {"ctr": exp.arm_name, "auc": SHADOW if exp.shadow else exp.arm_name}
    figures: dict[str, Any] = {
        "answers": int(sum(r.answers for r in arms.values() if r.key[3] != SHADOW)),
        "visits": len(p.visits), "past_events": len(p.past), "live_events": len(p.live),
        "experiment": exp.describe(), "seconds": round(time.monotonic() - started, 1), "arms": {},
        "blend": args.blend,
    }  # fmt: skip
    # Each arm's rows by model version too: after a promotion, control is served the candidate.
    for row in rows(total, by=["arm", "model_version"]):
        name = (
            row.key[3] if row.key[3] == exp.arm_name and exp.kind == "level" else f"{row.key[3]} {row.key[0]}"
        )
        figures["arms"][name] = {"answers": row.answers, **{
            f: (None if (e := row.figure(f)) is None else e.to_json())
            for f in ("ctr", "hit", "ndcg", "auc")
        }}  # fmt: skip
    figures["offline_auc"] = offline
    for metric in ("ctr", "auc"):
        curve = []
        for sums in cumulative:
            by_arm = {r.key[3]: r for r in rows(sums, by=["arm"])}
            a, b = by_arm.get(impression.CONTROL), by_arm.get(against[metric])
            n = sum(r.answers for k, r in by_arm.items() if k != SHADOW)
            curve.append((n, a.figure(metric) if a else None, b.figure(metric) if b else None))
        figures[f"{metric}_separated_after_answers"] = separated_after(curve)
        figures[f"{metric}_against"] = against[metric]
        control, other = arms.get(impression.CONTROL), arms.get(against[metric])
        if control is not None and other is not None:
            c, o = control.figure(metric), other.figure(metric)
            figures[f"{metric}_control_ahead"] = None if c is None or o is None else c.mean > o.mean
    if decided is not None:
        figures["guard"] = {"state": decided.state, "reason": decided.reason,
                            "decided": decided.decided_ms is not None}  # fmt: skip
    return figures


def _cell(figure: dict[str, Any] | None) -> str:
    if figure is None:
        return " — "
    ci = "—" if figure["ci95"] is None else f"{figure['ci95']:.4f}"
    return f"{figure['mean']:.4f} ± {ci}"


def table(figures: dict[str, Any], k: int) -> str:
    lines = [
        f"recmesh bench online: {figures['experiment']}; {figures['past_events']:,} past events, "
        f"{figures['live_events']:,} live, {figures['visits']:,} visits answered in {figures['seconds']} s"
    ]
    offline = figures.get("offline_auc", {})
    heads = (f"CTR@{k}", f"hit@{k}", f"NDCG@{k}")
    lines.append(f"{'arm and model':<40}{'offline AUC':>12}{'answers':>9}  {heads[0]:<17}{heads[1]:<17}"
                 f"{heads[2]:<17}AUC (grouped)")  # fmt: skip
    for arm, f in figures["arms"].items():
        cells = [_cell(f[m]) for m in ("ctr", "hit", "ndcg")]
        auc = "—" if f["auc"] is None else f"{_cell(f['auc'])} (n={f['auc']['n']:,})"
        off = offline.get(arm.split(" ")[0])  # a level experiment's arms: one model, two levels
        lines.append(f"{arm:<40}{'—' if off is None else f'{off:.4f}':>12}{f['answers']:>9,}  "
                     f"{cells[0]:<17}{cells[1]:<17}{cells[2]:<17}{auc}")  # fmt: skip
    for metric in ("ctr", "auc"):
        ahead, after = (
            figures.get(f"{metric}_control_ahead"),
            figures.get(f"{metric}_separated_after_answers"),
        )
        if ahead is not None:
            where = f"separated for good after {after:,} answers" if after else "still overlap"
            whom = (
                "the shadow (the same answers)"
                if figures.get(f"{metric}_against") == SHADOW
                else "the other arm"
            )
            lines.append(f"{metric.upper()}: control {'ahead of' if ahead else 'behind'} {whom}; "
                         f"the 95% intervals {where}")  # fmt: skip
    a = figures.get("attribution")
    if a is not None:
        lines.append(f"attribution: {a['added']:.0f} of {figures['answers_served']:,} answers made final "
                     f"({a['expired']:.0f} expired, {a['pending']:.0f} pending, "
                     f"{a['invalid_impressions']:.0f} impressions unreadable)")  # fmt: skip
    if "guard" in figures:
        g = figures["guard"]
        lines.append(f"guard: {g['state']}" + (f": {g['reason']}" if g["reason"] else " (no decision)"))
    return "\n".join(lines)


def main(args: Any) -> int:
    args.repository = os.path.abspath(args.repository)  # the mesh runs in another directory
    figures = asyncio.run(replay(args))
    emit(figures, args.json, table(figures, args.count))
    return 0
