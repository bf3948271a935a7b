"""Redis connections with a bounded pool and socket timeouts (design notes:
bound the Redis connection pool and timeouts).

`REDIS_URL=redis://host:port/0` connects to one server;
`REDIS_URL=redis+cluster://host:port` to a Redis Cluster through any of its
nodes. Feature keys are hash-tagged, so one entity's keys share a slot.

RESP2, not redis-py 8's default RESP3: with RESP3 every score of a
WITHSCORES reply is re-encoded to bytes and parsed again to keep the legacy
reply shapes (about a tenth of the look-up's client-side decoding).

No client-side retries: callers hold a per-request budget (often 50 ms) and a
fallback, so a retry inside the client would only spend the budget twice. The
ingest consumer retries at its own layer, with backoff, around whole batches.

Credentials: each process's own ACL user and TLS files from its environment
(recmesh.credentials.RedisAuth: REDIS_USERNAME, REDIS_PASSWORD[_FILE],
REDIS_TLS_CA), never in the URL the shared ConfigMap holds.
"""

from __future__ import annotations

import redis.asyncio as redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from recmesh.credentials import RedisAuth

AnyRedis = redis.Redis | RedisCluster

CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")


def is_cluster_url(url: str) -> bool:
    return url.startswith(CLUSTER_SCHEMES)


def connect(url: str, max_connections: int, auth: RedisAuth | None = None) -> AnyRedis:
    """`auth`: None reads this process's credentials from its environment."""
    options = (auth or RedisAuth()).client_options(url)
    if is_cluster_url(url):
        return RedisCluster.from_url(
            url.replace("+cluster", "", 1),
            max_connections=max_connections,
            socket_connect_timeout=1.0,
            socket_timeout=2.0,
            retry=Retry(NoBackoff(), 0),
            protocol=2,
            **options,
        )
    return redis.Redis.from_url(
        url,
        max_connections=max_connections,
        socket_connect_timeout=1.0,
        socket_timeout=2.0,
        health_check_interval=30,
        retry=Retry(NoBackoff(), 0),
        protocol=2,
        **options,
    )
