"""Redis connections with a bounded pool and socket timeouts (design notes:
bound the Redis connection pool and timeouts).

No client-side retries: callers hold a per-request budget (often 50 ms) and a
fallback, so a retry inside the client would only spend the budget twice. The
ingest consumer retries at its own layer, with backoff, around whole batches.
"""

from __future__ import annotations

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff


def connect(url: str, max_connections: int) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        max_connections=max_connections,
        socket_connect_timeout=1.0,
        socket_timeout=2.0,
        health_check_interval=30,
        retry=Retry(NoBackoff(), 0),
    )
