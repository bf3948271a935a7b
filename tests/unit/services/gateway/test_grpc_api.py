"""The public gRPC server (services/gateway/grpc_api.py) on a real socket, with
no downstream listening: the class is decided once per call, the call is
labelled with the class granted, and refusals are the edge's answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest

from recmesh.admission import AdmissionConfig, AdmissionGate
from recmesh.clients.feature import FeatureClient
from recmesh.clients.ranker import RankerClient
from recmesh.grpcserver import MeshServer
from recmesh.settings import GatewaySettings
from recmesh.v1 import recommender_pb2, recommender_pb2_grpc
from services.gateway.edge import Edge
from services.gateway.grpc_api import build_grpc_server
from services.gateway.recommend import Recommender
from tests.helpers import CountingPolicy, free_port, poll_until, request_count


@dataclass
class Served:
    stub: recommender_pb2_grpc.RecommenderStub
    policy: CountingPolicy
    gate: AdmissionGate


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    settings = GatewaySettings.model_validate(
        {"gateway_grpc_port": free_port(), "RECMESH_API_KEYS": {"k-a": {"tenant": "app", "max_class": "A"}}}
    )
    nowhere = f"127.0.0.1:{free_port()}"  # no ranker, no feature service: no fallback is held
    ranker, features = RankerClient(nowhere, "gateway"), FeatureClient(nowhere, "gateway")
    policy = CountingPolicy.from_settings(settings)
    gate = AdmissionGate(AdmissionConfig(retry_after_s=2))
    server: MeshServer = build_grpc_server(settings, Recommender(ranker, features, 100), Edge(policy, gate))
    await server.start()
    await server.set_serving()
    async with grpc.aio.insecure_channel(server.address) as channel:
        yield Served(recommender_pb2_grpc.RecommenderStub(channel), policy, gate)
    await server.stop(0.1)
    await ranker.close()
    await features.close()


def _count(slo_class: str, code: str) -> float:
    return request_count("gateway", "Recommend", slo_class, code)


async def _counted(slo_class: str, code: str, want: float) -> None:
    """The server records a call after its status went out (in the interceptor's
    `finally`): a client can read the count first, so wait for it (a short bound)."""

    async def reached() -> bool:
        return _count(slo_class, code) == want

    await poll_until(reached, f"{want} {slo_class}/{code} calls counted", timeout=2.0, interval=0.005)


async def _call(
    served: Served, metadata: tuple[tuple[str, str], ...], count: int = 5
) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await served.stub.Recommend(recommender_pb2.RecommendRequest(user_id="u1", count=count),
                                    metadata=metadata, timeout=5)  # fmt: skip
    return err.value


async def test_one_decision_per_call_labels_and_serves_it(served: Served) -> None:
    # Anonymous callers asking for A are granted B: the label is B, and the
    # failure (no ranker, no fallback) is answered once, as the edge maps it.
    before = _count("B", "UNAVAILABLE")
    err = await _call(served, (("x-slo-class", "A"),))
    assert err.code() == grpc.StatusCode.UNAVAILABLE and "no fallback is held" in (err.details() or "")
    assert served.policy.decisions == 1, "decided by the interceptor, and not again by the servicer"
    await _counted("B", "UNAVAILABLE", before + 1)


async def test_refusals_are_the_edges_answers(served: Served) -> None:
    invalid = _count("invalid", "INVALID_ARGUMENT")
    err = await _call(served, (("x-slo-class", "Z"),))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "x-slo-class" in (err.details() or "")
    await _counted("invalid", "INVALID_ARGUMENT", invalid + 1)
    err = await _call(served, (("x-api-key", "stolen?"),))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    err = await _call(served, (("x-api-key", "k-a"),), count=101)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "count must be in 1..100" in (
        err.details() or ""
    )
    assert served.gate.in_flight == 0


async def test_a_shed_call_says_when_to_retry_and_in_which_class(served: Served) -> None:
    served.gate.record_loop_lag(10_000)
    before = _count("C", "RESOURCE_EXHAUSTED")
    err = await _call(served, (("x-slo-class", "C"),))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "loop_lag" in (err.details() or "")
    trailers = dict(err.trailing_metadata() or ())
    assert trailers["retry-after"] == "2" and trailers["x-slo-class"] == "C"
    assert trailers["grpc-retry-pushback-ms"] == "2000", "what gRPC's own retry policy reads"
    await _counted("C", "RESOURCE_EXHAUSTED", before + 1)
