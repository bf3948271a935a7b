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
(grpc.aio with the services' channel and server options, uvicorn on asyncio).
Left out, so the floor is lower still than what the mesh's transport costs:
hedged second feature reads under load, trailing metadata, and deadlines
taken from each request's budget (a fixed one here).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import grpc
import uvicorn

from recmesh import eventloop
from recmesh.clients.base import open_channel
from recmesh.grpcserver import GRPC_OPTIONS, wait_for_shutdown_signal
from recmesh.metadata import SLO_HEADER, TRACEPARENT_HEADER
from recmesh.tools.bench.common import emit
from recmesh.tools.bench.loadgen import StepResult
from recmesh.tools.bench.proccpu import CpuMeter
from recmesh.tools.bench.sweep import parse_rates, sweep, table
from recmesh.tools.localinfra import ManagedProcess, free_port, wait_tcp

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
    (SLO_HEADER, "A"),
    (TRACEPARENT_HEADER, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"),
)
CALL_TIMEOUT_S = 2.0
ROLES = ("feature", "inference", "ranker", "gateway")

Handler = Callable[[bytes, grpc.aio.ServicerContext[bytes, bytes]], Awaitable[bytes]]


def _canned(reply: bytes) -> Handler:
    async def handle(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return reply

    return handle


async def _grpc_server(port: int, service: str, handlers: dict[str, Handler]) -> None:
    server = grpc.aio.server(options=GRPC_OPTIONS)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(
            service, {name: grpc.unary_unary_rpc_method_handler(h) for name, h in handlers.items()}
        ),)
    )  # fmt: skip
    if server.add_insecure_port(f"127.0.0.1:{port}") == 0:
        raise OSError(f"floor {service}: cannot bind port {port}")
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
        feature = open_channel(f"127.0.0.1:{downstream['feature']}", plaintext=True)
        inference = open_channel(f"127.0.0.1:{downstream['inference']}", plaintext=True)
        user = _call(feature, "/floor.feature/user", bytes(SIZES["user"][0]))
        items = _call(feature, "/floor.feature/items", bytes(SIZES["items"][0]))
        score = _call(inference, "/floor.inference/score", bytes(SIZES["score"][0]))
        reply = bytes(SIZES["rank"][1])

        async def rank(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            try:
                await user()
                await items()
                await score()
            except grpc.aio.AioRpcError as err:  # passed on, as the ranker would: no traceback per call
                await context.abort(err.code(), err.details() or "")
            return reply

        await _grpc_server(port, "floor.ranker", {"rank": rank})
        return
    ranker = open_channel(f"127.0.0.1:{downstream['ranker']}", plaintext=True)
    rank_call = _call(ranker, "/floor.ranker/rank", bytes(SIZES["rank"][0]))
    headers = [(b"content-type", b"application/json")]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        status, body = 200, HTTP_BODY
        try:
            await rank_call()
        except grpc.aio.AioRpcError as err:  # answered like the gateway: no traceback per request
            status, body = 503, f'{{"error":"{err.code().name}"}}'.encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [*headers, (b"content-length", str(len(body)).encode())]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off"
    )
    await uvicorn.Server(config).serve()


@contextlib.asynccontextmanager
async def started_skeleton(
    log_dir: Path, ready_timeout_s: float = 60.0
) -> AsyncIterator[tuple[str, dict[int, str]]]:
    """The four processes on free ports, listening; yields the gateway URL and {pid: role}. Each
    dies with this process (ManagedProcess) and logs to `log_dir`/ROLE.log."""
    ports = {role: free_port() for role in ROLES}
    down = ",".join(f"{r}={p}" for r, p in ports.items())
    procs = [
        ManagedProcess(role,
                       [sys.executable, "-m", "recmesh.tools.bench.floor", role, str(ports[role]), down],
                       log_dir / f"{role}.log")
        for role in ROLES
    ]  # fmt: skip
    try:
        for proc in procs:
            proc.start()
        for proc in procs:
            await wait_tcp("127.0.0.1", ports[proc.name], ready_timeout_s, proc)
        url = f"http://127.0.0.1:{ports['gateway']}"
        yield url, {proc.pid: proc.name for proc in procs if proc.pid is not None}
    finally:
        for proc in procs:
            await asyncio.to_thread(proc.stop)


async def sweep_floor(rates: str, seconds: float) -> list[StepResult]:
    """The skeleton under the e2e sweep: `rates` as `--rates` takes them."""
    with tempfile.TemporaryDirectory(prefix="recmesh-bench-floor-") as tmp:
        async with started_skeleton(Path(tmp)) as (url, roles):
            meter = CpuMeter(names=roles)
            return await sweep(url, parse_rates(rates), seconds, {"A": 1.0}, None, meter=meter)


async def run(args: Any) -> list[StepResult]:
    return await sweep_floor(args.rates, args.seconds)


TITLE = "recmesh bench floor: the mesh's calls with no work in them (canned bytes), class A, open loop"


def main(args: Any) -> int:
    steps = asyncio.run(run(args))
    emit({"steps": [asdict(s) for s in steps]}, args.json, table(steps, title=TITLE))
    return 0


def _serve_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m recmesh.tools.bench.floor")
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("port", type=int)
    parser.add_argument("downstream", help="role=port,...")
    a = parser.parse_args(argv)
    downstream = {r: int(p) for r, _, p in (part.partition("=") for part in a.downstream.split(","))}
    eventloop.run(serve(a.role, a.port, downstream))


if __name__ == "__main__":
    _serve_main(sys.argv[1:])
