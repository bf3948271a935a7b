"""The gateway's edge, written once for every transport.

A request's headers (REST) or metadata (gRPC) become a `Caller`: the class it
is granted (its `x-slo-class` capped by the entitlement of its `x-api-key`,
with the notes a downgrade or promotion leaves), its tenant, its LLM token
budget and its own deadline. `Edge.admit` turns a caller into an `Admitted`
request: the budget scope every hop inherits (the class budget, or the
caller's tighter deadline) and a slot of the edge's admission gate, held for
the body of the `async with`. The work (`Recommender`, the AI-tool calls)
receives the `Admitted` context and opens nothing itself.

Errors become answers in one place, `error_answer`: a `RecmeshError` its HTTP
status with an RFC 9457 problem body (`application/problem+json`: `type`,
`title`, `status`, `detail`, and the extension members `error` and `message`
that clients written before it read) and its gRPC status, a shed request
(429, RESOURCE_EXHAUSTED) `Retry-After` and the class it was shed in (over
gRPC also `grpc-retry-pushback-ms`, which gRPC's own retry policy obeys);
anything else an internal error. The lean REST route, the FastAPI app and the gRPC servicer
all answer through it, with the request's `traceparent` on every REST answer
and `recmesh_request_duration_seconds` by route, class and status.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, NoReturn, Self

import grpc
import orjson
import structlog
from opentelemetry import propagate, trace
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from recmesh.admission import AdmissionGate
from recmesh.errors import RecmeshError, ResourceExhausted, Unauthenticated
from recmesh.grpcserver import Classify
from recmesh.metadata import (
    API_KEY_HEADER,
    RETRY_AFTER_HEADER,
    RETRY_PUSHBACK_TRAILER,
    SLO_HEADER,
    TIER_HEADER,
    TIMEOUT_HEADER,
    TOKEN_BUDGET_HEADER,
    TRACEPARENT_HEADER,
)
from recmesh.resilience import request_scope
from recmesh.settings import GatewaySettings
from recmesh.slo import (
    DEFAULT_CLASSES,
    ClassDecision,
    Entitlement,
    SloClass,
    decide_class,
    parse_timeout_s,
    parse_token_budget,
    with_budgets,
)
from recmesh.telemetry import REQUEST_LATENCY

_log = structlog.get_logger("recmesh.gateway")

# The class label of a request whose class or key was refused (and of its answer).
REFUSED = "invalid"


# --- who is calling ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Caller:
    """What a request's headers say, decided once: its class, tenant, token budget and deadline."""

    decision: ClassDecision
    tenant: str
    token_budget: int | None = None
    timeout_s: float | None = None  # the caller's own deadline (s from now); None: none

    @property
    def slo(self) -> SloClass:
        return self.decision.slo

    def with_timeout(self, timeout_s: float | None) -> Caller:
        return Caller(self.decision, self.tenant, self.token_budget, timeout_s)

    @property
    def notes(self) -> list[str]:
        return self.decision.notes


class ClassPolicy:
    """Turns a request's headers (or gRPC metadata) into its `Caller`."""

    def __init__(
        self,
        default_class: str,
        api_keys: Mapping[str, Entitlement],
        anonymous: Entitlement,
        classes: dict[str, SloClass] = DEFAULT_CLASSES,
    ) -> None:
        self._default = default_class
        self._keys = dict(api_keys)
        self._anonymous = anonymous
        self._classes = classes

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> Self:
        keys = {
            k: Entitlement(v.tenant, v.max_class, v.trusted_context) for k, v in settings.api_keys.items()
        }
        anonymous = Entitlement("anonymous", settings.anonymous_max_class)
        return cls(settings.default_slo_class, keys, anonymous, with_budgets(settings.slo_budgets_ms))

    def entitlement(self, headers: Mapping[str, str]) -> Entitlement:
        key = headers.get(API_KEY_HEADER)
        if not key:
            return self._anonymous
        entitlement = self._keys.get(key)
        if entitlement is None:
            raise Unauthenticated(f"unknown {API_KEY_HEADER}")
        return entitlement

    def decide(self, headers: Mapping[str, str], timeout_s: float | None = None) -> Caller:
        """The caller: an unknown key is Unauthenticated, an unknown class or a
        malformed token budget InvalidArgument."""
        entitlement = self.entitlement(headers)
        token_budget = parse_token_budget(headers.get(TOKEN_BUDGET_HEADER))
        decision = decide_class(
            headers.get(SLO_HEADER),
            entitlement,
            self._default,
            user_tier=headers.get(TIER_HEADER),
            token_budget=token_budget,
            classes=self._classes,
        )
        return Caller(decision, entitlement.tenant, token_budget, timeout_s)


