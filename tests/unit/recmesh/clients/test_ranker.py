"""RankerClient against a real gRPC server on a socket: the dependencies the
ranker must not call travel as one sorted, comma-separated x-recmesh-skip."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from recmesh.clients.ranker import RankerClient
from recmesh.metadata import SKIP_HEADER
from recmesh.v1 import ranker_pb2, ranker_pb2_grpc
from tests.helpers import served_client


class _Ranker(ranker_pb2_grpc.RankerServiceServicer):
    def __init__(self) -> None:
        self.skips: list[str | None] = []

    async def Rank(
        self, request: ranker_pb2.RankRequest, context: grpc.aio.ServicerContext
    ) -> ranker_pb2.RankResponse:
        self.skips.append(dict(context.invocation_metadata() or ()).get(SKIP_HEADER))
        return ranker_pb2.RankResponse(model_version="m-1")


@pytest.fixture
async def served() -> AsyncIterator[tuple[RankerClient, _Ranker]]:
    servicer = _Ranker()
    async with served_client(
        RankerClient, ranker_pb2_grpc.add_RankerServiceServicer_to_server, servicer
    ) as client:
        yield client, servicer


async def test_skipped_dependencies_travel_sorted_in_one_header(served: tuple[RankerClient, _Ranker]) -> None:
    client, servicer = served
    assert (await client.rank("u1", 5, {}, 1_000, skip={"inference", "feature"})).model_version == "m-1"
    await client.rank("u1", 5, {}, 1_000)
    assert servicer.skips == ["feature,inference", None], "no header when nothing is skipped"
