"""Starting processes from a process whose gRPC is busy: with gRPC's fork
support on, about one child in ten died before exec (grpc/grpc#43055); a
service that never started then left a mesh unready (seen in test_mix)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from recmesh.tools.localinfra import ManagedProcess


async def test_children_start_while_grpc_threads_are_busy(tmp_path: Path) -> None:
    assert os.environ.get("GRPC_ENABLE_FORK_SUPPORT") == "false", "set by importing recmesh"
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = health_pb2_grpc.HealthStub(channel)

    async def busy() -> None:
        while True:
            await stub.Check(health_pb2.HealthCheckRequest())

    callers = [asyncio.create_task(busy()) for _ in range(4)]
    failed = []
    try:
        for n in range(80):
            child = ManagedProcess(f"true{n}", ["/bin/sh", "-c", "exit 0"], tmp_path / f"{n}.log")
            child.start()
            assert child.proc is not None
            # Its own exit, not a SIGTERM from stop(): on a busy machine a
            # healthy child may not have finished `exit 0` yet.
            try:
                code: int | str = await asyncio.to_thread(child.proc.wait, 30.0)
            except subprocess.TimeoutExpired:
                code = "hung for 30 s"
            child.stop()
            if code != 0:
                failed.append(f"exit {code}: {child.log_tail()}")
    finally:
        for task in callers:
            task.cancel()
        await asyncio.gather(*callers, return_exceptions=True)
        await channel.close()
        await server.stop(0)
    assert not failed, f"{len(failed)} of 80 children died or hung before exec: {failed[0]}"