# --- admission -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Admitted:
    """A request inside the edge: the caller, its effective budget (the scope's
    deadline) and its logical time. It holds its admission slot for as long as
    it exists (the body of `Edge.admit`)."""

    caller: Caller
    budget_s: float  # the class budget, or the caller's deadline when tighter
    as_of_ms: int  # the request's logical timestamp (wall clock, ms), taken as its budget began

    @property
    def slo(self) -> SloClass:
        return self.caller.slo

    @property
    def notes(self) -> list[str]:
        return self.caller.notes


# The gRPC caller decided by `Edge.classify_grpc` (run by the server's request
# interceptor) for the servicer of the same call: grpc.aio runs each call in
# its own task, so the value is the call's own.
_grpc_caller: ContextVar[Caller | RecmeshError | None] = ContextVar("recmesh_grpc_caller", default=None)


class Edge:
    """One way into the gateway's work: the class policy and the admission gate
    (None admits everything) its requests go through."""

    def __init__(self, policy: ClassPolicy, gate: AdmissionGate | None = None) -> None:
        self.policy = policy
        self.gate = gate

    def http_caller(self, headers: Mapping[str, str]) -> Caller:
        """A REST request's caller, its deadline from `x-request-timeout-ms`
        (read after the class: a refused class or key is what is reported)."""
        caller = self.policy.decide(headers)
        timeout_s = parse_timeout_s(headers.get(TIMEOUT_HEADER))
        return caller if timeout_s is None else caller.with_timeout(timeout_s)

    def classify_grpc(self) -> Classify:
        """What the public gRPC server labels and scopes a call with: the class
        the caller is granted, or "invalid" when its class or key is refused.
        The decision is kept for the servicer (`grpc_caller`): it runs once per call."""

        def classify(metadata: Mapping[str, Any]) -> str:
            try:
                caller = self.policy.decide(metadata)
            except RecmeshError as err:
                _grpc_caller.set(err)
                return REFUSED
            _grpc_caller.set(caller)
            return caller.slo.name

        return classify

    @staticmethod
    def grpc_caller(context: grpc.aio.ServicerContext) -> Caller:
        """The caller `classify_grpc` decided for this call, with the call's
        deadline; raises the error its class or key was refused with."""
        decided = _grpc_caller.get()
        if decided is None:
            raise RuntimeError("no gRPC caller decided: serve the call with classify=edge.classify_grpc()")
        if isinstance(decided, RecmeshError):
            raise decided
        return decided.with_timeout(context.time_remaining())

    def shed_now(self, caller: Caller) -> ResourceExhausted | None:
        """The refusal (counted) of a request the gate would shed right now, or None;
        the REST route asks before it reads the body."""
        if self.gate is None or not self.gate.would_shed(caller.slo.name):
            return None
        return self.gate.refuse(caller.slo.name)

    @asynccontextmanager
    async def admit(self, caller: Caller) -> AsyncIterator[Admitted]:
        """The request's budget scope and an admission slot for the body; raises
        ResourceExhausted when the gate sheds it. The budget starts before
        admission: time spent queued is time spent."""
        slo = caller.slo
        budget_s = slo.budget_ms / 1000
        if caller.timeout_s is not None:
            budget_s = min(budget_s, caller.timeout_s)
        admitted = Admitted(caller, budget_s, int(time.time() * 1000))
        span = trace.get_current_span()
        span.set_attribute("recmesh.slo_class", slo.name)
        if caller.decision.downgraded_from:
            span.set_attribute("recmesh.slo_class_requested", caller.decision.downgraded_from)
        with request_scope(slo.name, budget_s):
            if self.gate is None:
                yield admitted
            else:
                async with self.gate.slot(slo.name, budget_s):
                    yield admitted


