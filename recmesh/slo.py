"""SLO classes: what each class may spend, and how a request's class is read.

Pure logic; the gateway calls `decide_class` once per request (the header,
capped by the caller's entitlement) and every hop after that reads the class
from gRPC metadata (`x-slo-class`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from recmesh.errors import InvalidArgument
from recmesh.metadata import SLO_HEADER, TIMEOUT_HEADER, TOKEN_BUDGET_HEADER

SloName = Literal["A", "B", "C"]


@dataclass(frozen=True)
class SloClass:
    name: str
    budget_ms: int  # end-to-end budget the gateway turns into a deadline
    description: str


# The design notes' budgets; `RECMESH_SLO_BUDGETS_MS` moves them (`with_budgets`).
DEFAULT_CLASSES: dict[str, SloClass] = {
    "A": SloClass("A", 300, "interactive recommendations"),
    "B": SloClass("B", 850, "AI-tool calls and standard traffic"),
    "C": SloClass("C", 3000, "best effort and batch"),
}


def with_budgets(budgets_ms: Mapping[SloName, int]) -> dict[str, SloClass]:
    """The classes with the configured budgets (ms) in place of the defaults.

    The class names and their order of importance (A before B before C) are
    fixed: admission shares, queues and shedding order are keyed by them.
    """
    budgets = {str(name): int(ms) for name, ms in budgets_ms.items()}
    unknown = set(budgets) - set(DEFAULT_CLASSES)
    if unknown:
        known = sorted(DEFAULT_CLASSES)
        raise ValueError(f"unknown SLO class(es) {sorted(unknown)}; the classes are {known}")
    if any(ms <= 0 for ms in budgets.values()):
        raise ValueError(f"every SLO budget must be > 0 ms, got {budgets}")
    return {
        name: replace(slo, budget_ms=budgets.get(name, slo.budget_ms))
        for name, slo in DEFAULT_CLASSES.items()
    }


def resolve_class(
    header: str | None,
    default: str,
    classes: dict[str, SloClass] = DEFAULT_CLASSES,
) -> SloClass:
    """The class named by the header, or the default when the header is absent.

    An unknown value is the caller's error, never silently mapped to a default.
    """
    if header is None or header.strip() == "":
        return classes[default]
    name = header.strip().upper()
    if name not in classes:
        allowed = ", ".join(sorted(classes))
        raise InvalidArgument(f"unknown {SLO_HEADER} {header!r}; expected one of {allowed}")
    return classes[name]


# --- entitlement ------------------------------------------------------------

RANK = {"A": 0, "B": 1, "C": 2}  # lower is more important
PROMOTING_TIERS = frozenset({"gold", "platinum", "diamond", "vip"})
PROMOTING_TOKEN_BUDGET = 2048


@dataclass(frozen=True)
class Entitlement:
    """What a caller (an API key, or the anonymous default) may ask for."""

    tenant: str
    max_class: str = "B"
    # Server-side callers that vouch for their users' tier and token budget;
    # only they can have a request promoted by them.
    trusted_context: bool = False


@dataclass(frozen=True)
class ClassDecision:
    slo: SloClass
    requested: str | None
    downgraded_from: str | None = None
    promoted_by: str | None = None

    @property
    def notes(self) -> list[str]:
        out = []
        if self.downgraded_from:
            out.append(f"slo_class_downgraded:{self.downgraded_from}->{self.slo.name}")
        if self.promoted_by:
            out.append(f"slo_class_promoted:{self.promoted_by}")
        return out


def decide_class(
    header: str | None,
    entitlement: Entitlement,
    default: str,
    user_tier: str | None = None,
    token_budget: int | None = None,
    classes: dict[str, SloClass] = DEFAULT_CLASSES,
) -> ClassDecision:
    """The class a request runs in.

    1. An unknown header value is the caller's error (400 / INVALID_ARGUMENT).
    2. Without a header the request gets `default`, promoted to A when a
       trusted caller vouches for a user tier >= gold or an LLM token budget
       above 2048 (the design notes' mapping).
    3. Whatever was asked, the class is capped at the caller's entitlement; a
       request above it is downgraded, never refused, and the decision says so.
    """
    requested = None if header is None or not header.strip() else resolve_class(header, default, classes).name
    name = requested or default
    promoted_by = None
    if requested is None and entitlement.trusted_context:
        if user_tier is not None and user_tier.strip().lower() in PROMOTING_TIERS:
            name, promoted_by = "A", f"tier={user_tier.strip().lower()}"
        elif token_budget is not None and token_budget > PROMOTING_TOKEN_BUDGET:
            name, promoted_by = "A", f"token_budget={token_budget}"
    downgraded_from = None
    if RANK[name] < RANK[entitlement.max_class]:
        downgraded_from, name = name, entitlement.max_class
        promoted_by = None  # a promotion the caller may not have does not count
    return ClassDecision(classes[name], requested, downgraded_from, promoted_by)


# A REST caller's own deadline (TIMEOUT_HEADER), in ms from when the gateway
# reads it (gRPC callers set theirs on the call). The request gets min(class budget, it).
TIMEOUT_DOC = "the caller's deadline in ms: the request gets the smaller of it and its class budget"


# A whole number as a header carries it: ASCII digits only. (str.isdigit and
# int() also take other scripts' digits, signs, "_" and spaces: "²" passed
# isdigit and then failed int(), a 500.)
_DIGITS = re.compile(r"[0-9]+")


def parse_timeout_s(raw: str | None) -> float | None:
    """`x-request-timeout-ms` in seconds; None when absent."""
    if raw is None:
        return None
    if not _DIGITS.fullmatch(raw.strip()) or int(raw) <= 0:
        raise InvalidArgument(f"{TIMEOUT_HEADER} must be a whole number of ms above 0, got {raw!r}")
    return int(raw) / 1000


def parse_token_budget(raw: str | None) -> int | None:
    """`x-llm-token-budget`; None when absent or empty."""
    if raw is None or raw.strip() == "":
        return None
    if not _DIGITS.fullmatch(raw.strip()):
        raise InvalidArgument(f"{TOKEN_BUDGET_HEADER} must be a whole number >= 0, got {raw!r}")
    return int(raw)
