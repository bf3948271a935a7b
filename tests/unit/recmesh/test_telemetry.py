"""recmesh.telemetry helpers that need no server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from prometheus_client import REGISTRY, CollectorRegistry, Histogram

from recmesh.telemetry import (
    ABANDON_GRACE_S,
    TelemetryConfigError,
    Tracing,
    _CountedProcessor,
    _GuardedExporter,
    check_sampler,
    children,
    kafka_server_attributes,
    observe,
    observe_many,
    otlp_protocol,
    process_age_s,
    semconv_opt_in,
    server_attributes,
    traces_exporters,
)


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


CHILD_PROBE = """
from recmesh.telemetry import setup_tracing
from recmesh.telemetry.rpc import grpc_client_span
from recmesh.telemetry.spans import child_span
from opentelemetry import trace
from opentelemetry.propagate import extract
setup_tracing("probe", redis=False)
tracer = trace.get_tracer("t")
for flags in ("", "01", "00"):  # a root, a sampled caller, an unsampled caller
    parent = extract({"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-{flags}"}) if flags else None
    with tracer.start_as_current_span("server", context=parent) as server:
        with child_span(tracer, "stage") as stage, grpc_client_span("/s/M", "B") as (call, metadata):
            sent = dict(metadata)["traceparent"].split("-")
            same = stage is server and call is server
            ctx = server.get_span_context()
            print(same, stage.is_recording(), sent[1] == format(ctx.trace_id, "032x"),
                  sent[2] == format(ctx.span_id, "016x"), end="; ")
