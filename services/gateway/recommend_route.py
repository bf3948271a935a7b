"""POST /v1/recommend as a plain ASGI app, served before FastAPI's machinery.

The hot endpoint skips FastAPI's and Starlette's per-request machinery (the
middleware stack, dependency solving, the response model round trip), which
cost about as much gateway CPU as the rest of the request: the gateway's app
(`GatewayApp`, app.py) hands it every POST /v1/recommend before that stack.
What that machinery did is done here, once, with the edge (edge.py):

- a recommendation the admission gate would shed anyway is answered 429
  (+ Retry-After and the class) before the body is read (counted in
  `recmesh_admission_shed_total` and the latency histogram, not traced);
- one SERVER span per request, continuing the caller's `traceparent`, and the
  `traceparent` of the answer in the response headers; named and attributed as
  the FastAPI instrumentation does its routes' (`POST /v1/recommend`,
  `http.route`, and the request's and status's attributes by the same
  functions, in the process's HTTP stability mode: telemetry.http_semconv_mode);
- the body is validated by the same pydantic model (`RecommendBody`): a
  non-JSON content type, bad JSON or a bad field is a 400 naming the field;
  bodies over `MAX_BODY_BYTES` are a 413;
- the class decision (entitlement) as in every route: an unknown class or a
  malformed header is a 400, an unknown key a 401, a downgrade is noted in
  `degraded`;
- errors are answered as `edge.error_answer` says; anything outside recmesh's
  errors is a logged 500;
- `recmesh_request_duration_seconds` by route, class and status.

FastAPI still holds the route (its document, and 405 for other methods): its
requests go to this same app (app.py), and the headers read here and the
answers made here are declared in `openapi.py`.
"""

from __future__ import annotations

import time

import orjson
import structlog
from opentelemetry import propagate, trace
from opentelemetry.instrumentation.asgi import collect_request_attributes, set_status_code
from opentelemetry.semconv.attributes.http_attributes import HTTP_ROUTE
from opentelemetry.trace import SpanKind
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.types import Receive, Scope, Send

from recmesh.errors import InvalidArgument, RecmeshError
from recmesh.jsontypes import JsonInt
from recmesh.metadata import REQUEST_ID_HEADER, SLO_HEADER
from recmesh.telemetry import http_semconv_mode
from services.gateway.edge import (
    PROBLEM_JSON,
    REFUSED,
    Caller,
    Edge,
    error_answer,
    record_latency,
    traceparent,
    validation_message,
)
from services.gateway.recommend import Recommendation, Recommender

PATH = "/v1/recommend"
ROUTE = f"POST {PATH}"
MAX_BODY_BYTES = 64 * 1024

_PROBLEM = PROBLEM_JSON.encode()
_log = structlog.get_logger("recmesh.gateway")
_tracer = trace.get_tracer("recmesh.gateway")

Headers = list[tuple[bytes, bytes]]


class RecommendBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_id: str = Field(min_length=1, max_length=128)
    count: JsonInt = Field(10, ge=1)  # at most RECMESH_MAX_COUNT: Recommender checks it, openapi says it
    context: dict[str, str] = Field(default_factory=dict)


class ScoredItemOut(BaseModel):
    item_id: str
    score: float


# The answer as `recommendation_json` writes it, declared for the OpenAPI document
# (no docstring: it would become the schema's description).
class RecommendOut(BaseModel):
    items: list[ScoredItemOut]
    slo_class: str
    trace_id: str
    model_version: str
    feature_version: str
    degraded: list[str]
    request_id: str = Field(
        description="this answer's id (also the x-request-id header): send it back on the events it "
        "leads to (POST /v1/events, request_id) so clicks are credited to it exactly"
    )


class PayloadTooLarge(RecmeshError):
    http_status = 413


def is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    mime = content_type.split(";", 1)[0].strip().lower()
    return mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))


