"""The gateway's HTTP app: FastAPI, with POST /v1/recommend served in front of it.

`create_app` returns a `GatewayApp`, the ASGI app uvicorn serves: a FastAPI
app whose `__call__` hands POST /v1/recommend straight to its lean route
(`RecommendRoute`, recommend_route.py), before FastAPI's middleware stack;
FastAPI's router knows the route too (its document, 405 for other methods)
and would hand it the same requests.

Every route takes its caller and admission from the edge (edge.py), and
errors are answered as `edge.error_answer` says: RecmeshError -> its HTTP
status with an RFC 9457 problem body (edge.error_json); request validation -> 400
naming the bad field; FastAPI's and Starlette's own refusals (an
unparseable body, 404, 405) -> the same body.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from recmesh.admission import AdmissionGate
from recmesh.errors import InvalidArgument, RecmeshError
from recmesh.events import Event, EventSchema, conform
from recmesh.settings import GatewaySettings
from recmesh.telemetry import http_semconv_mode
from services.gateway import openapi
from services.gateway.ai_tool_calls import AiTools, build_tool_gate
from services.gateway.ai_tool_routes import build_router as build_ai_tool_router
from services.gateway.edge import (
    PROBLEM_JSON,
    ClassPolicy,
    Edge,
    RecordLatency,
    error_answer,
    error_json,
    traceparent,
    validation_message,
)
from services.gateway.event_publisher import EventPublisher
from services.gateway.readiness import HealthCheck, Readiness
from services.gateway.recommend import Recommender
from services.gateway.recommend_route import PATH, RecommendOut, RecommendRoute

# Error names of the statuses that recmesh's own errors also answer (recmesh/errors.py).
_HTTP_ERROR_NAMES = {400: "InvalidArgument", 401: "Unauthenticated", 404: "NotFound"}


class EventsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    events: list[Event] = Field(min_length=1)


class EventsOut(BaseModel):
    accepted: int


class HealthOut(BaseModel):
    status: str = Field(examples=["alive"])


class FallbackOut(BaseModel):
    items: int = Field(description="popular items the gateway holds for when the ranker cannot answer")
    age_s: float | None = Field(description="seconds since the list was received (null: none yet)")


class ReadyOut(BaseModel):
    ready: bool
    checks: dict[str, bool] = Field(description="each downstream's health (SERVING) and the event broker's")
    fallback: FallbackOut


@dataclass
class GatewayDeps:
    recommender: Recommender
    class_policy: ClassPolicy
    publisher: EventPublisher
    downstream_health: dict[str, HealthCheck]
    ai_tools: AiTools | None = None  # /v2/ai-tool/* (services/gateway/ai_tool_calls.py)
    # The repository's behaviours and event values (None: accept any behaviour).
    event_schema: EventSchema | None = None
    gate: AdmissionGate | None = None  # /v1/recommend's admission; None admits everything
    # The AI tools' admission (None: `build_tool_gate` from the settings).
    tool_gate: AdmissionGate | None = None


class GatewayApp(FastAPI):
    """The gateway's ASGI app. POST /v1/recommend skips FastAPI's per-request
    machinery, which cost about as much gateway CPU as the rest of the request
    (recommend_route.py): it goes straight to `recommend`."""

    def __init__(self, recommend: ASGIApp, readiness: Readiness, **fastapi: Any) -> None:
        super().__init__(**fastapi)
        self.recommend = recommend
        self.readiness = readiness

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == PATH and scope["method"] == "POST":
            await self.recommend(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(settings: GatewaySettings, deps: GatewayDeps) -> GatewayApp:
    """The gateway's HTTP app: POST /v1/recommend by `RecommendRoute`, every other route by FastAPI."""
    recommend = RecommendRoute(Edge(deps.class_policy, deps.gate), deps.recommender)
    app = GatewayApp(
        recommend,
        Readiness(deps.downstream_health, deps.publisher, deps.recommender),
        title="recmesh gateway",
        version="1",
        description="Real-time recommendations and event ingestion. Send `x-slo-class` "
        "(A, B or C) and a W3C `traceparent` with every request.",
    )
    _answer_errors(app)
    _add_recommend(app, recommend)
    _add_events(app, settings, deps)
    if deps.ai_tools is not None:
        tool_gate = deps.tool_gate or build_tool_gate(settings.ai_tool)
        app.include_router(build_ai_tool_router(deps.ai_tools, Edge(deps.class_policy, tool_gate)))
    _add_probes(app)
    app.add_middleware(RecordLatency)
    # One SERVER span per request; the ASGI "http send/receive" child spans say
    # nothing a trace needs and cost as much as the server span each. The
    # stable HTTP conventions, as RecommendRoute's span: the opt-in is set
    # before the instrumentation reads it (once per process).
    http_semconv_mode()
    FastAPIInstrumentor.instrument_app(app, excluded_urls="healthz,readyz", exclude_spans=["receive", "send"])
    openapi.install(app, *_document_limits(settings, deps))
    return app


