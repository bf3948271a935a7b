"""The three internal services over real gRPC sockets."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import REGISTRY

from recmesh.clients.base import open_channel
from recmesh.clients.inference import InferenceClient
from recmesh.clients.ranker import RankerClient
from recmesh.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument
from recmesh.events import Event
from recmesh.features.repository import FeatureSet
from recmesh.features.wire import table_columns, table_rows
from recmesh.resilience import request_scope
from recmesh.settings import RankerSettings
from recmesh.v1 import features_pb2, inference_pb2, inference_pb2_grpc
from services.ranker.pipeline import build_pipeline
from services.ranker.server import build_server as build_ranker
from tests.helpers import free_port, write_events
from tests.integration.conftest import Mesh


async def _schema(mesh: Mesh) -> tuple[str, list[str]]:
    info = await mesh.inference_client.model_info()
    return info.feature_version, list(info.feature_names)


async def test_health_and_reflection_are_standard(mesh: Mesh) -> None:
    channel = open_channel(mesh.feature.address)
    health = health_pb2_grpc.HealthStub(channel)
    resp = await health.Check(health_pb2.HealthCheckRequest(service="recmesh.v1.FeatureService"))
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    names: list[str] = []
    async for r in refl.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    ):
        names.extend(s.name for s in r.list_services_response.service)
    assert "recmesh.v1.FeatureService" in names and "grpc.health.v1.Health" in names
    await channel.close()


async def test_feature_lookup_over_grpc_sees_fresh_events(mesh: Mesh, demo_feature_set: FeatureSet) -> None:
    now = int(time.time() * 1000)
    await write_events(mesh.store, [
        Event(event_id="g1", user_id="u5", item_id="i3", behavior="click", event_time=now - 1000),
    ])  # fmt: skip
    resp = await mesh.feature_client.get_features("u5", ["i3", "i4"], now, cap_s=2.0)
    assert resp.feature_version == demo_feature_set.version
    assert resp.as_of_ms == now
    assert resp.user.features["clicks_5m"].number >= 1
    assert resp.user.features["clicks_5m"].age_ms == 1000
    # freshness 2^(-age/tau), tau 30 s for clicks_5m
    assert resp.user.features["clicks_5m"].freshness == pytest.approx(2 ** (-1 / 30))
    assert list(resp.items.entity_ids) == ["i3", "i4"]
    items = table_rows(resp.items)
    assert items["i3"]["clicks_10m"] == 1
    assert items["i4"]["category"] != "unknown"


async def test_bad_lookup_is_invalid_argument(mesh: Mesh) -> None:
    with pytest.raises(InvalidArgument, match="user_id is required"):
        await mesh.feature_client.get_features("", ["i1"], 0, cap_s=2.0)
    with pytest.raises(InvalidArgument, match="at most 500"):
        await mesh.feature_client.get_features("u1", [f"i{i}" for i in range(501)], 0, cap_s=2.0)


async def test_user_lookup_brings_the_covisitation_recall_along(mesh: Mesh) -> None:
    now = int(time.time() * 1000)
    events = [
        *(Event(event_id=f"rl-o{n}", user_id="u1990", item_id=f"i{40 + n}", behavior="view",
                event_time=now - 60_000 + n * 1000) for n in range(4)),
        Event(event_id="rl-u", user_id="u1991", item_id="i40", behavior="view", event_time=now - 5000),
    ]  # fmt: skip
    await write_events(mesh.store, events)

    resp = await mesh.feature_client.get_features("u1991", [], now, cap_s=2.0, related_limit=5)
    assert resp.related_included and list(resp.user.features["last_viewed_3"].strings.values) == ["i40"]
    direct = await mesh.feature_client.related(["i40"], 5, per_item=5, cap_s=2.0)
    assert [(i.item_id, i.score) for i in resp.related] == direct and direct, "the same read as GetRelated"

    no_views = await mesh.feature_client.get_features("u1992", [], now, cap_s=2.0, related_limit=5)
    assert no_views.related_included and not no_views.related, "no seeds: an empty answer, not a missing one"
    not_asked = await mesh.feature_client.get_features("u1991", [], now, cap_s=2.0)
    assert not not_asked.related_included and not not_asked.related
    get = mesh.feature_client.get_features
    with pytest.raises(InvalidArgument, match=r"related_limit must be in 1\.\.1000"):
        await get("u1991", [], now, cap_s=2.0, related_limit=-1)
    with pytest.raises(InvalidArgument, match=r"related_per_item must be in 0\.\.1000"):
        await get("u1991", [], now, cap_s=2.0, related_limit=5, related_per_item=5000)


async def test_an_items_only_lookup_skips_the_user_and_keeps_the_items(mesh: Mesh) -> None:
    now = int(time.time() * 1000)
    full = await mesh.feature_client.get_features("u1991", ["i40", "i41"], now, cap_s=2.0)
    items = await mesh.feature_client.get_features("u1991", ["i40", "i41"], now, cap_s=2.0, items_only=True)
    assert full.user.features and not items.user.features
    assert table_rows(items.items) == table_rows(full.items)
    with pytest.raises(InvalidArgument, match="items_only skips them"):
        await mesh.feature_client.get_features("u1991", [], now, cap_s=2.0, related_limit=5, items_only=True)


async def test_score_checks_the_schema(mesh: Mesh) -> None:
    version, columns = await _schema(mesh)
    ok = await mesh.inference_client.score(version, columns, [0.0] * len(columns) * 3)
    assert len(ok.scores) == 3 and ok.model_version.startswith("ctr-")
    with pytest.raises(FailedPrecondition, match="feature set 'fs-v0'"):
        await mesh.inference_client.score("fs-v0", columns, [0.0] * len(columns))
    with pytest.raises(FailedPrecondition, match="missing"):
        await mesh.inference_client.score(version, columns[:-1], [0.0] * (len(columns) - 1))
    with pytest.raises(InvalidArgument, match="not a multiple"):
        await mesh.inference_client.score(version, columns, [0.0] * 5)
    table = features_pb2.FeatureTable(entity_ids=["i1"])
    with pytest.raises(FailedPrecondition, match="feature set 'fs-v0'"):
        await mesh.inference_client.score_features("fs-v0", features_pb2.FeatureRow(entity_id="u1"), table)


async def test_score_builds_the_inputs_from_served_features(mesh: Mesh, demo_feature_set: FeatureSet) -> None:
    """Scoring served features is scoring the rows the model card's transforms make of them."""
    from recmesh.features.vectorize import Vectorizer, transforms_from_card
    from recmesh.features.wire import row_values, table_columns

    now = int(time.time() * 1000)
    items = ["i3", "i4", "i5"]
    served = await mesh.feature_client.get_features("u5", items, now, cap_s=2.0)
    by_features = await mesh.inference_client.score_features(
        demo_feature_set.version, served.user, served.items
    )
    card = mesh_card(mesh)
    vec = Vectorizer(transforms_from_card(card["input"]["transforms"]))
    rows = vec.matrix([row_values(served.user)], table_columns(served.items), items, ["u5"])
    by_rows = await mesh.inference_client.score(
        demo_feature_set.version, list(card["input"]["columns"]), rows
    )
    assert len(by_features.scores) == 3 and by_features.scores == by_rows.scores
    # Features the request lacks take their declared defaults: no columns at all still scores.
    bare = await mesh.inference_client.score_features(
        demo_feature_set.version,
        features_pb2.FeatureRow(entity_id="u5"),
        features_pb2.FeatureTable(entity_ids=items),
    )
    assert len(bare.scores) == 3


