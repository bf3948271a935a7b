from __future__ import annotations

import pytest
from pydantic import ValidationError

from recmesh.errors import InvalidArgument
from recmesh.settings import GatewaySettings
from recmesh.slo import (
    DEFAULT_CLASSES,
    Entitlement,
    decide_class,
    parse_timeout_s,
    parse_token_budget,
    resolve_class,
    with_budgets,
)
from services.gateway.edge import ClassPolicy


def test_header_names_the_class_case_insensitively() -> None:
    assert resolve_class("a", "B").name == "A"
    assert resolve_class(" C ", "B").budget_ms == DEFAULT_CLASSES["C"].budget_ms


def test_missing_header_gets_the_default() -> None:
    assert resolve_class(None, "B").name == "B"
    assert resolve_class("", "C").name == "C"


def test_unknown_class_is_the_callers_error() -> None:
    with pytest.raises(InvalidArgument, match="unknown x-slo-class 'Z'"):
        resolve_class("Z", "B")


ANON = Entitlement("anonymous", "B")
PARTNER = Entitlement("partner", "A", trusted_context=True)
BATCH = Entitlement("batch", "C")


def test_header_above_entitlement_is_downgraded_and_says_so() -> None:
    d = decide_class("A", ANON, "B")
    assert d.slo.name == "B" and d.downgraded_from == "A"
    assert d.notes == ["slo_class_downgraded:A->B"]
    assert decide_class("B", BATCH, "C").slo.name == "C"


def test_entitled_callers_get_what_they_ask_and_lower_is_always_allowed() -> None:
    assert decide_class("A", PARTNER, "B").slo.name == "A"
    assert decide_class("C", PARTNER, "B").notes == []
    assert decide_class("C", PARTNER, "B").slo.name == "C"


def test_trusted_tier_or_token_budget_promotes_to_a_without_a_header() -> None:
    assert decide_class(None, PARTNER, "B", user_tier="Gold").promoted_by == "tier=gold"
    assert decide_class(None, PARTNER, "B", token_budget=4096).slo.name == "A"
    assert decide_class(None, PARTNER, "B", token_budget=2048).slo.name == "B"  # > 2048 only
    assert decide_class(None, PARTNER, "B", user_tier="silver").slo.name == "B"


def test_untrusted_callers_cannot_promote_themselves() -> None:
    d = decide_class(None, ANON, "B", user_tier="vip", token_budget=10_000)
    assert d.slo.name == "B" and d.promoted_by is None
    capped = Entitlement("capped", "B", trusted_context=True)
    d = decide_class(None, capped, "B", user_tier="vip")
    assert d.slo.name == "B" and d.downgraded_from == "A" and d.promoted_by is None


def test_explicit_header_is_not_overridden_by_promotion() -> None:
    assert decide_class("C", PARTNER, "B", user_tier="gold").slo.name == "C"


def test_bad_token_budget_is_a_clear_error() -> None:
    with pytest.raises(InvalidArgument, match="x-llm-token-budget"):
        parse_token_budget("lots")
    assert parse_token_budget(None) is None and parse_token_budget("10") == 10


@pytest.mark.parametrize("raw", ["\u00b2", "+5", "-1", "1_000", "1.5", "0x10", "\u0661"])
def test_whole_number_headers_take_ascii_digits_only(raw: str) -> None:
    # "²" passed str.isdigit() and then failed int(): the gateway answered 500.
    with pytest.raises(InvalidArgument, match="x-request-timeout-ms"):
        parse_timeout_s(raw)
    with pytest.raises(InvalidArgument, match="x-llm-token-budget"):
        parse_token_budget(raw)


def test_whole_number_headers_as_sent() -> None:
    assert parse_timeout_s(" 250 ") == 0.25 and parse_timeout_s(None) is None
    assert parse_token_budget("0") == 0 and parse_token_budget("") is None
    with pytest.raises(InvalidArgument, match="x-request-timeout-ms"):
        parse_timeout_s("0")


def test_budgets_are_configured_over_the_defaults() -> None:
    classes = with_budgets({"A": 120})
    assert {n: c.budget_ms for n, c in classes.items()} == {"A": 120, "B": 850, "C": 3000}
    assert DEFAULT_CLASSES["A"].budget_ms == 300, "the defaults are not changed"
    with pytest.raises(ValueError, match=r"unknown SLO class\(es\) \['D'\]"):
        with_budgets({"D": 5})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="> 0 ms"):
        with_budgets({"B": 0})


def test_the_gateway_decides_with_the_configured_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECMESH_SLO_BUDGETS_MS", '{"A": 150, "C": 10000}')
    monkeypatch.setenv("RECMESH_API_KEYS", '{"demo-interactive": {"tenant": "demo", "max_class": "A"}}')
    policy = ClassPolicy.from_settings(GatewaySettings())
    decision = policy.decide({"x-api-key": "demo-interactive", "x-slo-class": "A"})
    assert (decision.slo.name, decision.slo.budget_ms) == ("A", 150)
    assert policy.decide({"x-slo-class": "C"}).slo.budget_ms == 10000
    monkeypatch.setenv("RECMESH_SLO_BUDGETS_MS", '{"A": -1}')
    with pytest.raises(ValidationError, match="every SLO budget must be > 0 ms"):
        GatewaySettings()
