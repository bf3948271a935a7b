"""`recmesh up | init | health`: run the whole mesh on this machine, prepare
external Redis and Kafka for one, and probe a service."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any


def _cmd_up(args: argparse.Namespace) -> int:
    from recmesh.settings import UpSettings
    from recmesh.tools.up import run

    return asyncio.run(run(UpSettings(), args.demo_events, fresh=args.fresh))


def _cmd_init(args: argparse.Namespace) -> int:
    """Topics and the catalog for a mesh whose Redis and Kafka run elsewhere."""
    from recmesh.settings import UpSettings
    from recmesh.tools.catalog import load_catalog_files
    from recmesh.tools.cli.common import refuse_demo, repository
    from recmesh.tools.up import Mesh
    from recmesh.topics import ensure_topics

    settings = UpSettings()
    if settings.redis_url is None or settings.kafka_bootstrap is None:
        print("recmesh init: set REDIS_URL and KAFKA_BOOTSTRAP", file=sys.stderr)
        return 2
    feature_set = repository(args)
    refuse_demo(feature_set, args, "recmesh init")
    mesh = Mesh(settings)

    async def init() -> dict[str, Any]:
        await ensure_topics(mesh.kafka, mesh.topics(), timeout_s=args.wait)
        return await load_catalog_files(feature_set, mesh.redis_url, None, None, print)

    figures = asyncio.run(init())
    print(f"topics created; catalog of repository {feature_set.name!r} loaded: {figures['users']} users, "
          f"{figures['items']} items")  # fmt: skip
    return 0


def _cmd_health(args: argparse.Namespace) -> int:
    """Exit 0 when the target is ready: gRPC health SERVING, or HTTP 200."""
    if args.http:
        import httpx

        try:
            status = httpx.get(args.http, timeout=args.timeout).status_code
        except httpx.HTTPError as err:
            print(f"recmesh health: {args.http} unreachable: {err!r}", file=sys.stderr)
            return 1
        if status != 200:
            print(f"recmesh health: {args.http} answered {status}", file=sys.stderr)
        return 0 if status == 200 else 1
    from recmesh.clients.base import GrpcClient

    async def check() -> bool:
        client = GrpcClient(args.grpc, "health")
        try:
            return await client.health(args.timeout)
        finally:
            await client.close()

    if asyncio.run(check()):
        return 0
    print(f"recmesh health: {args.grpc} is not SERVING (or not reachable)", file=sys.stderr)
    return 1


def add_commands(sub: Any) -> None:
    up = sub.add_parser("up", help="start the whole mesh on this machine")
    up.add_argument("--demo-events", type=int, default=3000, help="demo events to send once ready (0: none)")
    up.add_argument(
        "--fresh", action="store_true",
        help="start with an empty Redis: delete the embedded Redis's data from earlier runs first",
    )  # fmt: skip
    up.set_defaults(func=_cmd_up)

    init = sub.add_parser("init", help="create topics and load the catalog (external Redis/Kafka)")
    init.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the broker")
    init.add_argument("--repository", help="the repository file (default: RECMESH_REPOSITORY)")
    init.add_argument("--demo", action="store_true", help="allow loading the demo repository's catalog")
    init.set_defaults(func=_cmd_init)

    health = sub.add_parser("health", help="probe a service: exit 0 when ready")
    target = health.add_mutually_exclusive_group(required=True)
    target.add_argument("--grpc", help="host:port of a gRPC service (grpc.health.v1)")
    target.add_argument("--http", help="URL that must answer 200, e.g. the gateway's /readyz")
    health.add_argument("--timeout", type=float, default=2.0)
    health.set_defaults(func=_cmd_health)
