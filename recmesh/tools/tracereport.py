"""Latency attribution per component from collected spans (`recmesh trace-report`).

This module owns reading the JSON-lines span files written by
`recmesh.telemetry.JsonLinesSpanExporter`, rebuilding each trace's span tree and
attributing its latency to components: a span's *self time* is its duration
minus the union of its direct children's intervals (clipped to the span), and
self time is summed per component. A span counts only inside its parent's
(clipped) interval: one that outlives its parent, like the served-feature
log's Kafka send, ran beside the request, not in it. The component is "redis"
for spans with `db.system` (or, with the stable database conventions opted in,
`db.system.name`) "redis", "kafka" for `messaging.system == "kafka"`, otherwise
the service name without a leading "recmesh-". A CLIENT span whose SERVER
child runs in another service charges its self time (wire, queueing,
(de)serialisation outside the callee's handler) to "network:<callee component>".

Only complete traces are attributed: the spans of a trace must form a single
tree, i.e. exactly one span has no parent present in the trace (its parent_id
is null or names a span outside the files, such as an external caller's). A
trace whose root was not collected leaves several orphans and is skipped, as
its attribution would be wrong.

Percentiles use linear interpolation between closest ranks (numpy's default).
A component's p50/p95 are taken over the traces it appears in; its share is
mean(self time) / mean(end-to-end) over all attributed traces (a trace where it
is absent counts as 0), so shares add up to 100 % for sequential call trees and
can exceed it when children run concurrently.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from recmesh.stats import percentile

SERVICE_PREFIX = "recmesh-"
SLO_ATTRIBUTE = "recmesh.slo_class"
NETWORK_PREFIX = "network:"
_NS_PER_MS = 1_000_000


@dataclass(frozen=True)
class Span:
    """One finished span as JsonLinesSpanExporter writes it."""

    name: str
    service: str
    trace_id: str
    span_id: str
    parent_id: str | None
    kind: str
    start_ns: int
    end_ns: int
    status: str
    attributes: Mapping[str, Any]

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)

    @property
    def component(self) -> str:
        if "redis" in (self.attributes.get("db.system"), self.attributes.get("db.system.name")):
            return "redis"
        if self.attributes.get("messaging.system") == "kafka":
            return "kafka"
        return self.service.removeprefix(SERVICE_PREFIX)


@dataclass(frozen=True)
class ComponentStats:
    component: str
    traces: int  # traces the component appears in
    p50_ms: float  # over the traces it appears in
    p95_ms: float
    mean_ms: float  # over all attributed traces, absent counting as 0
    share: float  # mean_ms / mean end-to-end, a fraction


@dataclass(frozen=True)
class Report:
    traces: int
    skipped_traces: int  # traces without a single root (incomplete)
    slo_class: str | None
    e2e_p50_ms: float
    e2e_p95_ms: float
    e2e_p99_ms: float
    e2e_mean_ms: float
    components: tuple[ComponentStats, ...]  # sorted by share, descending


# --- loading ------------------------------------------------------------------


def _field(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], optional: bool = False) -> Any:
    value = obj.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"field {key!r} is missing or not {getattr(kind, '__name__', kind)}: {value!r}")
    return value


def _parse_span(raw: Any) -> Span:
    if not isinstance(raw, dict):
        raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
    attributes = raw.get("attributes") or {}
    if not isinstance(attributes, dict):
        raise ValueError(f"field 'attributes' is not an object: {attributes!r}")
    return Span(
        name=_field(raw, "name", str),
        service=_field(raw, "service", str, optional=True) or "unknown",
        trace_id=_field(raw, "trace_id", str),
        span_id=_field(raw, "span_id", str),
        parent_id=_field(raw, "parent_id", str, optional=True),
        kind=_field(raw, "kind", str, optional=True) or "INTERNAL",
        start_ns=_field(raw, "start_ns", int),
        end_ns=_field(raw, "end_ns", int),
        status=_field(raw, "status", str, optional=True) or "UNSET",
        attributes=attributes,
    )


def load_spans(paths: Iterable[Path]) -> list[Span]:
    """Read span JSON lines from each file; blank lines are skipped.

    Raises ValueError naming `file:line` for a line that is not a span object.
    """
    spans: list[Span] = []
    for path in paths:
        with open(path, "rb") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    spans.append(_parse_span(orjson.loads(line)))
                except ValueError as err:  # orjson.JSONDecodeError is a ValueError
                    raise ValueError(f"{path}:{lineno}: malformed span line: {err}") from err
    return spans


# --- attribution --------------------------------------------------------------


def _covered_ns(start: int, end: int, intervals: Iterable[tuple[int, int]]) -> int:
    """Length of the union of `intervals` clipped to [start, end]."""
    clipped = sorted((max(s, start), min(e, end)) for s, e in intervals if min(e, end) > max(s, start))
    total = 0
    cur_s: int | None = None
    cur_e = 0
    for s, e in clipped:
        if cur_s is None or s > cur_e:
            if cur_s is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_s is not None:
        total += cur_e - cur_s
    return total


def find_root(trace: Sequence[Span]) -> Span | None:
    """The trace's root if its spans form a single tree, else None."""
    ids = {span.span_id for span in trace}
    roots = [span for span in trace if span.parent_id is None or span.parent_id not in ids]
    return roots[0] if len(roots) == 1 else None


