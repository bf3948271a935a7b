"""The full ranker over real gRPC, with real Redis: several recall sources
contribute, the seen items are filtered, the diversity cap holds.

Item vectors: until the embedding step's real title embeddings are on main, the
test writes vectors built from the demo catalog (one random direction per
category plus noise) with `save_item_vectors`; the ranker reads them the way it
reads the real ones, through a real faiss HNSW index.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
from prometheus_client import REGISTRY

from recmesh.clients.feature import FeatureClient
from recmesh.clients.inference import InferenceClient
from recmesh.clients.ranker import RankerClient
from recmesh.embedding.encoder import TextEncoder
from recmesh.events import Event
from recmesh.resilience import request_scope
from recmesh.settings import InferenceSettings, RankerSettings
from recmesh.tools.demo.generate import CATEGORIES, make_catalog
from recmesh.tools.demo.texts import embedding_text, item_texts
from recmesh.vectors import save_item_vectors
from services.inference.model import ModelRegistry
from services.inference.server import build_server as build_inference
from services.inference.textmodels import OnnxEmbedder, TextModels
from services.ranker.pipeline import build_pipeline
from services.ranker.recall import CovisitSource, RecallContext
from services.ranker.server import build_server as build_ranker
from tests.helpers import free_port, write_events
from tests.integration.conftest import Mesh

CATALOG = make_catalog()
CATEGORY = {i["item_id"]: i["category"] for i in CATALOG.items}


def _write_category_vectors(model_dir: Path) -> None:
    rng = np.random.default_rng(3)
    centres = {c: rng.normal(size=32) for c in CATEGORIES}
    rows = np.stack([centres[i["category"]] + 0.35 * rng.normal(size=32) for i in CATALOG.items])
    save_item_vectors(model_dir, CATALOG.item_ids, rows.astype(np.float32), {"model": "test-category-dirs"})


async def test_rank_fuses_several_sources_and_caps_categories(mesh: Mesh, tmp_path: Path) -> None:
    _write_category_vectors(tmp_path)
    tech = [i for i in CATALOG.item_ids if CATEGORY[i] == "tech"][:6]
    now = int(time.time() * 1000)
    events = [
        # Another user co-visits the tech items: co-visitation neighbours.
        *(Event(event_id=f"rr-o{n}", user_id="u1999", item_id=iid, behavior="view",
                event_time=now - 60_000 + n * 1000) for n, iid in enumerate(tech)),
        # Our user viewed and clicked three of them minutes ago.
        *(Event(event_id=f"rr-u{n}", user_id="u1998", item_id=iid, behavior="click",
                event_time=now - 30_000 + n * 1000) for n, iid in enumerate(tech[:3])),
    ]  # fmt: skip
    await write_events(mesh.store, events)

    settings = RankerSettings(ranker_port=free_port(), model_dir=tmp_path, max_per_category=3)
    features = FeatureClient(mesh.feature.address, "ranker-recall-test")  # its own metric labels
    ranker = build_ranker(
        settings, build_pipeline(settings, features, mesh.inference_client, mesh.store.feature_set)
    )
    await ranker.start()
    await ranker.set_serving()
    client = RankerClient(ranker.address, "test")
    try:
        with request_scope("B", 0.85):
            resp = await client.rank("u1998", 10, {}, now)
    finally:
        await client.close()
        await ranker.stop(0.1)
        await features.close()

    def calls(method: str) -> float:
        labels = {"service": "ranker-recall-test", "target": "feature", "method": method,
                  "slo_class": "B", "code": "OK"}  # fmt: skip
        return REGISTRY.get_sample_value("recmesh_downstream_duration_seconds_count", labels) or 0.0

    # The user look-up brought the co-visitation recall along: no GetRelated hop.
    assert calls("GetFeatures") == 2 and calls("GetRelated") == 0

    assert resp.degraded == [] and resp.model_version.startswith("ctr-")
    counts = dict(resp.recall_counts)
    assert {k for k, v in counts.items() if v > 0} == {"popular", "covisit", "category", "semantic"}, counts
    assert 0.0 < resp.sigma <= 1.0, "a coherent tech intent gives the semantic source confidence"
    ids = [i.item_id for i in resp.items]
    assert len(ids) == 10 == len(set(ids))
    assert not set(ids) & set(tech[:3]), "items the user just saw are filtered"
    per_category = Counter(CATEGORY[i] for i in ids)
    assert max(per_category.values()) <= 3, per_category


async def test_covisit_source_calls_get_related_only_without_the_users_answer(mesh: Mesh) -> None:
    now = int(time.time() * 1000)
    tech = [i for i in CATALOG.item_ids if CATEGORY[i] == "tech"][6:9]
    events = [Event(event_id=f"cs-{n}", user_id="u1997", item_id=iid, behavior="view",
                    event_time=now - 20_000 + n * 1000) for n, iid in enumerate(tech)]  # fmt: skip
    await write_events(mesh.store, events)
    source = CovisitSource(mesh.feature_client, mesh.store.feature_set.roles)
    user = {"last_viewed_3": [tech[0]]}
    called = await source.fetch(RecallContext("u1997", user, {}, 5, 2.0))
    assert called.items and called.attributes == {"seeds": 1, "with_user": 0}, "no answer along: GetRelated"
    brought = [("x1", 3.0), ("x2", 1.0)]
    along = await source.fetch(RecallContext("u1997", user, {}, 1, 2.0, related=brought))
    assert along.items == brought[:1] and along.attributes == {"seeds": 1, "with_user": 1}


async def test_without_vectors_the_semantic_source_is_absent(mesh: Mesh) -> None:
    with request_scope("B", 0.85):
        resp = await mesh.ranker_client.rank("u1998", 10, {}, 0)
    assert resp.sigma == 0.0
    assert dict(resp.recall_counts).get("semantic", 0) == 0
    assert dict(resp.recall_counts)["popular"] > 0 and dict(resp.recall_counts)["category"] > 0


CUSTOM_GRAPH = """
description = "popularity and category affinity only; scoring is dropped from ladder level 1"
[[node]]
name = "me"
kind = "user_features"
resource = "io"
budget_share = 0.1
skippable = true
[[node]]
name = "popular"
kind = "recall.popular"
budget_share = 0.2
[[node]]
name = "category"
kind = "recall.category"
budget_share = 0.2
skippable = true
inputs = ["me"]
[[node]]
name = "fuse"
kind = "fuse"
budget_share = 0.05
inputs = ["popular", "category"]
[[node]]
name = "features"
kind = "item_features"
budget_share = 0.3
skippable = true
inputs = ["fuse", "me"]
[[node]]
name = "score"
kind = "score"
resource = "gpu"
budget_share = 0.3
skippable = true
skip_at_level = 1
inputs = ["features"]
"""


async def test_a_graph_from_a_file_changes_the_pipeline_without_code(mesh: Mesh, tmp_path: Path) -> None:
    path = tmp_path / "graph.toml"
    path.write_text(CUSTOM_GRAPH)
    settings = RankerSettings(ranker_port=free_port(), model_dir=tmp_path, pipeline_graph=path)
    ranker = build_ranker(
        settings, build_pipeline(settings, mesh.feature_client, mesh.inference_client, mesh.store.feature_set)
    )
    await ranker.start()
    await ranker.set_serving()
    client = RankerClient(ranker.address, "test")
    try:
        with request_scope("A", 0.3):
            full = await client.rank("u1998", 10, {}, 0)
        with request_scope("A", 0.07):  # under 30% of class A's budget: ladder level 1
            tight = await client.rank("u1998", 10, {}, 0)
    finally:
        await client.close()
        await ranker.stop(0.1)
    assert set(full.recall_counts) == {"popular", "category"}
    assert full.model_version.startswith("ctr-") and full.degraded == []
    assert "ladder:L1_feature_sampling" in tight.degraded and "skipped:score" in tight.degraded
    assert tight.model_version == "recall" and len(tight.items) == 10


async def test_a_bad_graph_stops_the_ranker_at_start(tmp_path: Path) -> None:
    path = tmp_path / "graph.toml"
    path.write_text(CUSTOM_GRAPH.replace('inputs = ["popular", "category"]', 'inputs = ["popular", "nope"]'))
    env = dict(os.environ, RECMESH_RANKER_PIPELINE=str(path), RANKER_PORT=str(free_port()),
               RANKER_METRICS_PORT=str(free_port()), RECMESH_MODEL_DIR=str(tmp_path))  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.ranker", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 1
    message = err.decode()
    assert "bad ranking graph" in message and "node 'fuse' reads nope, which no node produces" in message


async def test_the_request_query_steers_semantic_recall(
    mesh: Mesh, model_dir: Path, embed_model_dir: Path, tmp_path: Path
) -> None:
    """Real MiniLM vectors of 120 items' texts; the query is embedded by the inference service."""
    texts = item_texts(CATALOG)
    chosen = [i for i in CATALOG.item_ids if CATEGORY[i] in ("food", "tech")][:120]
    encoder = TextEncoder.from_model_dir(embed_model_dir)
    matrix = encoder.encode([embedding_text(*texts[i]) for i in chosen])
    save_item_vectors(tmp_path, chosen, matrix, {"model": encoder.model})
    registry = ModelRegistry(model_dir)
    registry.load_current()
    inference = build_inference(
        InferenceSettings(inference_port=free_port(), model_dir=model_dir, batching=False), registry,
        text=TextModels(embedder=OnnxEmbedder(encoder)),
    )  # fmt: skip
    await inference.start()
    await inference.set_serving()
    ic = InferenceClient(inference.address, "ranker")
    settings = RankerSettings(ranker_port=free_port(), model_dir=tmp_path)
    ranker = build_ranker(settings, build_pipeline(settings, mesh.feature_client, ic, mesh.store.feature_set))
    await ranker.start()
    await ranker.set_serving()
    client = RankerClient(ranker.address, "test")
    query = embedding_text(*texts[chosen[0]])
    try:
        with request_scope("C", 3.0):  # the embed lane is a low-priority thread: give it time
            plain = await client.rank("u1777", 10, {}, 0)
            steered = await client.rank("u1777", 10, {"query": query}, 0)
    finally:
        await client.close()
        await ranker.stop(0.1)
        await ic.close()
        await inference.stop(0.1)
    assert dict(plain.recall_counts).get("semantic", 0) == 0, "no recent views and no query: no intent"
    assert dict(steered.recall_counts)["semantic"] > 0 and steered.sigma > 0.0


