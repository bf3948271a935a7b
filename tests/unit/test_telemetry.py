"""recmesh.telemetry helpers that need no server."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram

from recmesh.telemetry import hop_class, observe_many, process_age_s


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_process_age_counts_from_process_start() -> None:
    """A child that sleeps 0.3 s before asking is at least that old, and no
    older than the time from spawning it to its exit (plus one 10 ms tick)."""
    code = "import time; time.sleep(0.3); from recmesh.telemetry import process_age_s; print(process_age_s())"
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    elapsed = time.perf_counter() - started
    age = float(out.stdout)
    assert 0.3 <= age <= elapsed + 0.02
    mine = process_age_s()
    assert mine is not None and mine > age


BUCKETS = (0.001, 0.01, 0.1, 1.0, 10.0)
AMOUNTS = [0.0, 0.0005, 0.001, 0.0011, 0.05, 0.1, 0.7, 1.0, 3.0, 10.0, 11.0, 1e9, 0.001]


def _samples(hist: Histogram) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for metric in hist.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


def test_observe_many_matches_observe_one_by_one() -> None:
    one = Histogram("one", "h", ("stage",), buckets=BUCKETS, registry=CollectorRegistry())
    many = Histogram("one", "h", ("stage",), buckets=BUCKETS, registry=CollectorRegistry())
    for a in AMOUNTS:
        one.labels("x").observe(a)
    observe_many(many.labels("x"), AMOUNTS[:5])
    observe_many(many.labels("x"), AMOUNTS[5:])
    observe_many(many.labels("x"), [])
    got, want = _samples(many), _samples(one)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value), key


def test_observe_many_refuses_a_labelled_parent() -> None:
    hist = Histogram("p", "h", ("stage",), buckets=BUCKETS, registry=CollectorRegistry())
    with pytest.raises(ValueError):
        observe_many(hist, [1.0])


SAMPLING_PROBE = """
from recmesh.telemetry import setup_tracing
from opentelemetry import trace
from opentelemetry.propagate import extract
setup_tracing("probe", redis=False)
for flags in ("", "01", "00"):  # a root, a sampled caller, an unsampled caller
    parent = extract({"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-{flags}"}) if flags else None
    with trace.get_tracer("t").start_as_current_span("s", context=parent) as span:
        ctx = span.get_span_context()
        print(span.is_recording(), ctx.is_valid, ctx.trace_flags.sampled, end="; ")
"""


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        # Nothing exports: a trace started here is not built; a sampled caller's is (and says so on).
        ({}, "False True False; True True True; False True False;"),
        ({"RECMESH_SPANS_FILE": "{tmp}/spans.jsonl"}, "True True True; True True True; False True False;"),
        ({"OTEL_TRACES_SAMPLER": "always_on"}, "True True True; True True True; True True True;"),
    ],
)
def test_spans_are_recorded_only_where_something_exports_them(
    tmp_path: Path, env: dict[str, str], expected: str
) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RECMESH_SPANS"))}
    clean.update({k: v.format(tmp=tmp_path) for k, v in env.items()})
    out = subprocess.run([sys.executable, "-c", SAMPLING_PROBE], env=clean, capture_output=True,
                         text=True, check=True, timeout=60)  # fmt: skip
    assert out.stdout.strip() == expected, out.stderr


def test_an_internal_hop_takes_only_a_known_class_from_metadata() -> None:
    assert hop_class({"x-slo-class": "A"}) == "A"
    assert hop_class({"x-slo-class": "drop table"}) == "unknown", "a label must not take any string"
    assert hop_class({}) == "unknown"
