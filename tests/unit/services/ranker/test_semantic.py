"""The ANN index (a real faiss HNSW index) over synthetic vectors.

The vectors here are built from the demo catalog's categories (one direction
per category plus noise), standing in for the text embeddings of item titles
that the embedding step writes; the index does not care where they come from.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import numpy as np

from recmesh.clients.inference import InferenceClient
from recmesh.features.repository import FeatureSet
from recmesh.vectors import save_item_vectors
from services.ranker.recall import RecallContext, SemanticSource, last_viewed
from services.ranker.semantic import IndexHolder
from tests.helpers import free_port


def _write(model_dir: Path, n_per_cat: int = 100, cats: int = 6, noise: float = 0.3, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(cats, 32))
    rows = [centres[c] + noise * rng.normal(size=32) for c in range(cats) for _ in range(n_per_cat)]
    ids = [f"c{c}-{n}" for c in range(cats) for n in range(n_per_cat)]
    save_item_vectors(model_dir, ids, np.asarray(rows, dtype=np.float32), {"model": "test-synthetic"})


def test_no_vectors_no_index(tmp_path: Path) -> None:
    holder = IndexHolder(tmp_path)
    assert holder.refresh() is False
    assert holder.index is None


def test_neighbours_of_an_intent_come_from_its_category(tmp_path: Path) -> None:
    _write(tmp_path)
    holder = IndexHolder(tmp_path)
    assert holder.refresh() is True
    index = holder.index
    assert index is not None and len(index) == 600
    intent = index.intent(["c2-0", "c2-1", "unknown-item"])
    assert intent is not None and 0.8 < intent.coherence <= 1.0
    hits = index.search(intent.vector, 50)
    assert len(hits) == 50
    assert sum(i.startswith("c2-") for i, _ in hits) >= 48
    sims = [s for _, s in hits]
    assert sims == sorted(sims, reverse=True)


def test_mixed_intent_is_less_coherent(tmp_path: Path) -> None:
    _write(tmp_path)
    holder = IndexHolder(tmp_path)
    holder.refresh()
    assert holder.index is not None
    mixed = holder.index.intent(["c0-0", "c1-0", "c2-0", "c3-0"])
    same = holder.index.intent(["c0-0", "c0-1", "c0-2", "c0-3"])
    assert mixed is not None and same is not None and mixed.coherence < same.coherence
    assert holder.index.intent(["nope"]) is None


def test_index_is_rebuilt_when_the_vectors_change(tmp_path: Path) -> None:
    _write(tmp_path, n_per_cat=10)
    holder = IndexHolder(tmp_path)
    holder.refresh()
    assert holder.refresh() is False, "unchanged on disk"
    _write(tmp_path, n_per_cat=20, seed=1)
    assert holder.refresh() is True
    assert holder.index is not None and len(holder.index) == 120


async def test_new_vectors_are_picked_up_in_the_background(tmp_path: Path) -> None:
    holder = IndexHolder(tmp_path, check_every_s=0.0)
    holder.refresh_in_background()
    assert holder.index is None
    _write(tmp_path, n_per_cat=10)
    holder.refresh_in_background()
    for _ in range(200):
        if holder.index is not None:
            break
        await asyncio.sleep(0.01)
    assert holder.index is not None and len(holder.index) == 60


async def test_a_query_is_not_embedded_when_inference_is_skipped(
    tmp_path: Path, demo_feature_set: FeatureSet
) -> None:
    """With inference presumed cold (x-recmesh-skip), semantic recall still
    answers from the viewed items and never calls Embed; otherwise it tries
    (here against a port nobody listens on, so the query is 'unavailable')."""
    _write(tmp_path)
    holder = IndexHolder(tmp_path)
    holder.refresh()
    client = InferenceClient(f"127.0.0.1:{free_port()}", "test")
    source = SemanticSource(holder, demo_feature_set.roles, client)
    user = {demo_feature_set.roles.recent_items or "": ["c2-0", "c2-1"]}
    context = {"query": "jazz quartet"}
    try:
        skipped = await source.fetch(
            RecallContext("u1", user, context, 20, 0.5, skip=frozenset({"inference"}))
        )
        assert skipped.attributes["query"] == "skipped: inference_cold"
        assert len(skipped.items) == 20 and client.breaker.failures == 0
        tried = await source.fetch(RecallContext("u1", user, context, 20, 0.5))
        assert str(tried.attributes["query"]).startswith("unavailable")
        assert client.breaker.failures == 1
    finally:
        await client.close()


def test_the_intent_reads_the_repositorys_recent_items_feature(demo_feature_set: FeatureSet) -> None:
    roles = demo_feature_set.roles
    assert roles.recent_items == "last_viewed_3"
    assert last_viewed(roles, {"last_viewed_3": ["i1", "i2"], "interest_tags": ["news"]}) == ["i1", "i2"]
    assert last_viewed(roles, {}) == []
    assert last_viewed(roles, {"last_viewed_3": "i1"}) == []  # not a list: no seeds
    undeclared = replace(roles, recent_items=None)
    assert last_viewed(undeclared, {"last_viewed_3": ["i1"]}) == []


async def test_without_recent_items_and_query_there_is_no_intent(
    tmp_path: Path, demo_feature_set: FeatureSet
) -> None:
    _write(tmp_path)
    holder = IndexHolder(tmp_path)
    holder.refresh()
    with_seeds = await SemanticSource(holder, demo_feature_set.roles).fetch(
        RecallContext("u1", {"last_viewed_3": ["c2-0"]}, {}, 10, 0.5)
    )
    assert len(with_seeds.items) == 10 and all(i.startswith("c2-") for i, _ in with_seeds.items[:5])
    undeclared = SemanticSource(holder, replace(demo_feature_set.roles, recent_items=None))
    none = await undeclared.fetch(RecallContext("u1", {"last_viewed_3": ["c2-0"]}, {}, 10, 0.5))
    assert none.items == [] and none.attributes["index"] == "no_intent"
