"""Open-loop load against the gateway's REST API, and what came of it per class.

Requests arrive at a fixed rate whatever the answers do (open loop): a slow
mesh does not slow the offered load down, so queueing shows as latency, and
latency is measured from each request's *scheduled* arrival (no coordinated
omission). The client is a minimal HTTP/1.1 keep-alive client on asyncio
streams with pre-encoded requests, so that as little of the shared CPU as
possible goes to the load generator itself.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import orjson

from recmesh.metadata import SLO_HEADER
from recmesh.settings import configured_classes
from recmesh.stats import percentile

REQUEST_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Outcome:
    slo_class: str
    status: int  # 0: no answer (connection error or client timeout)
    latency_s: float  # from the scheduled arrival
    degraded: bool
    granted: str  # the class the gateway answered with ("" when it did not say)
    error: str = ""  # why there was no answer (status 0)


@dataclass
class ClassSummary:
    slo_class: str
    offered: int
    ok: int
    shed: int
    errors: int
    degraded: int
    within_budget: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    goodput_rps: float  # 200s within the class budget, per second
    shed_rate: float
    goodput_ratio: float  # within budget / offered


@dataclass
class StepResult:
    rate: float
    seconds: float
    classes: dict[str, ClassSummary] = field(default_factory=dict)
    total_ok_rps: float = 0.0
    client_lag_ms: float = 0.0  # how late the generator launched requests (p99)
    # CPU milliseconds per recommendation answered, by mesh process (empty: not
    # measured, or nothing answered).
    cpu_ms_per_request: dict[str, float] = field(default_factory=dict)


class StaleConnection(ConnectionError):
    """A reused kept-alive connection was closed by the server before it answered."""


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.idle_since = time.perf_counter()

    async def request(self, payload: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
        self.writer.write(payload)
        try:
            status_line = await self.reader.readline()
        except (ConnectionResetError, BrokenPipeError) as e:
            raise StaleConnection(str(e)) from e
        if not status_line:
            raise StaleConnection("closed by the server before an answer")
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise ConnectionError(f"no HTTP status line: {status_line[:40]!r}")
        status = int(parts[1])
        headers: dict[bytes, bytes] = {}
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if b"content-length" not in headers:
            raise ConnectionError("response without content-length (chunked is not supported)")
        body = await self.reader.readexactly(int(headers.get(b"content-length", b"0")))
        return status, headers, body

    def close(self) -> None:
        self.writer.close()


# Servers close kept-alive connections that sat idle (uvicorn after 5 s). An
# idle connection older than this is closed here first; one the server closed
# anyway (the race every HTTP client has) is retried once on a new connection.
# A server that read the request and then dropped the connection looks the
# same, so that request may be sent twice: harmless for the read-only
# recommend call this generator sends.
IDLE_S = 3.0


class _Pool:
    def __init__(self, host: str, port: int, max_conns: int) -> None:
        self._host, self._port = host, port
        self._idle: list[_Conn] = []
        self._sem = asyncio.Semaphore(max_conns)

    def _reusable(self) -> _Conn | None:
        now = time.perf_counter()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since < IDLE_S:
                return conn
            conn.close()
        return None

    async def _fresh(self) -> _Conn:
        reader, writer = await asyncio.open_connection(self._host, self._port)
        return _Conn(reader, writer)

    async def send(self, payload: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
        async with self._sem:
            conn = reused = self._reusable()
            try:
                conn = conn or await self._fresh()
                try:
                    result = await conn.request(payload)
                except StaleConnection:
                    if reused is None:
                        raise
                    conn.close()
                    conn = await self._fresh()
                    result = await conn.request(payload)
            except BaseException:
                if conn is not None:
                    conn.close()
                raise
            if result[1].get(b"connection") == b"close":
                conn.close()
            else:
                conn.idle_since = time.perf_counter()
                self._idle.append(conn)
            return result

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


def encode_request(host: str, slo_class: str, user_id: str, count: int, api_key: str | None) -> bytes:
    body = orjson.dumps({"user_id": user_id, "count": count})
    head = [
        "POST /v1/recommend HTTP/1.1",
        f"host: {host}",
        "content-type: application/json",
        f"x-slo-class: {slo_class}",
        f"content-length: {len(body)}",
    ]
    if api_key:
        head.append(f"x-api-key: {api_key}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@dataclass(frozen=True)
class LoadSpec:
    rate: float  # requests/s offered, all classes together
    seconds: float
    mix: Mapping[str, float]  # class -> share of requests
    api_keys: Mapping[str, str | None]  # class -> x-api-key to send
    count: int = 10
    users: int = 2000
    seed: int = 1
    max_conns: int = 512


# asyncio's timers fire up to ~1 ms late (epoll counts whole milliseconds), and
# an open loop counts that lateness as the mesh's latency: 0.7 ms of the p50 at
# 20/s. At rates up to SPIN_MAX_RATE the generator sleeps until SPIN_S before a
# launch and then yields to the loop until it is due (SPIN_S x rate of a core:
# 6% at 50/s). Above it spinning would take too much of the cores the mesh
# runs on, so launches may again be up to ~1 ms late (the `lag` column).
SPIN_S = 0.0012
SPIN_MAX_RATE = 50.0


async def _until(due: float, *, spin: bool) -> None:
    if not spin:
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        return
    await asyncio.sleep(max(0.0, due - SPIN_S - time.perf_counter()))
    while time.perf_counter() < due:  # noqa: ASYNC110 (a deliberate spin, yielding to the loop)
        await asyncio.sleep(0)


async def offer(host: str, port: int, spec: LoadSpec) -> tuple[list[Outcome], float]:
    """Offer `spec.rate` requests/s for `spec.seconds`; returns outcomes and the
    generator's p99 launch lag in ms (a lag near the latencies means the
    generator, not the mesh, was the limit)."""
    rng = random.Random(spec.seed)
    classes = list(spec.mix)
    weights = [spec.mix[c] for c in classes]
    payloads = {
        c: [encode_request(host, c, f"u{rng.randrange(spec.users)}", spec.count, spec.api_keys.get(c))
            for _ in range(256)]
        for c in classes
    }  # fmt: skip
    pool = _Pool(host, port, spec.max_conns)
    outcomes: list[Outcome] = []
    lags: list[float] = []
    tasks: set[asyncio.Task[None]] = set()

    async def one(slo_class: str, payload: bytes, scheduled: float) -> None:
        status, granted, degraded, error = 0, "", False, ""
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                status, headers, body = await pool.send(payload)
            granted = headers.get(SLO_HEADER.encode(), b"").decode()
            degraded = status == 200 and b'"degraded":[]' not in body
        except (OSError, TimeoutError, ConnectionError, asyncio.IncompleteReadError, ValueError) as e:
            status, error = 0, f"{type(e).__name__}: {e}"
        outcomes.append(Outcome(slo_class, status, time.perf_counter() - scheduled, degraded, granted, error))

    n = int(spec.rate * spec.seconds)
    interval = 1.0 / spec.rate
    start = time.perf_counter() + 0.01
    i = 0
    while i < n:
        now = time.perf_counter()
        while i < n and start + i * interval <= now:
            scheduled = start + i * interval
            lags.append(now - scheduled)
            slo_class = rng.choices(classes, weights)[0]
            payload = payloads[slo_class][i % 256]
            task = asyncio.create_task(one(slo_class, payload, scheduled))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
        if i < n:
            await _until(start + i * interval, spin=spec.rate <= SPIN_MAX_RATE)
    if tasks:
        await asyncio.wait(set(tasks), timeout=REQUEST_TIMEOUT_S + 1)
    pool.close()
    return outcomes, percentile(lags, 99) * 1000 if lags else 0.0


def summarise(
    outcomes: Sequence[Outcome], rate: float, seconds: float, budgets_ms: Mapping[str, int] | None = None
) -> StepResult:
    budgets = budgets_ms or {n: c.budget_ms for n, c in configured_classes().items()}
    result = StepResult(rate, seconds)
    by_class: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by_class.setdefault(o.slo_class, []).append(o)
    for slo_class, rows in sorted(by_class.items()):
        ok = [o for o in rows if o.status == 200]
        lat = [o.latency_s for o in ok]
        budget_s = budgets.get(slo_class, 3000) / 1000
        within = sum(1 for o in ok if o.latency_s <= budget_s)
        shed = sum(1 for o in rows if o.status == 429)
        result.classes[slo_class] = ClassSummary(
            slo_class=slo_class,
            offered=len(rows),
            ok=len(ok),
            shed=shed,
            errors=len(rows) - len(ok) - shed,
            degraded=sum(1 for o in ok if o.degraded),
            within_budget=within,
            p50_ms=percentile(lat, 50) * 1000,
            p95_ms=percentile(lat, 95) * 1000,
            p99_ms=percentile(lat, 99) * 1000,
            goodput_rps=within / seconds,
            shed_rate=shed / len(rows),
            goodput_ratio=within / len(rows),
        )
    result.total_ok_rps = sum(c.ok for c in result.classes.values()) / seconds
    return result


async def closed_loop(
    host: str, port: int, concurrency: int, seconds: float, slo_class: str, api_key: str | None
) -> float:
    """Answered requests/s with `concurrency` callers sending back to back: the capacity estimate."""
    rng = random.Random(0)
    payloads = [encode_request(host, slo_class, f"u{rng.randrange(2000)}", 10, api_key) for _ in range(64)]
    pool = _Pool(host, port, concurrency)
    done = 0
    deadline = time.perf_counter() + seconds

    async def caller(k: int) -> None:
        nonlocal done
        i = k
        while time.perf_counter() < deadline:
            try:
                status, _, _ = await pool.send(payloads[i % len(payloads)])
            except (OSError, asyncio.IncompleteReadError):
                status = 0  # a reset connection is not an answer; the estimate goes on
            done += status == 200
            i += concurrency

    started = time.perf_counter()
    await asyncio.gather(*(caller(k) for k in range(concurrency)))
    pool.close()
    return done / (time.perf_counter() - started)
