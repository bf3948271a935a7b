"""The gateway's OpenAPI contract: what FastAPI cannot infer from the handlers.

- The request headers the gateway reads (`x-slo-class`, `x-api-key`,
  `x-user-tier`, `x-llm-token-budget`, `x-request-timeout-ms`, `traceparent`)
  are declared here, once, as header parameters with the values the server
  accepts; the handlers read them from the request with recmesh.slo's parsers
  (as the plain route in front of FastAPI does), not as FastAPI parameters.
- Responses are documented as they are sent: every error is `ErrorOut`
  (`application/problem+json`, RFC 9457) with
  its status (request validation included: a 400, never FastAPI's 422 shape),
  429 carries `Retry-After` and the class. The hot `/v1/recommend` route is
  served outside FastAPI's handlers (recommend_route.py): `recommend` below
  declares its operation (body, summary, description) for FastAPI to document.
- Limits the deployment sets (`RECMESH_MAX_COUNT`, the AI tools' text size,
  events per request) are written into the running gateway's document.

tests/e2e/test_up.py checks the whole document against a live mesh with
schemathesis; tests/unit/services/gateway/test_openapi.py checks its shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

from recmesh.metadata import (
    API_KEY_HEADER,
    RETRY_AFTER_HEADER,
    SLO_HEADER,
    TIER_HEADER,
    TIMEOUT_HEADER,
    TOKEN_BUDGET_HEADER,
    TRACEPARENT_HEADER,
)
from recmesh.slo import PROMOTING_TOKEN_BUDGET, TIMEOUT_DOC
from services.gateway.edge import PROBLEM_JSON
from services.gateway.recommend_route import RecommendBody

Json = dict[str, Any]


class ErrorOut(BaseModel):
    """Every error the gateway answers, as an RFC 9457 problem (`application/problem+json`):
    no problem type of its own (`about:blank`, titled by the HTTP status); `error` (the
    error's class) and `message` (= `detail`) are extension members clients may keep reading."""

    type: str = Field("about:blank", examples=["about:blank"])
    title: str = Field(examples=["Bad Request"])
    status: int = Field(examples=[400])
    detail: str = Field(examples=["count: Input should be greater than or equal to 1"])
    error: str = Field(examples=["InvalidArgument"])
    message: str = Field(examples=["count: Input should be greater than or equal to 1"])


def _header(name: str, description: str, schema: Json) -> Json:
    return {"name": name, "in": "header", "required": False, "description": description, "schema": schema}


SLO_CLASS = _header(
    SLO_HEADER,
    "SLO class asked for: A, B or C (either case; absent or empty: the default, B). Capped at the "
    "caller's entitlement: a request above it is downgraded, not refused. Anything else is a 400.",
    {"type": "string", "pattern": "^[ABCabc]?$"},
)
API_KEY = _header(
    API_KEY_HEADER,
    "The caller's API key (RECMESH_API_KEYS); it sets the highest class the caller may get. Absent "
    "or empty: anonymous (RECMESH_ANONYMOUS_MAX_CLASS). An unknown key is a 401.",
    {"type": "string"},
)
USER_TIER = _header(
    TIER_HEADER,
    "The end user's tier. From a trusted caller (a key with trusted_context), gold or above "
    "promotes a request without x-slo-class to class A; otherwise ignored.",
    {"type": "string", "examples": ["gold"]},
)
TOKEN_BUDGET = _header(
    TOKEN_BUDGET_HEADER,
    "LLM token budget of the call (AI tools refuse with 422 a call that cannot fit it; tokens used "
    f"are counted per caller). From a trusted caller, above {PROMOTING_TOKEN_BUDGET} it promotes a "
    "request without x-slo-class to class A. A whole number (ASCII digits; empty: no budget); "
    "anything else is a 400.",
    {"type": "string", "pattern": "^[0-9]*$"},
)
TIMEOUT = _header(
    TIMEOUT_HEADER,
    f"{TIMEOUT_DOC}. A whole number above 0 (ASCII digits); anything else is a 400.",
    {"type": "string", "pattern": "^0*[1-9][0-9]*$"},
)
TRACEPARENT = _header(
    TRACEPARENT_HEADER,
    "W3C trace context: the request's spans join this trace. A malformed value is ignored "
    "(the request starts a new trace), as the W3C recommendation asks.",
    {"type": "string", "examples": ["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"]},
)

# What each kind of route reads.
CLASS_HEADERS = [SLO_CLASS, API_KEY, USER_TIER, TOKEN_BUDGET, TIMEOUT, TRACEPARENT]
TRACE_HEADERS = [TRACEPARENT]

# --- responses ----------------------------------------------------------------

_TRACEPARENT_OUT = {
    "description": "the request's trace (W3C), when it is sampled or the caller sent one",
    "schema": {"type": "string", "pattern": "^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"},
}
_CLASS_OUT = {
    "description": "the SLO class granted (as the body's slo_class)",
    "required": True,
    "schema": {"type": "string", "enum": ["A", "B", "C"]},
}
_RETRY_AFTER = {
    "description": "seconds to wait before retrying (RECMESH_ADMISSION_RETRY_AFTER_S)",
    "required": True,
    "schema": {"type": "integer", "minimum": 0},
}


def _error(description: str, **headers: Json) -> Json:
    headers = {TRACEPARENT_HEADER: _TRACEPARENT_OUT, **headers}
    return {"model": ErrorOut, "description": description, "headers": headers}


BAD_REQUEST = _error("a malformed body or header; the message names the field")
UNAUTHENTICATED = _error("x-api-key names no known key")
SHED = _error(
    "shed for overload (the admission gate is full for this class): retry after Retry-After",
    **{RETRY_AFTER_HEADER: _RETRY_AFTER, SLO_HEADER: _CLASS_OUT},
)


def served(**extra: Json) -> Json:
    """The success response's headers (merged into the response FastAPI documents)."""
    return {"headers": {TRACEPARENT_HEADER: _TRACEPARENT_OUT, **extra}}


SERVED_WITH_CLASS = served(**{SLO_HEADER: _CLASS_OUT})

RECOMMEND_RESPONSES: dict[int | str, Json] = {
    200: SERVED_WITH_CLASS,
    400: _error(
        "a malformed body (the content-type must be application/json), an unknown x-slo-class "
        "or a malformed header; the message names the field"
    ),
    401: UNAUTHENTICATED,
    413: _error("the body is over 64 KiB"),
    429: SHED,
    503: _error("the ranker failed and no fallback list is held yet"),
}
EVENTS_RESPONSES: dict[int | str, Json] = {
    202: served(),
    400: BAD_REQUEST,
    503: _error("the event broker did not acknowledge every event: none may be counted as accepted"),
}
AI_TOOL_RESPONSES: dict[int | str, Json] = {
    200: SERVED_WITH_CLASS,
    400: BAD_REQUEST,
    401: UNAUTHENTICATED,
    422: _error(
        "well formed, but it cannot be served: the token budget is too small for the call, or no "
        "generator can satisfy the output schema; the message names both"
    ),
    429: SHED,
}


def recommend(body: RecommendBody) -> None:
    """Recommendations for one user, ranked within the request's SLO class budget.

    `degraded` lists every fallback taken and class notes such as
    `slo_class_downgraded:A->B`; an empty list is a full answer."""


def operation(headers: list[Json]) -> Json:
    """`openapi_extra` of an operation that reads `headers`."""
    return {"parameters": headers}


# --- the document ---------------------------------------------------------------

# (component, property, keyword, limit): limits the deployment sets, written into the document.
Limit = tuple[str, str, str, Any]  # component, property, keyword, value


def install(app: FastAPI, limits: list[Limit], properties: dict[str, dict[str, Json]] | None = None) -> None:
    """Serve `app`'s document with the deployment's `limits`, extra
    `properties` (component -> name -> schema, e.g. the repository's event
    values) and without FastAPI's default 422 (request validation answers 400
    with ErrorOut)."""
    build: Callable[[], Json] = app.openapi

    def document() -> Json:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = build()
        for path_item in doc["paths"].values():
            for op in path_item.values():
                default_422 = op["responses"].get("422", {})
                if "HTTPValidationError" in str(default_422.get("content", "")):
                    del op["responses"]["422"]
                for status, answer in op["responses"].items():
                    content = answer.get("content", {})
                    if int(status) >= 400 and "application/json" in content:  # as edge.error_answer sends it
                        content[PROBLEM_JSON] = content.pop("application/json")
        schemas = doc.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        for component, prop, keyword, value in limits:
            schemas[component]["properties"][prop][keyword] = value
        for component, extra in (properties or {}).items():
            schemas[component]["properties"].update(extra)
        app.openapi_schema = doc
        return doc

    app.openapi = document  # type: ignore[method-assign]
