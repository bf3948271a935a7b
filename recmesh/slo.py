"""SLO classes: what each class may spend, and how a request's class is read.

Pure logic; the gateway calls `resolve_class` once per request and every hop
after that reads the class from gRPC metadata (`x-slo-class`).
"""

from __future__ import annotations

from dataclasses import dataclass

from recmesh.errors import InvalidArgument

SLO_HEADER = "x-slo-class"


@dataclass(frozen=True)
class SloClass:
    name: str
    budget_ms: int  # end-to-end budget the gateway turns into a deadline
    description: str


DEFAULT_CLASSES: dict[str, SloClass] = {
    "A": SloClass("A", 300, "interactive recommendations (p99 <= 300 ms)"),
    "B": SloClass("B", 850, "AI-tool calls and standard traffic (p99 <= 850 ms)"),
    "C": SloClass("C", 3000, "best effort and batch"),
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
