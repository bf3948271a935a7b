"""Shared pieces of the benchmarks: infrastructure, printing (percentiles: recmesh.stats)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from recmesh.tools.localinfra import (
    ManagedProcess,
    broker_process,
    free_port,
    redis_process,
    wait_tcp,
)
from recmesh.topics import ensure_topics


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) a process has used so far, its children's not
    counted (None when it is gone or cannot be read)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return times.user + times.system


@dataclass
class Infra:
    redis_url: str
    kafka_bootstrap: str
    workdir: Path


__all__ = ["Infra", "emit", "free_port", "infrastructure", "plaintext_unless_set"]


def plaintext_unless_set() -> None:
    """Benchmarks that start single services measure those services' work: they
    and the services they start speak plaintext gRPC unless RECMESH_TLS is set
    (then they need its certificates). `recmesh bench tls` measures what
    mutual TLS adds, on the whole mesh."""
    if "RECMESH_TLS" in os.environ:
        return
    from recmesh.security import reset_process_tls

    os.environ["RECMESH_TLS"] = "off"
    reset_process_tls()
    print("(plaintext gRPC between this benchmark and the services it starts; `recmesh bench tls` "
          "measures mutual TLS)", file=sys.stderr, flush=True)  # fmt: skip


def _redis_dir(persistence: str) -> tempfile.TemporaryDirectory[str]:
    """Where an embedded bench Redis works: with persistence, in the state directory
    (RECMESH_STATE_DIR), so its writes go to the file system `recmesh up`'s go to;
    without, anywhere."""
    if persistence == "off":
        return tempfile.TemporaryDirectory(prefix="recmesh-bench-redis-")
    from recmesh.settings import StateSettings

    state = StateSettings().state_dir
    state.mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(prefix="bench-redis-", dir=state)


@contextlib.asynccontextmanager
async def infrastructure(topics: dict[str, int], redis_persistence: str = "off") -> AsyncIterator[Infra]:
    """REDIS_URL / KAFKA_BOOTSTRAP when set, else embedded processes on free ports;
    `redis_persistence`: how the embedded Redis keeps its data (localinfra.REDIS_PERSISTENCE)."""
    procs: list[ManagedProcess] = []
    with tempfile.TemporaryDirectory(prefix="recmesh-bench-") as tmp, _redis_dir(redis_persistence) as data:
        work = Path(tmp)
        redis_url = os.environ.get("REDIS_URL")
        kafka = os.environ.get("KAFKA_BOOTSTRAP")
        try:
            if not redis_url:
                port = free_port()
                proc = redis_process(port, Path(data), work, persistence=redis_persistence)
                proc.start()
                procs.append(proc)
                await wait_tcp("127.0.0.1", port, 10, proc)
                redis_url = f"redis://127.0.0.1:{port}/0"
            if not kafka:
                port = free_port()
                proc = broker_process(port, work)
                proc.start()
                procs.append(proc)
                await wait_tcp("127.0.0.1", port, 10, proc)
                kafka = f"127.0.0.1:{port}"
            await ensure_topics(kafka, topics)
            yield Infra(redis_url, kafka, work)
        finally:
            for proc in reversed(procs):
                await asyncio.to_thread(proc.stop)


def emit(figures: dict[str, Any], as_json: bool, table: str) -> None:
    print(table, flush=True)
    if as_json:
        print(json.dumps(figures), flush=True)
