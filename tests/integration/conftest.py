"""In-process services on real sockets, against real Redis and a trained model."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from recmesh.clients.feature import FeatureClient
from recmesh.clients.inference import InferenceClient
from recmesh.clients.ranker import RankerClient
from recmesh.features.repository import FeatureSet
from recmesh.grpcserver import MeshServer
from recmesh.redis_client import connect
from recmesh.settings import FeatureSettings, InferenceSettings, RankerSettings
from recmesh.tools.demo.generate import make_catalog, offline_rows
from services.feature.catalog import load_catalog
from services.feature.server import build_server as build_feature
from services.feature.store import FeatureStore
from services.inference.model import ModelRegistry
from services.inference.server import build_server as build_inference
from services.ranker.pipeline import build_pipeline
from services.ranker.server import build_server as build_ranker
from tests.helpers import free_port


@dataclass
class Mesh:
    feature: MeshServer
    inference: MeshServer
    ranker: MeshServer
    feature_client: FeatureClient
    inference_client: InferenceClient
    ranker_client: RankerClient
    store: FeatureStore
    model_dir: Path


@pytest.fixture(scope="session")
async def mesh(redis_url: str, model_dir: Path, demo_feature_set: FeatureSet) -> AsyncIterator[Mesh]:
    redis = connect(redis_url, 16)
    store = FeatureStore(redis, demo_feature_set)
    await store.prepare()
    users, items = offline_rows(make_catalog())
    await load_catalog(redis, demo_feature_set, users, items)
    feature = build_feature(FeatureSettings(feature_port=free_port(), redis_url=redis_url), store)
    registry = ModelRegistry(model_dir, feature_set=demo_feature_set)
    registry.load_current()
    inference = build_inference(InferenceSettings(inference_port=free_port(), model_dir=model_dir), registry)
    fc = FeatureClient(feature.address, "ranker")
    ic = InferenceClient(inference.address, "ranker")
    ranker_settings = RankerSettings(ranker_port=free_port(), model_dir=model_dir)
    ranker = build_ranker(ranker_settings, build_pipeline(ranker_settings, fc, ic, demo_feature_set))
    servers = (feature, inference, ranker)
    for s in servers:
        await s.start()
        await s.set_serving()
    rc = RankerClient(ranker.address, "test")
    # As each service does after warming up (recmesh/service.py): the heap built so far
    # (the test session's, here) leaves the collector's view, so a full collection cannot
    # pause a request for ~100 ms mid-test (tight-budget tests saw it as a timeout).
    gc.collect()
    gc.freeze()
    yield Mesh(feature, inference, ranker, fc, ic, rc, store, model_dir)
    gc.unfreeze()
    for c in (fc, ic, rc):
        await c.close()
    for s in servers:
        await s.stop(0.5)
    await redis.aclose()
