"""The FastAPI application: REST endpoints, health, metrics.

Errors are translated once, here: RecmeshError -> its HTTP status with a JSON
body {"error", "message"}; request validation -> 400 naming the bad field;
FastAPI's and Starlette's own refusals (an unparseable body, 404, 405) -> the
same body. POST /v1/recommend is served in front of FastAPI by
`RecommendRoute` (recommend_route.py) with the same contract; the FastAPI
route below only documents it (OpenAPI, with the headers and answers declared
in openapi.py): `create_app` always puts the front before it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from opentelemetry import propagate
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from recmesh.errors import InvalidArgument, RecmeshError
from recmesh.events import Event, EventSchema, conform
from recmesh.settings import GatewaySettings
from recmesh.slo import SLO_HEADER
from recmesh.telemetry import REQUEST_LATENCY
from services.gateway import openapi
from services.gateway.ai_tool_calls import AiTools
from services.gateway.ai_tool_routes import build_router as build_ai_tool_router
from services.gateway.event_publisher import EventPublisher
from services.gateway.recommend import ClassPolicy, Recommender
from services.gateway.recommend_route import RecommendBody, RecommendRoute, validation_message

HealthCheck = Callable[[], Awaitable[bool]]

# Error names of the statuses that recmesh's own errors also answer (recmesh/errors.py).
_HTTP_ERROR_NAMES = {400: "InvalidArgument", 401: "Unauthenticated", 404: "NotFound"}


class ScoredItemOut(BaseModel):
    item_id: str
    score: float


class RecommendOut(BaseModel):
    items: list[ScoredItemOut]
    slo_class: str
    trace_id: str
    model_version: str
    feature_version: str
    degraded: list[str]


class EventsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    events: list[Event] = Field(min_length=1)


class EventsOut(BaseModel):
    accepted: int


class HealthOut(BaseModel):
    status: str = Field(examples=["alive"])


class ReadyOut(BaseModel):
    ready: bool
    checks: dict[str, bool] = Field(description="each downstream's health (SERVING) and the event broker's")


@dataclass
class GatewayDeps:
    recommender: Recommender
    class_policy: ClassPolicy
    publisher: EventPublisher
    downstream_health: dict[str, HealthCheck]
    ai_tools: AiTools | None = None  # /v2/ai-tool/* (services/gateway/ai_tool_calls.py)
    # The repository's behaviours and event values (None: accept any behaviour).
    event_schema: EventSchema | None = None


def _trace_headers() -> dict[str, str]:
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {k: v for k, v in carrier.items() if k == "traceparent"}


class RecordLatency:
    """Pure ASGI middleware: `recmesh_request_duration_seconds` per route, class
    and status. (Starlette's `@app.middleware("http")` would run every request
    through a task group and memory streams, a large share of a gateway hop.)"""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._app(scope, receive, send_status)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")
            slo = scope.get("state", {}).get("slo_class", "none")
            REQUEST_LATENCY.labels("gateway", f"{scope['method']} {path}", slo, str(status)).observe(
                time.perf_counter() - started
            )


def create_app(settings: GatewaySettings, deps: GatewayDeps) -> RecommendRoute:
    """The gateway's ASGI app: POST /v1/recommend served by `RecommendRoute`
    (recommend_route.py), every other route by FastAPI."""
    app = FastAPI(
        title="recmesh gateway",
        version="1",
        description="Real-time recommendations and event ingestion. Send `x-slo-class` "
        "(A, B or C) and a W3C `traceparent` with every request.",
    )
    ready_cache: dict[str, Any] = {"at": 0.0, "body": None}

    @app.exception_handler(RecmeshError)
    async def recmesh_error(request: Request, err: RecmeshError) -> JSONResponse:
        headers = _trace_headers()
        retry_after = getattr(err, "retry_after_s", None)
        if retry_after is not None:
            headers["retry-after"] = str(retry_after)
            # A shed call says which class was shed, as /v1/recommend's 429 does.
            granted = getattr(request.state, "slo_class", None)
            if granted in ("A", "B", "C"):
                headers[SLO_HEADER] = granted
        return JSONResponse(
            {"error": type(err).__name__, "message": str(err)},
            status_code=err.http_status,
            headers=headers,
        )

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, err: RequestValidationError) -> JSONResponse:
        return JSONResponse(
            {"error": "InvalidArgument", "message": validation_message(err.errors())}, status_code=400
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        # FastAPI's and Starlette's own refusals (a body that cannot be parsed,
        # 404, 405 with its Allow header) in the same shape as every other error.
        name = _HTTP_ERROR_NAMES.get(err.status_code) or HTTPStatus(err.status_code).phrase.replace(" ", "")
        return JSONResponse({"error": name, "message": err.detail}, err.status_code, headers=err.headers)

    @app.post(
        "/v1/recommend",
        response_model=RecommendOut,
        responses=openapi.RECOMMEND_RESPONSES,
        openapi_extra=openapi.operation(openapi.CLASS_HEADERS),
    )
    async def recommend(body: RecommendBody) -> RecommendOut:
        """Recommendations for one user, ranked within the request's SLO class budget.

        `degraded` lists every fallback taken and class notes such as
        `slo_class_downgraded:A->B`; an empty list is a full answer."""
        # Declared for the OpenAPI document only: `create_app` puts
        # `RecommendRoute` in front, which serves every POST /v1/recommend.
        raise AssertionError("POST /v1/recommend is served by RecommendRoute")

    @app.post(
        "/v1/events",
        status_code=202,
        response_model=EventsOut,
        responses=openapi.EVENTS_RESPONSES,
        openapi_extra=openapi.operation(openapi.TRACE_HEADERS),
    )
    async def events(body: EventsBody, response: Response) -> EventsOut:
        """User-behaviour events, accepted once the broker acknowledged all of them (acks=all)."""
        if len(body.events) > settings.max_events_per_request:
            raise InvalidArgument(f"at most {settings.max_events_per_request} events per request")
        schema = deps.event_schema
        events = body.events if schema is None else [
            conform(e, schema, f"events[{n}]") for n, e in enumerate(body.events)
        ]  # fmt: skip
        await deps.publisher.publish(events)
        response.headers.update(_trace_headers())
        return EventsOut(accepted=len(body.events))

    if deps.ai_tools is not None:
        app.include_router(build_ai_tool_router(deps.ai_tools, deps.class_policy))

    @app.get("/healthz")
    async def healthz() -> HealthOut:
        """Liveness: the process answers."""
        return HealthOut(status="alive")

    @app.get(
        "/readyz",
        responses={
            200: {"model": ReadyOut, "description": "every downstream is SERVING and the broker answers"},
            503: {"model": ReadyOut, "description": "not ready: `checks` says which part is not"},
        },
    )
    async def readyz() -> JSONResponse:
        """Readiness: every downstream reports SERVING and the event broker answers."""
        now = time.monotonic()
        if ready_cache["body"] is None or now - ready_cache["at"] > 1.0:
            names = list(deps.downstream_health)
            results = await asyncio.gather(*(deps.downstream_health[n]() for n in names))
            checks = dict(zip(names, results, strict=True))
            if not deps.publisher.ready:
                await deps.publisher.start()
            checks["event_broker"] = deps.publisher.ready
            ready_cache.update(at=now, body=checks)
        checks = ready_cache["body"]
        ok = all(checks.values())
        return JSONResponse({"ready": ok, "checks": checks}, status_code=200 if ok else 503)

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    async def metrics() -> Response:
        """Prometheus metrics (text exposition format)."""
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(RecordLatency)
    # One SERVER span per request; the ASGI "http send/receive" child spans say
    # nothing a trace needs and cost as much as the server span each.
    FastAPIInstrumentor.instrument_app(
        app, excluded_urls="healthz,readyz,metrics", exclude_spans=["receive", "send"]
    )
    limits: list[openapi.Limit] = [
        ("RecommendBody", "count", "maximum", settings.max_count),
        ("EventsBody", "events", "maxItems", settings.max_events_per_request),
    ]
    if deps.ai_tools is not None:
        limits.append(("SummarizeBody", "text", "maxLength", settings.ai_tool.max_text_chars))
    properties: dict[str, dict[str, Any]] = {}
    schema = deps.event_schema
    if schema is not None:
        # The served repository's vocabulary (aliases included) and numeric event values.
        limits.append(("Event", "behavior", "enum", schema.accepted))
        properties["Event"] = {
            name: {"type": "number", "description": "a numeric event value the repository declares"}
            for name in schema.values
        }
    openapi.install(app, limits, properties)
    return RecommendRoute(app, deps.recommender, deps.class_policy)
