"""Slow and dead downstreams behind real servers on real sockets: class A still
answers inside its budget with the degradation flagged, nothing answers 5xx,
and the caller's circuit breaker opens so later requests stop waiting."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from prometheus_client import generate_latest

from recmesh.clients.feature import FeatureClient
from recmesh.clients.inference import InferenceClient
from recmesh.clients.ranker import RankerClient
from recmesh.features.repository import DEMO_REPOSITORY, load_feature_set
from recmesh.resilience import BreakerState
from recmesh.settings import FeatureSettings, GatewaySettings, RankerSettings
from services.feature.server import build_server as build_feature
from services.gateway.app import GatewayDeps, create_app
from services.gateway.edge import ClassPolicy
from services.gateway.event_publisher import EventPublisher
from services.gateway.recommend import Recommender
from services.ranker.pipeline import build_pipeline
from services.ranker.server import build_server as build_ranker
from tests.helpers import free_port
from tests.integration.conftest import Mesh

A_KEY = {"x-api-key": "k-a", "x-slo-class": "A"}
A_BUDGET_S = 0.3


class DelayingProxy:
    """A TCP proxy that holds every chunk from the server for `delay_s` before
    passing it on: the server behind it is real, only slower to answer."""

    def __init__(self, upstream: str, delay_s: float) -> None:
        self._host, port = upstream.rsplit(":", 1)
        self._port = int(port)
        self.delay_s = delay_s
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.address = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, delayed: bool) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while chunk := await src.read(65536):
                if delayed and self.delay_s:
                    await asyncio.sleep(self.delay_s)
                dst.write(chunk)
                await dst.drain()
        dst.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self._host, self._port)
        for task in (
            asyncio.create_task(self._pipe(reader, up_writer, delayed=False)),
            asyncio.create_task(self._pipe(up_reader, writer, delayed=True)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


# A model directory without item vectors: the semantic source is absent.
NO_VECTORS = Path(tempfile.gettempdir()) / "recmesh-tests-no-item-vectors"


def state(client: InferenceClient | FeatureClient) -> BreakerState:
    return client.breaker.state


def _gateway(recommender: Recommender) -> httpx.AsyncClient:
    settings = GatewaySettings.model_validate(
        {"RECMESH_API_KEYS": {"k-a": {"tenant": "app", "max_class": "A"}}}
    )
    publisher = EventPublisher(f"127.0.0.1:{free_port()}", "unused", 0.1)
    app = create_app(settings, GatewayDeps(recommender, ClassPolicy.from_settings(settings), publisher, {}))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=5)


@contextlib.asynccontextmanager
async def ranker_behind(fc: FeatureClient, ic: InferenceClient) -> AsyncIterator[Recommender]:
    settings = RankerSettings(ranker_port=free_port(), model_dir=NO_VECTORS)
    ranker = build_ranker(settings, build_pipeline(settings, fc, ic, load_feature_set(DEMO_REPOSITORY)))
    await ranker.start()
    await ranker.set_serving()
    rc = RankerClient(ranker.address, "gateway")
    gw_features = FeatureClient(fc.address, "gateway")
    recommender = Recommender(rc, gw_features, 100)
    await recommender.refresh_popular()
    try:
        yield recommender
    finally:
        for c in (rc, gw_features, fc, ic):
            await c.close()
        await ranker.stop(0.1)


async def test_slow_inference_class_a_answers_in_budget_flagged_then_breaker_opens(mesh: Mesh) -> None:
    proxy = DelayingProxy(mesh.inference.address, delay_s=0.0)
    await proxy.start()
    ic = InferenceClient(proxy.address, "ranker")
    fc = FeatureClient(mesh.feature.address, "ranker")
    try:
        async with ranker_behind(fc, ic) as recommender, _gateway(recommender) as http:
            body = {"user_id": "u7", "count": 5}
            warm = await http.post("/v1/recommend", json=body, headers=A_KEY)
            assert warm.status_code == 200 and warm.json()["model_version"].startswith("ctr-")

            proxy.delay_s = 1.0  # inference now answers long after class A's budget
            timings = []
            for _ in range(ic.policy.failure_threshold + 2):
                started = time.perf_counter()
                resp = await http.post("/v1/recommend", json=body, headers=A_KEY)
                timings.append(time.perf_counter() - started)
                assert resp.status_code == 200, resp.text
                out = resp.json()
                assert out["slo_class"] == "A" and len(out["items"]) == 5
                # The ranker serves its unscored recall order; on a loaded machine it may
                # miss its own 5 ms hop margin, and then the gateway's popularity fallback
                # answers, or its recall may run past 40 % of the budget, and then the ladder
                # skips scoring before it is tried (CI saw that once).
                if {"ranker_unavailable", "ranker_timeout"} & set(out["degraded"]):
                    assert out["model_version"] == "popularity"
                elif "ladder:L4_skip_fine_ranking" in out["degraded"]:
                    assert "skipped:score" in out["degraded"] and out["model_version"] == "recall"
                else:
                    assert "scoring_unavailable" in out["degraded"], out["degraded"]
                    assert out["model_version"] == "recall", "the ranker's unscored recall order"
            # The budget-derived deadline holds (10% slack for a loaded test machine).
            assert max(timings) < A_BUDGET_S * 1.1, timings
            assert ic.breaker.state is BreakerState.OPEN
            assert timings[-1] < 0.1, "with the breaker open the ranker no longer waits for inference"

            proxy.delay_s = 0.0
            ic.breaker.open_s = 0.05  # let the half-open probe go out now

            async def scored() -> bool:
                resp = await http.post("/v1/recommend", json=body, headers=A_KEY)
                return bool(resp.json()["model_version"].startswith("ctr-"))

            for _ in range(40):
                if await scored():
                    break
                await asyncio.sleep(0.05)
            assert state(ic) is BreakerState.CLOSED, "a successful probe closed it"
            metrics = generate_latest().decode()
            assert 'recmesh_circuit_opened_total{service="ranker",target="inference"}' in metrics
    finally:
        await proxy.stop()


async def test_feature_service_dies_recommendations_fall_back_without_5xx(mesh: Mesh, redis_url: str) -> None:
    feature = build_feature(FeatureSettings(feature_port=free_port(), redis_url=redis_url), mesh.store)
    await feature.start()
    await feature.set_serving()
    fc = FeatureClient(feature.address, "ranker")
    ic = InferenceClient(mesh.inference.address, "ranker")
    try:
        async with ranker_behind(fc, ic) as recommender, _gateway(recommender) as http:
            body = {"user_id": "u9", "count": 5}
            warm = await http.post("/v1/recommend", json=body, headers=A_KEY)
            assert warm.status_code == 200 and warm.json()["degraded"] == []

            await feature.stop(0.0)
            statuses, degraded, timings = [], set(), []
            for _ in range(12):
                started = time.perf_counter()
                resp = await http.post("/v1/recommend", json=body, headers=A_KEY)
                timings.append(time.perf_counter() - started)
                statuses.append(resp.status_code)
                if resp.status_code == 200:
                    assert len(resp.json()["items"]) == 5
                    degraded.update(resp.json()["degraded"])
            assert statuses == [200] * 12, statuses
            assert "features_unavailable" in degraded, degraded
            assert max(timings) < A_BUDGET_S * 1.1, timings
            assert fc.breaker.state is BreakerState.OPEN, "the dead feature service is no longer dialled"
    finally:
        await feature.stop(0.0)
