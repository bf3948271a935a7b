"""RankerClient: the ranker's Rank RPC, as the gateway calls it."""

from __future__ import annotations

from collections.abc import Collection

from recmesh.clients.base import GrpcClient, ResiliencePolicy
from recmesh.metadata import SKIP_HEADER
from recmesh.v1 import ranker_pb2, ranker_pb2_grpc


class RankerClient(GrpcClient):
    target = "ranker"
    service_name = "recmesh.v1.RankerService"

    def __init__(
        self, address: str, caller: str, margin_ms: float = 5.0, policy: ResiliencePolicy | None = None,
        *, plaintext: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(address, caller, margin_ms, policy, plaintext=plaintext)
        self._stub = ranker_pb2_grpc.RankerServiceStub(self.channel)

    async def rank(
        self, user_id: str, count: int, context: dict[str, str], as_of_ms: int,
        skip: Collection[str] = (),
    ) -> ranker_pb2.RankResponse:  # fmt: skip
        """`skip`: dependencies the ranker must not call (sent as SKIP_HEADER)."""
        req = ranker_pb2.RankRequest(user_id=user_id, count=count, context=context, as_of_ms=as_of_ms)
        metadata = ((SKIP_HEADER, ",".join(sorted(skip))),) if skip else ()
        return await self._call("Rank", self._stub.Rank, req, metadata=metadata)
