"""One way to run a service: the start and stop sequence every entry point shares.

An entry point (`services/*/__main__.py`) says what its service is made of, as
`Parts`, and `run_service` does the rest, in this order:

1. logging, tracing (the standard OTEL_* variables), the TLS material (read,
   or plaintext said, before anything listens) and the metrics port;
2. on the event loop (`recmesh.eventloop`): `build` makes the parts; the
   `background` loops start; the server binds, NOT_SERVING; `warm` runs (Redis
   answering, the model loaded); what start-up built is moved out of the
   collector's reach (`gc.freeze`: full collections stay short under load);
   SERVING; the `after_serving` jobs start;
3. it runs until SIGINT or SIGTERM, or until an `after_serving` job fails (the
   failure is logged and re-raised, so the process exits non-zero) or one marked
   `until_stop` ends;
4. teardown: the jobs are cancelled, the server drains in-flight calls for the
   grace period (`RECMESH_SHUTDOWN_GRACE_S`), the background loops are
   cancelled, then `closers` run in order (flush a producer, close clients).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import structlog

from recmesh import eventloop
from recmesh.grpcserver import shutdown_signals, wait_for_shutdown_signal
from recmesh.metrics_http import start_metrics_server
from recmesh.security import process_tls
from recmesh.telemetry import setup_logging, setup_tracing

_log = structlog.get_logger("recmesh.service")

Step = Callable[[], Coroutine[Any, Any, Any]]


class Server(Protocol):
    """What `run_service` starts and stops (recmesh.grpcserver.MeshServer, or a
    service's own pair of servers)."""

    async def start(self) -> None: ...

    async def set_serving(self) -> None: ...

    async def stop(self, grace_s: float) -> None: ...


@dataclass(frozen=True)
class Job:
    """Work started once the service is SERVING. A failure stops the process;
    so does the job's end when `until_stop` (a server the process lives for)."""

    name: str
    run: Step
    until_stop: bool = False


@dataclass
class Parts:
    server: Server
    warm: Step | None = None  # between binding and SERVING
    background: Sequence[Step] = ()  # loops, cancelled after the server stopped
    after_serving: Sequence[Job] = ()
    closers: Sequence[Step] = field(default_factory=list)  # after everything else, in order


class ServiceSettings(Protocol):
    """What `run_service` reads of a service's settings (recmesh.settings)."""

    @property
    def log_level(self) -> str: ...
    @property
    def log_format(self) -> str: ...
    @property
    def telemetry_flush_s(self) -> float: ...
    @property
    def shutdown_grace_s(self) -> float: ...
    @property
    def bind_host(self) -> str: ...
    @property
    def metrics_port(self) -> int: ...


S = TypeVar("S", bound=ServiceSettings)


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):  # a failure was logged already
        await task


async def serve(parts: Parts, grace_s: float) -> None:
    """Steps 2 to 4 of the module docstring, for parts already built."""
    background: list[asyncio.Task[Any]] = [asyncio.create_task(step()) for step in parts.background]
    await parts.server.start()
    if parts.warm is not None:
        await parts.warm()
    gc.collect()
    gc.freeze()
    await parts.server.set_serving()
    jobs: dict[asyncio.Task[Any], Job] = {
        asyncio.create_task(job.run(), name=job.name): job for job in parts.after_serving
    }
    stop: asyncio.Task[Any] = asyncio.create_task(wait_for_shutdown_signal())
    pending: set[asyncio.Task[Any]] = {stop, *jobs}
    failure: BaseException | None = None
    while stop in pending and failure is None:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done - {stop}:
            job = jobs[task]
            failure = task.exception() if not task.cancelled() else None
            if failure is not None:
                _log.error("job_failed", job=job.name, error=repr(failure))
            elif job.until_stop:
                _log.warning("job_ended", job=job.name)
                pending.discard(stop)
    for task in [*jobs, stop]:
        await _cancel(task)
    await parts.server.stop(grace_s)
    for task in background:
        await _cancel(task)
    for close in parts.closers:
        await close()
    if failure is not None:
        raise failure


T = TypeVar("T")


async def until_stopped(
    consume: Callable[[asyncio.Event, asyncio.Event], Coroutine[Any, Any, T]],
) -> T | None:
    """A consumer process's body (the ingest, attribution): `consume(stop, started)` runs
    until it returns, sets `started` once its clients are up, and returns when `stop`
    is set. Signals count from the start: joining a consumer group or waiting for
    Redis can take seconds, and a stop then gives the start-up up (None) instead of
    waiting for it, or dying in asyncio's KeyboardInterrupt with clients open."""
    started = asyncio.Event()
    with shutdown_signals() as stop:
        work: asyncio.Task[T] = asyncio.create_task(consume(stop, started))
        signalled = asyncio.create_task(stop.wait())
        await asyncio.wait({work, signalled}, return_when=asyncio.FIRST_COMPLETED)
        signalled.cancel()
        if not started.is_set():
            work.cancel()
        try:
            return await work
        except asyncio.CancelledError:
            _log.info("stopped_while_starting")
            return None


def run_service(name: str, settings: S, build: Callable[[S], Awaitable[Parts]], *, redis: bool) -> None:
    """Run service `name` (module docstring); `redis=False` for one that never talks to
    Redis (instrumenting it would import redis-py for nothing)."""
    setup_logging(name, settings.log_level, settings.log_format)
    setup_tracing(name, redis=redis, flush_s=settings.telemetry_flush_s)
    process_tls()
    start_metrics_server(settings.metrics_port, addr=settings.bind_host)  # /metrics, /healthz, /readyz

    async def main() -> None:
        await serve(await build(settings), settings.shutdown_grace_s)

    eventloop.run(main())