"""


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        # Under an unsampled parent the stage and the call are the parent itself, and the
        # call sends the parent's ids on; under a sampled one they are spans of their own.
        ({}, "True False True True; False True True False; True False True True;"),
        ({"OTEL_TRACES_SAMPLER": "parentbased_always_on"},
         "False True True False; False True True False; True False True True;"),
        # A sampler that does not follow the parent decides every child itself.
        ({"OTEL_TRACES_SAMPLER": "always_on"}, "False True True False; False True True False; "
         "False True True False;"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"},
         "False False True False; False False True False; False False True False;"),
    ],
)  # fmt: skip
def test_a_child_of_an_unsampled_parent_is_the_parent_where_the_sampler_follows_it(
    env: dict[str, str], expected: str
) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RECMESH_SPANS"))}
    clean.update(env)
    out = subprocess.run([sys.executable, "-c", CHILD_PROBE], env=clean, capture_output=True,
                         text=True, check=True, timeout=60)  # fmt: skip
    assert out.stdout.strip() == expected, out.stderr


def test_observe_matches_the_histograms_own() -> None:
    own = Histogram("own", "h", ("stage",), buckets=BUCKETS, registry=CollectorRegistry())
    fast = Histogram("own", "h", ("stage",), buckets=BUCKETS, registry=CollectorRegistry())
    for a in (*AMOUNTS, *BUCKETS, 0.0, 1e9):  # every bound exactly, and past the last
        own.labels("x").observe(a)
        observe(fast.labels("x"), a)
    assert _samples(fast) == pytest.approx(_samples(own))


def test_children_are_the_metrics_own_looked_up_once() -> None:
    hist = Histogram("c", "h", ("stage", "slo_class"), buckets=BUCKETS, registry=CollectorRegistry())
    child = children(hist)
    assert child("a", "B") is hist.labels("a", "B") is child("a", "B")
    assert child("a", "A") is not child("a", "B")


# --- which exporter, protocol and sampler the OTEL_* variables ask for -------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp"]),  # the exporter's default endpoint
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, []),
        ({"OTEL_TRACES_EXPORTER": "console, otlp,otlp"}, ["console", "otlp"]),
    ],
)
def test_traces_exporters(env: dict[str, str], expected: list[str]) -> None:
    assert traces_exporters(env) == expected


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "grpc"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "http/protobuf"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"},
         "http/protobuf"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": " "},
         "http/protobuf"),
    ],
)  # fmt: skip
def test_otlp_protocol(env: dict[str, str], expected: str) -> None:
    assert otlp_protocol(env) == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "otlp,jaeger"}, "OTEL_TRACES_EXPORTER: unsupported exporter jaeger"),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
         "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='http/json' is not supported"),
        ({"OTEL_TRACES_SAMPLER": "ratio"}, "OTEL_TRACES_SAMPLER='ratio' is not one of"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "10%"},
         "OTEL_TRACES_SAMPLER_ARG='10%' is not a ratio"),
        ({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"},
         "OTEL_TRACES_SAMPLER_ARG='1.5' is not a ratio"),
    ],
)  # fmt: skip
def test_a_value_that_cannot_be_honoured_is_refused_by_name(env: dict[str, str], message: str) -> None:
    with pytest.raises(TelemetryConfigError, match=re.escape(message)):
        traces_exporters(env)
        otlp_protocol(env)
        check_sampler(env)


def test_accepted_samplers_pass() -> None:
    check_sampler({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"})
    check_sampler({"OTEL_TRACES_SAMPLER": "ALWAYS_ON", "OTEL_TRACES_SAMPLER_ARG": "ignored"})


# --- semantic conventions ----------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "http"),
        ("", "http"),
        ("http", "http"),
        ("http/dup", "http/dup"),  # the user's: old and stable names side by side
        ("database", "database,http"),
        ("database, http/dup", "database, http/dup"),
        (" gen_ai_latest_experimental ,", "gen_ai_latest_experimental,http"),
    ],
)
def test_semconv_opt_in_adds_stable_http_unless_it_names_one(value: str | None, expected: str) -> None:
    assert semconv_opt_in(value) == expected


SEMCONV_PROBE = """
import os
from recmesh.telemetry import http_semconv_mode, setup_tracing
setup_tracing("probe", redis=False)
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor  # reads the mode as the gateway's does
print(os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"], http_semconv_mode().value, sep="|")
"""


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, "http|http"), ("http/dup", "http/dup|http/dup"), ("database", "database,http|http")],
)
def test_setup_tracing_opts_in_before_the_instrumentations_read_it(value: str | None, expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if value is not None:
        env["OTEL_SEMCONV_STABILITY_OPT_IN"] = value
    out = subprocess.run([sys.executable, "-c", SEMCONV_PROBE], env=env, capture_output=True, text=True,
                         check=True, timeout=60)  # fmt: skip
    assert out.stdout.strip() == expected, out.stderr


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:50051", {"server.address": "127.0.0.1", "server.port": 50051}),
        ("ranker", {"server.address": "ranker", "server.port": 443}),  # gRPC's default port
        ("dns:///ranker.recmesh.svc:7000", {"server.address": "ranker.recmesh.svc", "server.port": 7000}),
        ("dns://10.0.0.10/ranker:7000", {"server.address": "ranker", "server.port": 7000}),
        ("ipv4:10.0.0.1:81,10.0.0.2:82", {"server.address": "10.0.0.1", "server.port": 81}),
        ("ipv6:[::1]:50051", {"server.address": "::1", "server.port": 50051}),
        ("[fe80::1]:9", {"server.address": "fe80::1", "server.port": 9}),
        ("unix:///run/ranker.sock", {"server.address": "/run/ranker.sock"}),
        ("unix:ranker.sock", {"server.address": "ranker.sock"}),
        ("kafka-0:9093, kafka-1:9093", {"server.address": "kafka-0", "server.port": 9093}),
        ("", {}),
    ],
)
def test_server_attributes_of_a_dialled_address(address: str, expected: dict[str, str | int]) -> None:
    assert server_attributes(address, 443) == expected


class _KafkaClient:
    def __init__(self, bootstrap: object) -> None:
        self._bootstrap_servers = bootstrap


class _Producer:  # aiokafka's producer keeps its client as `client`, the consumer as `_client`
    def __init__(self, bootstrap: object) -> None:
        self.client = _KafkaClient(bootstrap)


class _Consumer:
    def __init__(self, bootstrap: object) -> None:
        self._client = _KafkaClient(bootstrap)


def test_kafka_server_attributes_name_the_first_bootstrap_server() -> None:
    assert kafka_server_attributes(_Producer("b1:9093,b2")) == {"server.address": "b1", "server.port": 9093}
    assert kafka_server_attributes(_Consumer(["b3", "b4:1"])) == {"server.address": "b3", "server.port": 9092}
    assert kafka_server_attributes(_Producer(None)) == {} and kafka_server_attributes(None) == {}


KAFKA_PROBE = """
from types import SimpleNamespace
from opentelemetry import trace
from recmesh.telemetry import kafka_consume_span, kafka_produce_span, kafka_trace_headers
from recmesh.telemetry import set_kafka_partition, setup_tracing
setup_tracing("probe", redis=False)
producer = SimpleNamespace(client=SimpleNamespace(_bootstrap_servers="broker:9093"))
consumer = SimpleNamespace(_client=SimpleNamespace(_bootstrap_servers="broker:9093"), _group_id="ingest")
with trace.get_tracer("t").start_as_current_span("request"):
    with kafka_produce_span("events", 2, producer=producer, slo_class="A") as span:
        headers = kafka_trace_headers()
        set_kafka_partition(span, [1, 1])
def record(partition):
    return SimpleNamespace(topic="events", partition=partition, headers=headers)
with kafka_consume_span([record(1), record(1)], consumer):
    pass
with kafka_consume_span([record(0), record(1), record(1)], consumer):
    pass
"""


def test_kafka_spans_follow_the_messaging_conventions(tmp_path: Path) -> None:
    spans_file = tmp_path / "spans.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RECMESH_SPANS"))}
    env["RECMESH_SPANS_FILE"] = str(spans_file)
    subprocess.run([sys.executable, "-c", KAFKA_PROBE], env=env, check=True, timeout=60)
    spans = [orjson.loads(line) for line in spans_file.read_bytes().splitlines()]
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        by_name.setdefault(span["name"], []).append(span)
    (sent,), (request,) = by_name["send events"], by_name["request"]
    common = {"messaging.system": "kafka", "messaging.destination.name": "events",
              "server.address": "broker", "server.port": 9093}  # fmt: skip
    assert sent["kind"] == "PRODUCER" and sent["parent_id"] == request["span_id"]
    assert sent["attributes"] == {
        **common, "messaging.operation.name": "send", "messaging.operation.type": "send",
        "messaging.batch.message_count": 2, "messaging.destination.partition.id": "1",
        "recmesh.slo_class": "A",
    }  # fmt: skip
    one, across = by_name["process events"]
    process = {**common, "messaging.operation.name": "process", "messaging.operation.type": "process",
               "messaging.consumer.group.name": "ingest"}  # fmt: skip
    assert one["kind"] == across["kind"] == "CONSUMER"
    assert one["attributes"] == {**process, "messaging.batch.message_count": 2,
                                 "messaging.destination.partition.id": "1"}  # fmt: skip
    assert across["attributes"] == {**process, "messaging.batch.message_count": 3}, "partitions: none named"
    assert one["links"] == across["links"] == [request["trace_id"]], "linked to the producing trace"


# --- the bounded flush at shutdown ------------------------------------------


class StuckExporter(SpanExporter):
    """Like an OTLP exporter retrying a collector that is down: each export
    waits until shutdown (or `stuck_s`), then fails."""

    def __init__(self, stuck_s: float = 30.0) -> None:
        self.stuck_s = stuck_s
        self.stopped = threading.Event()
        self.exports = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.exports += 1
        self.stopped.wait(self.stuck_s)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.stopped.set()


class GoodExporter(SpanExporter):
    def __init__(self) -> None:
        self.names: list[str] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.names += [s.name for s in spans]
        return SpanExportResult.SUCCESS


def _dropped(service: str, exporter: str, reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "recmesh_spans_dropped_total", {"service": service, "exporter": exporter, "reason": reason}
    )
    return value or 0.0


def _tracing(service: str, *exporters: tuple[str, SpanExporter, SpanExporter | None]) -> Tracing:
    def guarded(name: str, inner: SpanExporter, final: SpanExporter | None) -> _GuardedExporter:
        return _GuardedExporter(inner, service, name, (lambda _timeout_s: final) if final else None)

    pipelines = [
        _CountedProcessor(guarded(*exporter), schedule_delay_millis=60_000, max_export_batch_size=4)
        for exporter in exporters
    ]
    provider = TracerProvider(resource=Resource.create({"service.name": service}), shutdown_on_exit=False)
    for pipeline in pipelines:
        provider.add_span_processor(pipeline)
    return Tracing(service, provider, pipelines)


def test_shutdown_gives_a_stuck_exporter_one_final_attempt_then_cuts_it_off() -> None:
    """The running exporter is stuck retrying its first batch; the flush stops
    that retry, gives the batch and the rest one attempt with a final exporter
    that is also stuck, and cuts it off at the budget: every span counted."""
    running, final, spans_file = StuckExporter(), StuckExporter(), GoodExporter()
    tracing = _tracing("unit-stuck", ("otlp", running, final), ("spans_file", spans_file, None))
    tracer = tracing.provider.get_tracer("t")
    for i in range(10):  # 4 wake the worker, which takes them into the stuck export
        tracer.start_span(f"s{i}").end()
    for _ in range(200):
        if running.exports:
            break
        time.sleep(0.01)
    assert running.exports == 1
    started = time.monotonic()
    tracing.shutdown(0.3)
    took = time.monotonic() - started
    assert 0.3 <= took < 0.3 + ABANDON_GRACE_S + 0.2, took
    assert running.stopped.is_set() and final.exports == 1
    assert sorted(spans_file.names) == sorted(f"s{i}" for i in range(10)), "the file still got every span"
    assert _dropped("unit-stuck", "otlp", "unsent") == 10
    assert _dropped("unit-stuck", "otlp", "export_failed") == 0
    assert _dropped("unit-stuck", "spans_file", "unsent") == 0


def test_shutdown_stops_at_the_first_failed_final_attempt() -> None:
    """A collector that refuses at once (down, or the other protocol): one
    failed batch, the rest dropped without waiting out the budget."""
    tracing = _tracing("unit-refused", ("otlp", StuckExporter(), StuckExporter(stuck_s=0)))
    for i in range(3):
        tracing.provider.get_tracer("t").start_span(f"s{i}").end()
    started = time.monotonic()
    tracing.shutdown(5.0)
    assert time.monotonic() - started < 1.0
    assert _dropped("unit-refused", "otlp", "export_failed") == 3
    assert _dropped("unit-refused", "otlp", "unsent") == 0