def self_times(trace: Sequence[Span], clip: bool = True) -> dict[str, int]:
    """Self time in ns per component for the spans of one trace. With `clip`,
    a span counts only inside its parent's (clipped) interval: work that
    outlives its parent or starts after it, such as the served-feature log's
    Kafka send, ran beside the request, not in it, and charging it would make
    the components add up to more than the request took."""
    children: dict[str, list[Span]] = defaultdict(list)
    for span in trace:
        if span.parent_id is not None:
            children[span.parent_id].append(span)
    ids = {span.span_id for span in trace}
    todo = [
        (span, (span.start_ns, span.end_ns))
        for span in trace
        if span.parent_id is None or span.parent_id not in ids
    ]
    totals: dict[str, int] = defaultdict(int)
    while todo:
        span, (start, end) = todo.pop()
        kids = children.get(span.span_id, [])
        for kid in kids:
            window = (max(kid.start_ns, start), min(kid.end_ns, end)) if clip else (kid.start_ns, kid.end_ns)
            todo.append((kid, window))
        if end <= start:
            continue
        own = (end - start) - _covered_ns(start, end, ((k.start_ns, k.end_ns) for k in kids))
        component = span.component
        if span.kind == "CLIENT":
            callees = sorted(
                (k for k in kids if k.kind == "SERVER" and k.service != span.service),
                key=lambda k: k.start_ns,
            )
            if callees:
                component = NETWORK_PREFIX + callees[0].component
        totals[component] += own
    return dict(totals)


def trace_slo_class(trace: Sequence[Span], root: Span) -> str | None:
    """The root's recmesh.slo_class, else the earliest span's that has one."""
    value = root.attributes.get(SLO_ATTRIBUTE)
    if value is None:
        for span in sorted(trace, key=lambda s: s.start_ns):
            value = span.attributes.get(SLO_ATTRIBUTE)
            if value is not None:
                break
    return None if value is None else str(value)


def _ms(values: Sequence[float], p: float) -> float:
    """The nearest-rank percentile (recmesh.stats, as everywhere: a latency that
    happened; over a handful of traces p95 is the slowest); 0 for none."""
    return percentile(values, p) if values else 0.0