async def test_the_packed_block_serves_and_scores_as_the_message_form(
    mesh: Mesh, demo_feature_set: FeatureSet
) -> None:
    """GetFeatures' item block holds the table's values, scores the same over real
    gRPC, and a block of another feature-set version is refused by name."""
    from recmesh.features.block import BlockView

    now = int(time.time() * 1000)
    items = ["i3", "i4", "i5", "i6"]
    table = await mesh.feature_client.get_features("u5", items, now, cap_s=2.0)
    packed = await mesh.feature_client.get_features("u5", items, now, cap_s=2.0, item_block=True)
    assert not packed.items.entity_ids and list(packed.item_block.entity_ids) == items
    view = BlockView(packed.item_block, demo_feature_set.version)
    for name, values in table_columns(table.items, demo_feature_set).items():
        assert view.column(name) == values, name
    by_table = await mesh.inference_client.score_features(demo_feature_set.version, table.user, table.items)
    by_block = await mesh.inference_client.score_features(
        demo_feature_set.version, packed.user, packed.item_block
    )
    assert by_block.scores == by_table.scores and len(by_block.scores) == 4
    other = features_pb2.ItemBlock()
    other.CopyFrom(packed.item_block)
    other.layout = "fs-0123456789ab/items.v1"
    with pytest.raises(FailedPrecondition, match=r"layout 'fs-0123456789ab/items.v1' is not this model's"):
        await mesh.inference_client.score_features(demo_feature_set.version, packed.user, other)
    async with open_channel(mesh.inference.address) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        both = inference_pb2.ScoreRequest(feature_version=demo_feature_set.version, items=table.items,
                                          item_block=packed.item_block)  # fmt: skip
        with pytest.raises(grpc.aio.AioRpcError, match="items or item_block, not both") as err:
            await stub.Score(both, timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def mesh_card(mesh: Mesh) -> dict[str, Any]:
    import json

    from recmesh.modeldir import current_model

    path = current_model(mesh.model_dir)
    assert path is not None
    card: dict[str, Any] = json.loads((path / "card.json").read_text())
    return card


async def test_score_takes_the_matrix_as_raw_float32_bytes(mesh: Mesh) -> None:
    version, columns = await _schema(mesh)
    x = np.random.default_rng(3).random((7, len(columns)), dtype=np.float32)
    as_list = await mesh.inference_client.score(version, columns, x.ravel().tolist())
    as_bytes = await mesh.inference_client.score(version, columns, x)
    assert len(as_bytes.scores) == 7 and as_bytes.scores == as_list.scores
    async with open_channel(mesh.inference.address) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        bad = {
            "not both": inference_pb2.ScoreRequest(values=[0.0] * len(columns), values_f32=x[0].tobytes()),
            "multiple of 4": inference_pb2.ScoreRequest(values_f32=x.tobytes()[:-1]),
        }
        for message, req in bad.items():
            req.feature_version = version
            req.feature_names.extend(columns)
            with pytest.raises(grpc.aio.AioRpcError, match=message) as err:
                await stub.Score(req, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_rank_returns_scored_items_in_order(mesh: Mesh) -> None:
    # The first request of fresh processes pays one-time costs (script loads, empty
    # item caches) and may step down the ladder on a busy machine; the order of a
    # full ranking is what this test checks, so it looks at the second.
    for _ in range(2):
        with request_scope("A", 1.0):
            resp = await mesh.ranker_client.rank("u42", 10, {}, int(time.time() * 1000))
    assert len(resp.items) == 10
    scores = [i.score for i in resp.items]
    assert scores == sorted(scores, reverse=True)
    assert len({i.item_id for i in resp.items}) == 10
    assert resp.model_version.startswith("ctr-") and resp.degraded == []


async def test_rank_falls_back_to_recall_order_when_inference_is_down(mesh: Mesh, tmp_path: Path) -> None:
    dead = InferenceClient(f"127.0.0.1:{free_port()}", "ranker")
    settings = RankerSettings(ranker_port=free_port(), model_dir=tmp_path)
    ranker = build_ranker(
        settings, build_pipeline(settings, mesh.feature_client, dead, mesh.store.feature_set)
    )
    await ranker.start()
    await ranker.set_serving()
    client = RankerClient(ranker.address, "test")
    try:
        with request_scope("A", 1.0):
            resp = await client.rank("u42", 5, {}, 0)
        # Exactly one scoring flag; a recall source that ran late on a busy box
        # may add its own flag, which is not what this test is about.
        assert [d for d in resp.degraded if "scor" in d or "inference" in d] == ["scoring_unavailable"], (
            resp.degraded
        )
        assert resp.model_version == "recall"
        assert len({i.item_id for i in resp.items}) == 5
        # Recall order: fused scores, best first.
        scores = [i.score for i in resp.items]
        assert scores == sorted(scores, reverse=True) and scores[0] > 0
    finally:
        await client.close()
        await dead.close()
        await ranker.stop(0.1)


async def test_expired_budget_is_refused_before_the_call(mesh: Mesh) -> None:
    with request_scope("A", 0.001), pytest.raises(DeadlineExceeded):
        await mesh.ranker_client.rank("u42", 5, {}, 0)


def _served_at_level_1() -> float:
    """Score requests the in-process inference service answered with its level-1 variant."""
    return (
        REGISTRY.get_sample_value("recmesh_inference_served_total", {"requested": "1", "served": "1"}) or 0.0
    )


async def test_tight_budget_steps_down_the_ladder(mesh: Mesh) -> None:
    before = _served_at_level_1()
    with request_scope("A", 0.07):  # under 30% of class A's 300 ms: sample features
        sampled = await mesh.ranker_client.rank("u42", 5, {}, 0)
    assert "ladder:L1_feature_sampling" in sampled.degraded
    assert sampled.model_version.startswith("ctr-") and len(sampled.items) == 5
    assert _served_at_level_1() == before + 1, "the ranker asked inference for the level-1 variant"
    with request_scope("A", 0.018):  # ~12 ms left after the hop margin: recall order only
        skipped = await mesh.ranker_client.rank("u42", 5, {}, 0)
    assert "ladder:L4_skip_fine_ranking" in skipped.degraded
    assert "skipped:score" in skipped.degraded and "skipped:covisit" in skipped.degraded
    assert skipped.model_version == "recall"
    scores = [i.score for i in skipped.items]
    assert len(scores) == 5 and scores == sorted(scores, reverse=True)


async def test_the_ranker_steps_down_the_ladder_under_its_own_load(mesh: Mesh, tmp_path: Path) -> None:
    settings = RankerSettings(ranker_port=free_port(), model_dir=tmp_path, capacity=2)
    pipeline = build_pipeline(settings, mesh.feature_client, mesh.inference_client, mesh.store.feature_set)
    with request_scope("C", 10.0):  # a long budget: only the load moves the ladder
        alone = await pipeline.rank("u5", 5, 0)
        together = await asyncio.gather(*(pipeline.rank(f"u{i}", 5, 0) for i in range(2)))
    assert not any(d.startswith("ladder:") for d in alone.degraded), alone.degraded
    # Two in flight on a capacity of 2: load 1.0, the cheapest model variant.
    assert all(r.degraded[0] == "ladder:L3_no_cross_features" for r in together), [
        r.degraded for r in together
    ]
    assert pipeline.in_flight == 0
