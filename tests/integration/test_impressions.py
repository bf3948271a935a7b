"""The impression log end to end: answered recommendations over REST and gRPC go
to a real Tansu topic with their request id, items in position order, model and
degradation level; the app gets the id in the answer and may send it back on
events, which reach the events topic with it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import httpx
import orjson
from aiokafka import AIOKafkaProducer

from recmesh.clients.feature import FeatureClient
from recmesh.clients.ranker import RankerClient
from recmesh.features.served import dump_topic
from recmesh.settings import GatewaySettings
from recmesh.topics import ensure_topics
from recmesh.v1 import recommender_pb2, recommender_pb2_grpc
from services.gateway.app import GatewayDeps, create_app
from services.gateway.edge import ClassPolicy, Edge
from services.gateway.event_publisher import EventPublisher
from services.gateway.grpc_api import build_grpc_server
from services.gateway.impressions import ImpressionLog
from services.gateway.recommend import Recommender
from tests.helpers import free_port
from tests.integration.conftest import Mesh


async def test_every_answer_is_an_impression_and_events_carry_its_id_back(
    mesh: Mesh, kafka_bootstrap: str, topics: dict[str, str], tmp_path: Path
) -> None:
    impressions_topic = f"imp-{topics['events']}"
    await ensure_topics(kafka_bootstrap, {impressions_topic: 1})
    log = ImpressionLog(lambda: AIOKafkaProducer(bootstrap_servers=kafka_bootstrap), impressions_topic, 1.0)
    stop = asyncio.Event()
    log_task = asyncio.create_task(log.run(stop))
    ranker = RankerClient(mesh.ranker.address, "gateway")
    features = FeatureClient(mesh.feature.address, "gateway")
    recommender = Recommender(ranker, features, max_count=100, on_answer=log.offer)
    settings = GatewaySettings(gateway_grpc_port=free_port())
    policy = ClassPolicy.from_settings(settings)
    publisher = EventPublisher(kafka_bootstrap, topics["events"], 5.0)
    app = create_app(settings, GatewayDeps(recommender, policy, publisher, {}))
    grpc_server = build_grpc_server(settings, recommender, Edge(policy, None))
    await grpc_server.start()
    await grpc_server.set_serving()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            rest = await http.post(
                "/v1/recommend", json={"user_id": "u7", "count": 4}, headers={"x-slo-class": "B"}
            )
            assert rest.status_code == 200, rest.text
            rest_id = rest.json()["request_id"]
            assert len(rest_id) == 32 and rest.headers["x-request-id"] == rest_id
            shown = rest.json()["items"][0]["item_id"]
            click = {"event_id": "imp-c1", "user_id": "u7", "item_id": shown, "behavior": "click",
                     "event_time": 1_767_225_600_000, "request_id": rest_id}  # fmt: skip
            posted = await http.post("/v1/events", json={"events": [click]})
            assert posted.status_code == 202, posted.text
            bad = await http.post("/v1/events", json={"events": [{**click, "request_id": ""}]})
            assert bad.status_code == 400 and "request_id" in bad.json()["detail"]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_server.port}") as channel:
            call = recommender_pb2_grpc.RecommenderStub(channel).Recommend(
                recommender_pb2.RecommendRequest(user_id="u8", count=3)
            )
            answer = await call
            grpc_id = dict(await call.initial_metadata())["x-request-id"]
            assert answer.request_id == grpc_id and grpc_id != rest_id
    finally:
        await grpc_server.stop(0.5)
        stop.set()
        await asyncio.wait_for(log_task, 15)
        await publisher.stop()
        await ranker.close()
        await features.close()
    assert log.sent == 2 and log.dropped == 0

    await _check_topics(kafka_bootstrap, impressions_topic, topics["events"], tmp_path, rest, grpc_id)


async def _check_topics(
    bootstrap: str, impressions_topic: str, events_topic: str, tmp_path: Path, rest: httpx.Response,
    grpc_id: str,
) -> None:  # fmt: skip
    """The two impressions as logged, and the click on the events topic with its request id."""
    rest_id = rest.json()["request_id"]
    dumped = tmp_path / "impressions.jsonl"
    assert (await dump_topic(bootstrap, impressions_topic, dumped, timeout_s=20)).written == 2
    records = {r["request_id"]: r for r in map(orjson.loads, dumped.read_bytes().splitlines())}
    rest_imp, grpc_imp = records[rest_id], records[grpc_id]
    assert rest_imp["user_id"] == "u7" and rest_imp["slo_class"] == "B" and rest_imp["arm"] == "control"
    assert [i["position"] for i in rest_imp["items"]] == [1, 2, 3, 4]
    assert [i["item_id"] for i in rest_imp["items"]] == [i["item_id"] for i in rest.json()["items"]]
    assert rest_imp["model_version"] == rest.json()["model_version"] and rest_imp["ladder"] == "full"
    assert rest_imp["as_of_ms"] > 0 and rest_imp["served_at_ms"] >= rest_imp["as_of_ms"] - 1000
    assert grpc_imp["user_id"] == "u8" and len(grpc_imp["items"]) == 3

    events = tmp_path / "events.jsonl"
    assert (await dump_topic(bootstrap, events_topic, events, timeout_s=20)).written == 1
    assert orjson.loads(events.read_bytes())["request_id"] == rest_id, "the click names what it followed"
