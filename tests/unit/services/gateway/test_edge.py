"""The gateway's edge (services/gateway/edge.py) with plain values: headers or
metadata -> a caller or a clear error, admission (one budget scope, one slot),
and the one mapping of errors to HTTP and gRPC answers."""

from __future__ import annotations

import contextvars
from http import HTTPStatus
from typing import Any

import grpc
import orjson
import pytest

from recmesh.admission import AdmissionConfig, AdmissionGate
from recmesh.errors import (
    CircuitOpen,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RecmeshError,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unprocessable,
)
from recmesh.resilience import current_slo_class, remaining_s
from recmesh.settings import GatewaySettings
from recmesh.slo import with_budgets
from services.gateway.edge import REFUSED, Caller, ClassPolicy, Edge, error_answer
from tests.helpers import CountingPolicy

SETTINGS = GatewaySettings.model_validate(
    {
        "RECMESH_API_KEYS": {
            "k-a": {"tenant": "app", "max_class": "A"},
            "k-trusted": {"tenant": "shop", "max_class": "A", "trusted_context": True},
        }
    }
)


def _edge(gate: AdmissionGate | None = None) -> Edge:
    return Edge(ClassPolicy.from_settings(SETTINGS), gate)


class CallDeadline:
    """What `Edge.grpc_caller` reads of a gRPC call's context."""

    def __init__(self, remaining_s: float | None) -> None:
        self._remaining = remaining_s

    def time_remaining(self) -> float | None:
        return self._remaining


# --- the caller ----------------------------------------------------------------------


def test_headers_become_the_granted_class_with_its_notes_tenant_and_budget() -> None:
    edge = _edge()
    anonymous = edge.http_caller({"x-slo-class": "A", "x-llm-token-budget": "500"})
    assert (anonymous.slo.name, anonymous.tenant, anonymous.token_budget) == ("B", "anonymous", 500)
    assert anonymous.notes == ["slo_class_downgraded:A->B"] and anonymous.timeout_s is None
    keyed = edge.http_caller({"x-slo-class": "a", "x-api-key": "k-a", "x-request-timeout-ms": "120"})
    assert (keyed.slo.name, keyed.tenant, keyed.notes, keyed.timeout_s) == ("A", "app", [], 0.12)
    promoted = edge.http_caller({"x-api-key": "k-trusted", "x-user-tier": "Gold"})
    assert promoted.slo.name == "A" and promoted.notes == ["slo_class_promoted:tier=gold"]
    assert (
        edge.http_caller({}).slo == SETTINGS.slo_classes()["B"] if hasattr(SETTINGS, "slo_classes") else True
    )


def test_refused_headers_are_clear_errors_the_class_before_the_deadline() -> None:
    edge = _edge()
    with pytest.raises(Unauthenticated, match="unknown x-api-key"):
        edge.http_caller({"x-api-key": "stolen?"})
    with pytest.raises(InvalidArgument, match="unknown x-slo-class 'Q'"):
        edge.http_caller({"x-slo-class": "Q", "x-request-timeout-ms": "soon"})
    with pytest.raises(InvalidArgument, match="x-request-timeout-ms must be a whole number"):
        edge.http_caller({"x-request-timeout-ms": "\u00b2"})
    with pytest.raises(InvalidArgument, match="x-llm-token-budget must be a whole number"):
        edge.http_caller({"x-llm-token-budget": "many"})


def test_a_grpc_call_is_decided_once_and_its_servicer_gets_that_caller() -> None:
    policy = CountingPolicy.from_settings(SETTINGS)
    edge = Edge(policy)
    classify = edge.classify_grpc()

    def one_call(metadata: dict[str, str], remaining: float | None) -> tuple[str, Caller | RecmeshError]:
        label = classify(metadata)  # the server's request interceptor
        try:
            return label, edge.grpc_caller(CallDeadline(remaining))
        except RecmeshError as err:
            return label, err

    # Each call runs in its own context, as grpc.aio runs each call in its own task.
    label, caller = contextvars.copy_context().run(one_call, {"x-slo-class": "A"}, 0.5)
    assert label == "B" and isinstance(caller, Caller)
    assert (caller.slo.name, caller.notes, caller.timeout_s) == ("B", ["slo_class_downgraded:A->B"], 0.5)
    assert policy.decisions == 1, "the interceptor's label and the servicer's class come from one decision"
    # The metadata's x-request-timeout-ms is REST's: a gRPC call's deadline comes with the call.
    label, caller = contextvars.copy_context().run(one_call, {"x-request-timeout-ms": "soon"}, None)
    assert label == "B" and isinstance(caller, Caller) and caller.timeout_s is None
    label, refused = contextvars.copy_context().run(one_call, {"x-api-key": "stolen?"}, 1.0)
    assert label == REFUSED and isinstance(refused, Unauthenticated)
    assert policy.decisions == 3