def attribute(spans: Iterable[Span], slo_class: str | None = None) -> Report:
    """Attribute latency per component over the complete traces among `spans`.

    With `slo_class`, only traces of that class (compared case-insensitively) count.
    """
    by_trace: dict[str, dict[str, Span]] = defaultdict(dict)
    for span in spans:
        by_trace[span.trace_id].setdefault(span.span_id, span)  # a file passed twice adds nothing
    wanted = slo_class.strip().upper() if slo_class else None
    e2e: list[float] = []
    per_component: dict[str, list[float]] = defaultdict(list)
    skipped = 0
    for members in by_trace.values():
        trace = list(members.values())
        root = find_root(trace)
        if root is None:
            skipped += 1
            continue
        if wanted is not None:
            cls = trace_slo_class(trace, root)
            if cls is None or cls.strip().upper() != wanted:
                continue
        e2e.append(root.duration_ns / _NS_PER_MS)
        for component, ns in self_times(trace).items():
            per_component[component].append(ns / _NS_PER_MS)
    n = len(e2e)
    e2e_mean = sum(e2e) / n if n else 0.0
    stats = []
    for component, values in per_component.items():
        mean = sum(values) / n
        stats.append(
            ComponentStats(
                component=component,
                traces=len(values),
                p50_ms=_ms(values, 50),
                p95_ms=_ms(values, 95),
                mean_ms=mean,
                share=mean / e2e_mean if e2e_mean > 0 else 0.0,
            )
        )
    stats.sort(key=lambda c: (-c.share, c.component))
    return Report(
        traces=n,
        skipped_traces=skipped,
        slo_class=slo_class,
        e2e_p50_ms=_ms(e2e, 50),
        e2e_p95_ms=_ms(e2e, 95),
        e2e_p99_ms=_ms(e2e, 99),
        e2e_mean_ms=e2e_mean,
        components=tuple(stats),
    )


# --- output -------------------------------------------------------------------


def render(report: Report) -> str:
    """A fixed-width table, components by share descending, then end-to-end."""
    width = max([len("end-to-end"), len("component")] + [len(c.component) for c in report.components]) + 2

    def row(name: str, traces: object, p50: object, p95: object, share: object) -> str:
        return f"{name:<{width}}{traces:>8}{p50:>11}{p95:>11}{share:>10}"

    lines = [row("component", "traces", "p50 ms", "p95 ms", "share %")]
    lines.append("-" * len(lines[0]))
    for c in report.components:
        lines.append(row(c.component, c.traces, f"{c.p50_ms:.3f}", f"{c.p95_ms:.3f}", f"{c.share * 100:.1f}"))
    lines.append("-" * len(lines[0]))
    lines.append(
        row("end-to-end", report.traces, f"{report.e2e_p50_ms:.3f}", f"{report.e2e_p95_ms:.3f}", "100.0")
    )
    scope = f", SLO class {report.slo_class}" if report.slo_class else ""
    lines.append(
        f"end-to-end p99 {report.e2e_p99_ms:.3f} ms, mean {report.e2e_mean_ms:.3f} ms over "
        f"{report.traces} traces{scope}; {report.skipped_traces} incomplete traces skipped"
    )
    return "\n".join(lines)


def to_json(report: Report) -> dict[str, Any]:
    return {
        "traces": report.traces,
        "skipped_traces": report.skipped_traces,
        "slo_class": report.slo_class,
        "end_to_end": {
            "p50_ms": report.e2e_p50_ms,
            "p95_ms": report.e2e_p95_ms,
            "p99_ms": report.e2e_p99_ms,
            "mean_ms": report.e2e_mean_ms,
        },
        "components": [
            {
                "component": c.component,
                "traces": c.traces,
                "p50_ms": c.p50_ms,
                "p95_ms": c.p95_ms,
                "mean_ms": c.mean_ms,
                "share": c.share,
            }
            for c in report.components
        ],
    }


def main(args: argparse.Namespace) -> int:
    """`recmesh trace-report FILE... [--slo-class A] [--json]`."""
    paths = [Path(p) for p in args.files]
    slo_class: str | None = args.slo_class
    try:
        spans = load_spans(paths)
    except (OSError, ValueError) as err:
        print(f"trace-report: {err}", file=sys.stderr)
        return 1
    report = attribute(spans, slo_class)
    if report.traces == 0:
        scope = f" of SLO class {slo_class}" if slo_class else ""
        print(
            f"trace-report: no complete trace{scope} in {len(spans)} spans from {len(paths)} file(s) "
            f"({report.skipped_traces} incomplete traces skipped)",
            file=sys.stderr,
        )
        return 1
    print(render(report))
    if args.json:
        print(orjson.dumps(to_json(report)).decode())
    return 0