def recommendation_json(rec: Recommendation) -> bytes:
    return orjson.dumps(
        {
            "items": [{"item_id": i, "score": s} for i, s in rec.items],
            "slo_class": rec.slo_class,
            "trace_id": rec.trace_id,
            "model_version": rec.model_version,
            "feature_version": rec.feature_version,
            "degraded": rec.degraded,
            "request_id": rec.request_id,
        }
    )


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InvalidArgument("the client went away before the body was read")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the body exceeds {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class RecommendRoute:
    """The ASGI app of POST /v1/recommend (every request it is given is one)."""

    def __init__(self, edge: Edge, recommender: Recommender, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self._edge = edge
        self._recommender = recommender
        self._max_body_bytes = max_body_bytes
        self._semconv = http_semconv_mode()  # the one FastAPIInstrumentor's spans follow

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        headers: dict[str, str] = {}
        for k, v in scope["headers"]:  # the first of repeated headers wins, as in Starlette
            headers.setdefault(k.decode("latin-1"), v.decode("latin-1"))
        caller: Caller | None = None
        refused: RecmeshError | None = None
        try:
            caller = self._edge.http_caller(headers)
        except RecmeshError as err:
            refused = err
        if caller is not None:
            shed = self._edge.shed_now(caller)
            if shed is not None:
                granted = caller.slo.name
                answer = error_answer(shed, granted)
                await self._respond(send, answer.http_status, answer.body, answer.headers)
                record_latency(ROUTE, granted, answer.http_status, started)
                return
        slo_label = "none"  # the body was not valid
        status = 500
        with _tracer.start_as_current_span(
            ROUTE, context=propagate.extract(headers), kind=SpanKind.SERVER
        ) as span:
            if span.is_recording():  # an unsampled request skips building them (~8 µs)
                span.set_attributes(collect_request_attributes(scope, self._semconv))  # type: ignore[no-untyped-call]
                span.set_attribute(HTTP_ROUTE, PATH)
            extra: list[tuple[str, str]] = []
            try:
                body = self._parse(await _read_body(receive, self._max_body_bytes), headers)
                slo_label = REFUSED  # the class, the key or a header was refused
                if caller is None:
                    assert refused is not None
                    raise refused
                slo_label = caller.slo.name
                self._recommender.check(body.user_id, body.count)
                async with self._edge.admit(caller) as admitted:
                    rec = await self._recommender.recommend(body.user_id, body.count, body.context, admitted)
                payload = recommendation_json(rec)
                status = 200
                extra += [(SLO_HEADER, caller.slo.name), (REQUEST_ID_HEADER, rec.request_id)]
            except Exception as err:
                answer = error_answer(err, None if caller is None else caller.slo.name)
                status, payload, extra = answer.http_status, answer.body, answer.headers
                if not isinstance(err, RecmeshError):  # answered 500, logged with its trace
                    _log.exception("unhandled_error", route=ROUTE, error=repr(err))
                    span.record_exception(err)
            # ERROR (and error.type) from 500 on, as the instrumentation's.
            set_status_code(span, status, None, self._semconv)  # type: ignore[no-untyped-call]
            await self._respond(send, status, payload, extra)
        record_latency(ROUTE, slo_label, status, started)

    def _parse(self, raw: bytes, headers: dict[str, str]) -> RecommendBody:
        if not is_json(headers.get("content-type")):
            raise InvalidArgument("body: the content-type must be application/json")
        try:
            return RecommendBody.model_validate_json(raw)
        except ValidationError as err:
            raise InvalidArgument(validation_message(err.errors())) from err

    @staticmethod
    async def _respond(send: Send, status: int, payload: bytes, extra: list[tuple[str, str]]) -> None:
        """The answer, with the current trace's `traceparent`."""
        response_headers: Headers = [
            (b"content-type", b"application/json" if status < 400 else _PROBLEM),
            (b"content-length", str(len(payload)).encode()),
            *((k.encode(), v.encode()) for k, v in extra),
            *((k.encode(), v.encode()) for k, v in traceparent().items()),
        ]
        await send({"type": "http.response.start", "status": status, "headers": response_headers})
        await send({"type": "http.response.body", "body": payload})