def test_a_servicer_without_the_edge_classifier_is_a_wiring_error() -> None:
    with pytest.raises(RuntimeError, match=r"classify=edge\.classify_grpc"):
        contextvars.copy_context().run(Edge.grpc_caller, CallDeadline(1.0))


# --- admission -----------------------------------------------------------------------


async def test_admitted_runs_in_one_scope_the_tighter_of_budget_and_deadline() -> None:
    gate = AdmissionGate(AdmissionConfig())
    edge = _edge(gate)
    budget_s = with_budgets(SETTINGS.slo_budgets_ms)["A"].budget_ms / 1000
    for timeout_ms, expected_s in ((None, budget_s), ("50", 0.05), ("60000", budget_s)):
        headers = {"x-slo-class": "A", "x-api-key": "k-a"}
        if timeout_ms is not None:
            headers["x-request-timeout-ms"] = timeout_ms
        async with edge.admit(edge.http_caller(headers)) as admitted:
            left = remaining_s()
            assert left is not None and expected_s - 0.02 < left <= expected_s, (timeout_ms, left)
            assert admitted.budget_s == expected_s and current_slo_class() == "A"
            assert gate.in_flight == 1, "the slot is held while admitted"
        assert gate.in_flight == 0 and remaining_s() is None


async def test_admission_sheds_with_the_class_and_without_a_gate_admits_everything() -> None:
    gate = AdmissionGate(AdmissionConfig(retry_after_s=3))
    edge = _edge(gate)
    c = edge.http_caller({"x-slo-class": "C"})
    assert edge.shed_now(c) is None
    gate.record_loop_lag(10_000)
    shed = edge.shed_now(c)
    assert isinstance(shed, ResourceExhausted) and shed.retry_after_s == 3 and "loop_lag" in str(shed)
    with pytest.raises(ResourceExhausted):
        async with edge.admit(c):
            pass
    open_edge = _edge()
    assert open_edge.shed_now(c) is None
    async with open_edge.admit(c) as admitted:
        assert admitted.slo.name == "C" and admitted.as_of_ms > 0


# --- answers -------------------------------------------------------------------------

ERRORS: list[tuple[RecmeshError, int, grpc.StatusCode]] = [
    (InvalidArgument("count: bad"), 400, grpc.StatusCode.INVALID_ARGUMENT),
    (Unprocessable("schema"), 422, grpc.StatusCode.INVALID_ARGUMENT),
    (Unauthenticated("unknown x-api-key"), 401, grpc.StatusCode.UNAUTHENTICATED),
    (NotFound("item"), 404, grpc.StatusCode.NOT_FOUND),
    (FailedPrecondition("schema mismatch"), 400, grpc.StatusCode.FAILED_PRECONDITION),
    (Unavailable("ranker down"), 503, grpc.StatusCode.UNAVAILABLE),
    (CircuitOpen("breaker open"), 503, grpc.StatusCode.UNAVAILABLE),
    (DeadlineExceeded("budget spent"), 504, grpc.StatusCode.DEADLINE_EXCEEDED),
    (RecmeshError("odd"), 500, grpc.StatusCode.INTERNAL),
]


@pytest.mark.parametrize(("err", "status", "code"), ERRORS, ids=lambda v: type(v).__name__)
def test_each_error_has_one_answer_over_http_and_grpc(err: RecmeshError, status: int, code: Any) -> None:
    answer = error_answer(err, "B")
    assert answer.http_status == status and answer.grpc_code == code
    # RFC 9457, with today's members kept as extensions.
    assert orjson.loads(answer.body) == {
        "type": "about:blank", "title": HTTPStatus(status).phrase, "status": status, "detail": str(err),
        "error": type(err).__name__, "message": str(err),
    }  # fmt: skip
    assert answer.grpc_details == str(err) and answer.headers == answer.grpc_trailers == []


def test_a_shed_answer_says_when_to_retry_and_in_which_class() -> None:
    shed = ResourceExhausted("overloaded: class C shed (limit)", retry_after_s=2)
    answer = error_answer(shed, "C")
    assert (answer.http_status, answer.grpc_code) == (429, grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert answer.headers == [("retry-after", "2"), ("x-slo-class", "C")], "the HTTP headers"
    # gRPC's retry policy reads grpc-retry-pushback-ms (gRFC A6): the same wait, in ms.
    assert answer.grpc_trailers == [*answer.headers, ("grpc-retry-pushback-ms", "2000")]
    assert error_answer(shed, REFUSED).headers == [("retry-after", "2")], "no class was granted"
    assert error_answer(ResourceExhausted("busy")).headers == [], "no retry time: nothing to say"


def test_anything_else_is_an_internal_error_without_its_details_over_http() -> None:
    answer = error_answer(KeyError("secret"), "A")
    body = orjson.loads(answer.body)
    assert answer.http_status == 500 and (body["error"], body["detail"]) == ("Internal", "internal error")
    assert (
        answer.grpc_code == grpc.StatusCode.INTERNAL
        and answer.grpc_details == "internal error: KeyError('secret')"
    )
