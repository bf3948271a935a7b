"""POST /v1/recommend as a plain ASGI route in front of the FastAPI app.

The hot endpoint skips FastAPI's and Starlette's per-request machinery (the
middleware stack, dependency solving, the response model round trip), which
cost about as much gateway CPU as the rest of the request. What that machinery
did is done here, once:

- a recommendation the admission gate would shed anyway is answered 429
  (+ Retry-After and the class) before the body is read (counted in
  `recmesh_admission_shed_total` and the latency histogram, not traced);
- one SERVER span per request, continuing the caller's `traceparent`, and the
  `traceparent` of the answer in the response headers;
- the body is validated by the same pydantic model (`RecommendBody`): a
  non-JSON content type, bad JSON or a bad field is a 400 naming the field;
  bodies over `MAX_BODY_BYTES` are a 413;
- the class decision (entitlement) as in every route: an unknown class is a
  400, an unknown key a 401, a downgrade is noted in `degraded`;
- `RecmeshError`s become their HTTP status with `{"error", "message"}`;
  anything else is a logged 500;
- `recmesh_request_duration_seconds` by route, class and status.

Every other path and method goes on to the FastAPI app, which still declares
the route for its OpenAPI document (`services/gateway/app.py`; the headers
read here and the answers made here are declared in `openapi.py`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import structlog
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from recmesh.admission import AdmissionGate
from recmesh.errors import InvalidArgument, RecmeshError
from recmesh.jsontypes import JsonInt
from recmesh.metadata import TIMEOUT_HEADER
from recmesh.resilience import request_scope
from recmesh.slo import ClassDecision, parse_timeout_s
from recmesh.telemetry import REQUEST_LATENCY
from services.gateway.recommend import ClassPolicy, Recommendation, Recommender

PATH = "/v1/recommend"
ROUTE = f"POST {PATH}"
MAX_BODY_BYTES = 64 * 1024

_log = structlog.get_logger("recmesh.gateway")
_tracer = trace.get_tracer("recmesh.gateway")

Headers = list[tuple[bytes, bytes]]


class RecommendBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_id: str = Field(min_length=1, max_length=128)
    count: JsonInt = Field(10, ge=1)  # at most RECMESH_MAX_COUNT: Recommender checks it, openapi says it
    context: dict[str, str] = Field(default_factory=dict)


class PayloadTooLarge(RecmeshError):
    http_status = 413


def field_path(loc: tuple[Any, ...]) -> str:
    """A validation error's location as `a.b[0]` (the body itself is `body`)."""
    parts = [p for p in loc if p != "body"]
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".") or "body"


def validation_message(errors: Sequence[Mapping[str, Any]]) -> str:
    """pydantic's (or FastAPI's) errors as one message naming each field."""
    return "; ".join(f"{field_path(tuple(e['loc']))}: {e['msg']}" for e in errors)


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
        }
    )


def error_json(err: RecmeshError) -> bytes:
    return orjson.dumps({"error": type(err).__name__, "message": str(err)})


def _traceparent() -> Headers:
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    value = carrier.get("traceparent")
    return [(b"traceparent", value.encode())] if value else []


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
    """The ASGI app the gateway serves: POST /v1/recommend here, the rest by `app`."""

    def __init__(
        self,
        app: ASGIApp,
        recommender: Recommender,
        policy: ClassPolicy,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self._app = app
        self._recommender = recommender
        self._policy = policy
        self._max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()
        headers: dict[str, str] = {}
        for k, v in scope["headers"]:  # the first of repeated headers wins, as in Starlette
            headers.setdefault(k.decode("latin-1"), v.decode("latin-1"))
        decision: ClassDecision | None = None
        decision_error: RecmeshError | None = None
        try:
            decision = self._policy.decide(headers)
        except RecmeshError as err:
            decision_error = err
        gate = self._recommender.gate
        if decision is not None and gate is not None and gate.would_shed(decision.slo.name):
            await self._shed(gate, decision.slo.name, send, started)
            return
        slo_label = "none"  # the body was not valid
        status = 500
        with _tracer.start_as_current_span(
            ROUTE,
            context=propagate.extract(headers),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": "POST", "http.route": PATH, "url.path": PATH},
        ) as span:
            extra: Headers = []
            try:
                body = self._parse(await _read_body(receive, self._max_body_bytes), headers)
                slo_label = "invalid"  # the class decision failed
                if decision is None:
                    assert decision_error is not None
                    raise decision_error
                slo_label = decision.slo.name
                with request_scope(decision.slo.name, parse_timeout_s(headers.get(TIMEOUT_HEADER))):
                    rec = await self._recommender.recommend(body.user_id, body.count, body.context, decision)
                payload = recommendation_json(rec)
                status = 200
                extra.append((b"x-slo-class", decision.slo.name.encode()))
            except RecmeshError as err:
                status = err.http_status
                payload = error_json(err)
                retry_after = getattr(err, "retry_after_s", None)
                if retry_after is not None:  # shed after the body was read (a queue timeout)
                    extra.append((b"retry-after", str(retry_after).encode()))
                    if decision is not None:
                        extra.append((b"x-slo-class", decision.slo.name.encode()))
            except Exception as err:  # answered 500, logged with its trace
                _log.exception("unhandled_error", route=ROUTE, error=repr(err))
                span.record_exception(err)
                payload = orjson.dumps({"error": "Internal", "message": "internal error"})
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR))
            extra += _traceparent()
            await self._respond(send, status, payload, extra)
        elapsed = time.perf_counter() - started
        REQUEST_LATENCY.labels("gateway", ROUTE, slo_label, str(status)).observe(elapsed)

    def _parse(self, raw: bytes, headers: dict[str, str]) -> RecommendBody:
        if not is_json(headers.get("content-type")):
            raise InvalidArgument("body: the content-type must be application/json")
        try:
            return RecommendBody.model_validate_json(raw)
        except ValidationError as err:
            raise InvalidArgument(validation_message(err.errors())) from err

    async def _shed(self, gate: AdmissionGate, slo: str, send: Send, started: float) -> None:
        err = gate.refuse(slo)
        extra = [(b"x-slo-class", slo.encode()), (b"retry-after", str(err.retry_after_s or 1).encode())]
        await self._respond(send, 429, error_json(err), extra + _traceparent())
        REQUEST_LATENCY.labels("gateway", ROUTE, slo, "429").observe(time.perf_counter() - started)

    @staticmethod
    async def _respond(send: Send, status: int, payload: bytes, extra: Headers) -> None:
        response_headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            *extra,
        ]
        await send({"type": "http.response.start", "status": status, "headers": response_headers})
        await send({"type": "http.response.body", "body": payload})
