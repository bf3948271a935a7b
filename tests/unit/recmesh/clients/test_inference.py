"""InferenceClient against a real gRPC server on a socket: a NumPy matrix
travels as raw float32 bytes, a list as numbers, and the server's suggested
degradation level comes back from the trailing metadata."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest

from recmesh.clients.inference import InferenceClient, Scored
from recmesh.metadata import SUGGESTED_LEVEL_KEY
from recmesh.v1 import inference_pb2 as pb
from recmesh.v1 import inference_pb2_grpc
from tests.helpers import served_client


class _Inference(inference_pb2_grpc.InferenceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[pb.ScoreRequest] = []

    async def Score(self, request: pb.ScoreRequest, context: grpc.aio.ServicerContext) -> pb.ScoreResponse:
        self.requests.append(request)
        context.set_trailing_metadata(((SUGGESTED_LEVEL_KEY, "2"),))
        return pb.ScoreResponse(scores=[0.5, 0.25], model_version="m-1", level=1)


@pytest.fixture
async def served() -> AsyncIterator[tuple[InferenceClient, _Inference]]:
    servicer = _Inference()
    add = inference_pb2_grpc.add_InferenceServiceServicer_to_server
    async with served_client(InferenceClient, add, servicer) as client:
        yield client, servicer


async def test_scores_carry_the_suggested_and_served_levels(
    served: tuple[InferenceClient, _Inference],
) -> None:
    client, servicer = served
    matrix = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    scored = await client.score("fs-1", ["a", "b"], matrix, level=1)
    assert scored == Scored([0.5, 0.25], "m-1", suggested_level=2, level=1)
    sent = servicer.requests[0]
    assert np.frombuffer(sent.values_f32, dtype="<f4").tolist() == [1.0, 2.0, 3.0, 4.0] and not sent.values
    await client.score("fs-1", ["a", "b"], [1.0, 2.0, 3.0, 4.0])
    assert list(servicer.requests[1].values) == [1.0, 2.0, 3.0, 4.0] and not servicer.requests[1].values_f32