# --- answers -----------------------------------------------------------------------


# RFC 9457's media type: every error body the gateway sends.
PROBLEM_JSON = "application/problem+json"


@dataclass(frozen=True)
class ErrorAnswer:
    """An error as the caller receives it, over HTTP and over gRPC."""

    http_status: int
    body: bytes  # application/problem+json (error_json)
    headers: list[tuple[str, str]]  # HTTP headers; with `pushback`, the gRPC trailers
    grpc_code: grpc.StatusCode
    grpc_details: str
    pushback_ms: int | None = None  # a shed call's grpc-retry-pushback-ms

    @property
    def grpc_trailers(self) -> list[tuple[str, str]]:
        if self.pushback_ms is None:
            return self.headers
        return [*self.headers, (RETRY_PUSHBACK_TRAILER, str(self.pushback_ms))]


def error_json(name: str, message: str, status: int) -> bytes:
    """An RFC 9457 problem: no problem type of its own (`about:blank`, titled by
    the HTTP status), the error's class and message as extension members."""
    return orjson.dumps({
        "type": "about:blank", "title": HTTPStatus(status).phrase, "status": status, "detail": message,
        "error": name, "message": message,
    })  # fmt: skip


def error_answer(err: BaseException, granted: str | None = None) -> ErrorAnswer:
    """The answer to `err` in a request granted class `granted` (None or
    "invalid": none granted). A shed request says when to retry and in which
    class; an error outside recmesh's hierarchy is an internal error, its
    details kept out of the REST body."""
    if not isinstance(err, RecmeshError):
        internal = error_json("Internal", "internal error", 500)
        return ErrorAnswer(500, internal, [], grpc.StatusCode.INTERNAL, f"internal error: {err!r}")
    headers: list[tuple[str, str]] = []
    retry_after = getattr(err, "retry_after_s", None)
    if retry_after is not None:
        headers.append((RETRY_AFTER_HEADER, str(retry_after)))
        if granted in DEFAULT_CLASSES:
            headers.append((SLO_HEADER, granted))
    body = error_json(type(err).__name__, str(err), err.http_status)
    pushback = None if retry_after is None else int(retry_after * 1000)
    return ErrorAnswer(err.http_status, body, headers, err.grpc_code, str(err), pushback)


async def abort_grpc(context: grpc.aio.ServicerContext, err: RecmeshError, granted: str | None) -> NoReturn:
    """End a gRPC call with `err`'s answer (raises grpc.aio.AbortError)."""
    answer = error_answer(err, granted)
    _log.info("request_failed", code=answer.grpc_code.name, error=answer.grpc_details)
    if answer.grpc_trailers:
        context.set_trailing_metadata(tuple(answer.grpc_trailers))
    abort: Callable[[grpc.StatusCode, str], Awaitable[NoReturn]] = context.abort  # it raises AbortError
    await abort(answer.grpc_code, answer.grpc_details)


def traceparent() -> dict[str, str]:
    """The current trace's `traceparent` (none when there is no trace), for a REST answer's headers."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    value = carrier.get(TRACEPARENT_HEADER)
    return {TRACEPARENT_HEADER: value} if value else {}


def field_path(loc: tuple[Any, ...]) -> str:
    """A validation error's location as `a.b[0]` (the body itself is `body`)."""
    parts = [p for p in loc if p != "body"]
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".") or "body"


def validation_message(errors: Sequence[Mapping[str, Any]]) -> str:
    """pydantic's (or FastAPI's) errors as one message naming each field."""
    return "; ".join(f"{field_path(tuple(e['loc']))}: {e['msg']}" for e in errors)


def record_latency(route: str, slo_class: str, status: int, started: float) -> None:
    """`recmesh_request_duration_seconds` of a REST request that began at `started` (perf_counter)."""
    REQUEST_LATENCY.labels("gateway", route, slo_class, str(status)).observe(time.perf_counter() - started)


class RecordLatency:
    """Pure ASGI middleware: `record_latency` per FastAPI route, class and
    status. (Starlette's `@app.middleware("http")` would run every request
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
            record_latency(f"{scope['method']} {path}", slo, status, started)
