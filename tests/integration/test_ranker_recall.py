"""The full ranker over real gRPC, with real Redis: several recall sources
contribute, the seen items are filtered, the diversity cap holds.

Item vectors: until the embedding step's real title embeddings are on main, the
test writes vectors built from the demo catalog (one random direction per
category plus noise) with `save_item_vectors`; the ranker reads them the way it
reads the real ones, through a real faiss HNSW index.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import numpy as np

from recmesh.clients import RankerClient
from recmesh.demo.generate import CATEGORIES, make_catalog
from recmesh.events import Event
from recmesh.resilience import request_scope
from recmesh.settings import RankerSettings
from recmesh.vectors import save_item_vectors
from services.feature.recall_store import RecallStore
from services.ranker.pipeline import build_pipeline
from services.ranker.server import build_server as build_ranker
from tests.helpers import free_port
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
    await mesh.store.apply_events(events)
    await RecallStore(mesh.store.client).apply_covisitation(events)

    settings = RankerSettings(ranker_port=free_port(), model_dir=tmp_path, max_per_category=3)
    ranker = build_ranker(settings, build_pipeline(settings, mesh.feature_client, mesh.inference_client))
    await ranker.start()
    await ranker.set_serving()
    client = RankerClient(ranker.address, "test")
    try:
        with request_scope("B", 0.85):
            resp = await client.rank("u1998", 10, {}, now)
    finally:
        await client.close()
        await ranker.stop(0.1)

    assert resp.degraded == [] and resp.model_version.startswith("ctr-")
    counts = dict(resp.recall_counts)
    assert {k for k, v in counts.items() if v > 0} == {"popular", "covisit", "category", "semantic"}, counts
    assert 0.0 < resp.sigma <= 1.0, "a coherent tech intent gives the semantic source confidence"
    ids = [i.item_id for i in resp.items]
    assert len(ids) == 10 == len(set(ids))
    assert not set(ids) & set(tech[:3]), "items the user just saw are filtered"
    per_category = Counter(CATEGORY[i] for i in ids)
    assert max(per_category.values()) <= 3, per_category


async def test_without_vectors_the_semantic_source_is_absent(mesh: Mesh) -> None:
    with request_scope("B", 0.85):
        resp = await mesh.ranker_client.rank("u1998", 10, {}, 0)
    assert resp.sigma == 0.0
    assert dict(resp.recall_counts).get("semantic", 0) == 0
    assert dict(resp.recall_counts)["popular"] > 0 and dict(resp.recall_counts)["category"] > 0
