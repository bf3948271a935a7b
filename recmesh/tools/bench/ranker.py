"""`recmesh bench ranker`: latency of Rank calls against a running ranker.

Sends `calls` Rank requests one after another (after `warmup` unmeasured ones)
for users PREFIX0..PREFIX(N-1) (the demo's u0.., or another repository's ids
with --user-prefix ''), each in a request scope of the chosen SLO class, and prints
p50/p95/p99 and how often each degradation was reported. Run it against a mesh
started with `recmesh up` (RANKER_ADDR or --addr).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from recmesh.clients.ranker import RankerClient
from recmesh.errors import RecmeshError
from recmesh.resilience import request_scope
from recmesh.settings import configured_classes
from recmesh.stats import percentile
from recmesh.tools.bench.common import emit


async def bench_ranker(
    addr: str, calls: int, warmup: int, slo_class: str, count: int, users: int, user_prefix: str = "u"
) -> dict[str, Any]:
    client = RankerClient(addr, "bench")
    budget_s = configured_classes()[slo_class].budget_ms / 1000
    latencies: list[float] = []
    degraded: Counter[str] = Counter()
    errors = 0
    try:
        for n in range(warmup + calls):
            user = f"{user_prefix}{(n * 7919) % users}"
            started = time.perf_counter()
            try:
                with request_scope(slo_class, budget_s):
                    resp = await client.rank(user, count, {}, int(time.time() * 1000))
            except RecmeshError:  # a failed call is counted, not fatal
                errors += 1
                continue
            if n >= warmup:
                latencies.append((time.perf_counter() - started) * 1000)
                degraded.update(resp.degraded)
    finally:
        await client.close()
    return {
        "calls": len(latencies),
        "errors": errors,
        "slo_class": slo_class,
        "p50_ms": round(percentile(latencies, 50), 2),
        "p95_ms": round(percentile(latencies, 95), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "degraded": dict(degraded.most_common()),
    }


def main(args: Any) -> int:
    from recmesh.settings import GatewaySettings

    addr = args.addr or GatewaySettings().ranker_addr
    slo_class, count = args.slo_class, args.count
    figures = asyncio.run(
        bench_ranker(addr, args.calls, args.warmup, slo_class, count, args.users, args.user_prefix)
    )
    table = (
        f"Rank x{figures['calls']} (class {slo_class}, count {count}) against {addr}: "
        f"p50 {figures['p50_ms']} ms  p95 {figures['p95_ms']} ms  p99 {figures['p99_ms']} ms  "
        f"errors {figures['errors']}\n  degraded: {figures['degraded'] or 'none'}"
    )
    emit(figures, args.json, table)
    return 0 if figures["errors"] == 0 else 1
