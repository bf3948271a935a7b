"""`recmesh bench floor`: the mesh's call pattern with no work in it.

One recommendation is an HTTP request into the gateway, a gRPC call to the
ranker, two calls from the ranker to the feature service (the user, then the
candidates' items) and one to inference. This bench starts four processes that
make exactly those calls, in that order, with the real messages' sizes, a
deadline and the mesh's two metadata entries, and do nothing else: every
handler answers canned bytes (no protobuf, Redis, recall, model,
interceptors, metrics or spans). It then offers the same open-loop load as
`recmesh bench e2e` and prints the same table.

What the skeleton sustains on this machine is a ceiling for the real mesh, and
its CPU per request is the share of the real mesh's that is transport alone
(grpc.aio and uvicorn on asyncio, as the services run them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict
from typing import Any

import grpc
import httpx
import uvicorn

from recmesh import eventloop
from recmesh.bench.common import emit, free_port
from recmesh.bench.e2e import parse_rates, sweep, table
from recmesh.bench.loadgen import StepResult
from recmesh.bench.proccpu import CpuMeter
from recmesh.grpcserver import wait_for_shutdown_signal

# (request, response) bytes of one recommendation's messages in the demo mesh
# (200 candidates, 100 co-visited items with the user, 23 model columns,
# count 10), measured from the serialised messages.
SIZES = {
    "rank": (60, 600),
    "user": (40, 2_500),
    "items": (1_400, 25_000),
    "score": (22_000, 820),
}
HTTP_BODY = b'{"items":[],"degraded":[],"pad":"' + b"x" * 660 + b'"}'
METADATA = (
    ("x-slo-class", "A"),
    ("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"),
)
CALL_TIMEOUT_S = 2.0
ROLES = ("feature", "inference", "ranker", "gateway")

Handler = Callable[[bytes, grpc.aio.ServicerContext[bytes, bytes]], Awaitable[bytes]]


def _canned(reply: bytes) -> Handler:
    async def handle(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return reply

    return handle


async def _grpc_server(port: int, service: str, handlers: dict[str, Handler]) -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(
            service, {name: grpc.unary_unary_rpc_method_handler(h) for name, h in handlers.items()}
        ),)
    )  # fmt: skip
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await wait_for_shutdown_signal()
    await server.stop(None)


def _call(channel: grpc.aio.Channel, method: str, payload: bytes) -> Callable[[], Awaitable[bytes]]:
    stub = channel.unary_unary(method)

    async def call() -> bytes:
        reply: bytes = await stub(payload, timeout=CALL_TIMEOUT_S, metadata=METADATA)
        return reply

    return call


async def serve(role: str, port: int, downstream: dict[str, int]) -> None:
    """One process of the skeleton."""
    if role in ("feature", "inference"):
        methods = ("user", "items") if role == "feature" else ("score",)
        await _grpc_server(port, f"floor.{role}", {m: _canned(bytes(SIZES[m][1])) for m in methods})
        return
    if role == "ranker":
        feature = grpc.aio.insecure_channel(f"127.0.0.1:{downstream['feature']}")
        inference = grpc.aio.insecure_channel(f"127.0.0.1:{downstream['inference']}")
        user = _call(feature, "/floor.feature/user", bytes(SIZES["user"][0]))
        items = _call(feature, "/floor.feature/items", bytes(SIZES["items"][0]))
        score = _call(inference, "/floor.inference/score", bytes(SIZES["score"][0]))
        reply = bytes(SIZES["rank"][1])

        async def rank(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            await user()
            await items()
            await score()
            return reply

        await _grpc_server(port, "floor.ranker", {"rank": rank})
        return
    ranker = grpc.aio.insecure_channel(f"127.0.0.1:{downstream['ranker']}")
    rank_call = _call(ranker, "/floor.ranker/rank", bytes(SIZES["rank"][0]))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(HTTP_BODY)).encode())]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await rank_call()
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": HTTP_BODY})

    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off"
    )
    await uvicorn.Server(config).serve()


@contextlib.asynccontextmanager
async def started_skeleton(ready_timeout_s: float = 60.0) -> AsyncIterator[tuple[str, dict[int, str]]]:
    """The four processes on free ports; yields the gateway URL and {pid: role}."""
    ports = {role: free_port() for role in ROLES}
    down = ",".join(f"{r}={p}" for r, p in ports.items())
    procs = {
        role: subprocess.Popen(  # noqa: ASYNC220 (returns at once)
            [sys.executable, "-m", "recmesh.bench.floor", role, str(ports[role]), down]
        )
        for role in ROLES
    }
    url = f"http://127.0.0.1:{ports['gateway']}"
    try:
        deadline = time.monotonic() + ready_timeout_s
        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                if any(p.poll() is not None for p in procs.values()):
                    raise RuntimeError("a skeleton process exited before it was ready")
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.post(f"{url}/v1/recommend")).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the skeleton did not answer within {ready_timeout_s} s")
                await asyncio.sleep(0.2)
        yield url, {p.pid: role for role, p in procs.items()}
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                await asyncio.to_thread(p.wait, 10)
            except subprocess.TimeoutExpired:
                p.kill()


async def run(args: Any) -> list[StepResult]:
    rates = parse_rates(args.rates)
    async with started_skeleton() as (url, roles):
        meter = CpuMeter(os.getpid(), names=roles)
        return await sweep(url, rates, args.seconds, {"A": 1.0}, None, meter=meter)


TITLE = "recmesh bench floor: the mesh's calls with no work in them (canned bytes), class A, open loop"


def main(args: Any) -> int:
    steps = asyncio.run(run(args))
    emit({"steps": [asdict(s) for s in steps]}, args.json, table(steps, title=TITLE))
    return 0


def _serve_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m recmesh.bench.floor")
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("port", type=int)
    parser.add_argument("downstream", help="role=port,...")
    a = parser.parse_args(argv)
    downstream = {r: int(p) for r, _, p in (part.partition("=") for part in a.downstream.split(","))}
    eventloop.run(serve(a.role, a.port, downstream))


if __name__ == "__main__":
    _serve_main(sys.argv[1:])