def _answer_errors(app: FastAPI) -> None:
    """Every error as `edge.error_answer` says: recmesh's own, request validation
    (400 naming the field), and FastAPI's and Starlette's refusals."""

    @app.exception_handler(RecmeshError)
    async def recmesh_error(request: Request, err: RecmeshError) -> Response:
        # A shed call says which class was shed, as /v1/recommend's 429 does.
        answer = error_answer(err, getattr(request.state, "slo_class", None))
        headers = {**dict(answer.headers), **traceparent()}
        return Response(answer.body, answer.http_status, headers, media_type=PROBLEM_JSON)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, err: RequestValidationError) -> Response:
        answer = error_answer(InvalidArgument(validation_message(err.errors())))
        return Response(answer.body, answer.http_status, media_type=PROBLEM_JSON)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> Response:
        # FastAPI's and Starlette's own refusals (a body that cannot be parsed,
        # 404, 405 with its Allow header) in the same shape as every other error.
        name = _HTTP_ERROR_NAMES.get(err.status_code) or HTTPStatus(err.status_code).phrase.replace(" ", "")
        body = error_json(name, err.detail, err.status_code)
        return Response(body, err.status_code, err.headers, media_type=PROBLEM_JSON)


def _add_recommend(app: FastAPI, recommend: RecommendRoute) -> None:
    """POST /v1/recommend in FastAPI's router: documented as `openapi.recommend`
    declares it, served by the same `RecommendRoute` (which GatewayApp calls first)."""
    route = APIRoute(
        PATH,
        openapi.recommend,
        methods=["POST"],
        response_model=RecommendOut,
        responses=openapi.RECOMMEND_RESPONSES,
        openapi_extra=openapi.operation(openapi.CLASS_HEADERS),
    )
    route.app = recommend
    app.router.routes.append(route)


def _add_events(app: FastAPI, settings: GatewaySettings, deps: GatewayDeps) -> None:
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
        response.headers.update(traceparent())
        return EventsOut(accepted=len(body.events))


def _add_probes(app: GatewayApp) -> None:
    @app.get("/healthz")
    async def healthz() -> HealthOut:
        """Liveness: the process answers."""
        return HealthOut(status="alive")

    @app.get(
        "/readyz",
        responses={
            200: {"model": ReadyOut, "description": "this gateway can answer (readiness.py)"},
            503: {"model": ReadyOut, "description": "it cannot: no ranker and no fallback held"},
        },
    )
    async def readyz() -> JSONResponse:
        """Readiness of this process: the ranker SERVING or a popular fallback held. Every
        downstream's health and the event broker's are in `checks`, whatever the answer."""
        state = await app.readiness.state()
        return JSONResponse(state.body(), status_code=200 if state.ready else 503)


def _document_limits(
    settings: GatewaySettings, deps: GatewayDeps
) -> tuple[list[openapi.Limit], dict[str, dict[str, Any]]]:
    """What this deployment writes into the OpenAPI document: its limits and the
    served repository's vocabulary (aliases included) and numeric event values."""
    limits: list[openapi.Limit] = [
        ("RecommendBody", "count", "maximum", settings.max_count),
        ("EventsBody", "events", "maxItems", settings.max_events_per_request),
    ]
    if deps.ai_tools is not None:
        limits.append(("SummarizeBody", "text", "maxLength", settings.ai_tool.max_text_chars))
    properties: dict[str, dict[str, Any]] = {}
    schema = deps.event_schema
    if schema is not None:
        limits.append(("Event", "behavior", "enum", schema.accepted))
        properties["Event"] = {
            name: {"type": "number", "description": "a numeric event value the repository declares"}
            for name in schema.values
        }
    return limits, properties