async def test_a_teams_own_table_and_vectors_are_served_as_recall_sources(
    mesh: Mesh, tmp_path: Path, capsys: object
) -> None:
    """Bring your own candidates: a similar-items table and item/user vectors made
    here, imported with the CLI as recall versions, mapped by a real ranker; the
    table seeded by the user's history (written by the one event write path,
    read in the user look-up), the vectors searched with the user's vector:
    their items come back with recall_counts naming the sources."""
    import json as _json

    from recmesh.tools.cli.main import main as cli_main

    feature_set = mesh.store.feature_set
    music = [i for i in CATALOG.item_ids if CATEGORY[i] == CATALOG.items[0]["category"]][:3]
    picks = [i for i in CATALOG.item_ids if i not in music][-5:]  # items nothing else would propose
    table = tmp_path / "similar.jsonl"
    table.write_text("\n".join(_json.dumps({"item_id": m, "similar_id": p, "score": 1.0 - n / 10})
                               for m in music for n, p in enumerate(picks)) + "\n")  # fmt: skip
    where = ["--model-dir", str(tmp_path), "--repository", str(feature_set.path)]
    assert cli_main(["recall", "import", "--similar", str(table), *where]) == 0
    # ... and a two-tower model's vectors: the user's points at items nothing else proposes
    towards = [i for i in CATALOG.item_ids if i not in music and i not in picks][:4]
    items, users = tmp_path / "items.jsonl", tmp_path / "users.jsonl"
    vec = {i: [1.0, 0.0] if i in towards else [0.0, 0.1] for i in CATALOG.item_ids}
    items.write_text("\n".join(_json.dumps({"item_id": i, "vector": v}) for i, v in vec.items()) + "\n")
    users.write_text(_json.dumps({"user_id": "u1996", "vector": [1.0, 0.0]}) + "\n")
    assert (
        cli_main(["recall", "import", "--item-vectors", str(items), "--user-vectors", str(users), *where])
        == 0
    )
    now = int(time.time() * 1000)
    behavior = sorted(feature_set.roles.learnt_behaviors)[0]
    events = [Event(event_id=f"byo-{n}", user_id="u1996", item_id=iid, behavior=behavior,
                    event_time=now - 10_000 + n) for n, iid in enumerate(music)]  # fmt: skip
    await write_events(mesh.store, events)
    settings = RankerSettings(ranker_port=free_port(), model_dir=tmp_path, max_per_category=0)
    ranker = build_ranker(
        settings, build_pipeline(settings, mesh.feature_client, mesh.inference_client, feature_set)
    )
    await ranker.start()
    await ranker.set_serving()
    client = RankerClient(ranker.address, "test")
    try:
        with request_scope("B", 0.85):
            resp = await client.rank("u1996", 50, {}, now)
    finally:
        await client.close()
        await ranker.stop(0.1)
    counts = dict(resp.recall_counts)
    assert counts.get("similar") == len(picks) and counts.get("vectors", 0) >= len(towards), counts
    ids = [i.item_id for i in resp.items]
    assert set(picks) <= set(ids), "the table's items are recalled and scored"
    assert set(towards) <= set(ids), "the user vector's nearest items are recalled and scored"
    assert not [d for d in resp.degraded if "similar" in d or "vectors" in d], resp.degraded
