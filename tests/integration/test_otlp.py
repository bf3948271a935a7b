"""Traces reach OTLP collectors the way the standard OTEL_* variables say, and a
collector that is down never holds a stopping service.

Receivers are small real servers (tests/otlp_receivers.py): OTLP/HTTP decoding
ExportTraceServiceRequest at /v1/traces, and an OTLP/gRPC TraceService. The
first tests run one process that sets up tracing as a service does and ends a
span; the mesh tests run feature, inference, ranker and gateway (and the
ingest) as their own processes with the variables set, as a user would, and
read the spans' names and attributes as a backend would (the semantic
conventions: stable HTTP on every gateway route, messaging for Kafka,
`server.address`/`server.port` on client spans).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from recmesh.features.repository import FeatureSet
from recmesh.redis_client import connect
from recmesh.tools.demo.generate import make_catalog, offline_rows
from recmesh.tools.localinfra import ManagedProcess, port_is_free
from recmesh.topics import ensure_topics
from services.feature.catalog import load_catalog
from tests.helpers import free_port, poll_until
from tests.otlp_receivers import GrpcReceiver, HttpReceiver, ReceivedSpan

STOP_WITHIN_S = 3.0
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SAMPLED_CALLER = f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"

PROBE = f"""
from opentelemetry import trace
from opentelemetry.propagate import extract
from recmesh.settings import CommonSettings
from recmesh.telemetry import setup_logging, setup_tracing
setup_logging("probe")
setup_tracing("probe", redis=False, flush_s=CommonSettings().telemetry_flush_s)
tracer = trace.get_tracer("probe")
caller = extract({{"traceparent": "{SAMPLED_CALLER}"}})
with tracer.start_as_current_span("from-a-sampled-caller", context=caller):
    pass
with tracer.start_as_current_span("a-root"):
    pass
print("spans ended", flush=True)
"""


def _clean_env(extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RECMESH_"))}
    # The suite's plaintext gRPC between the services it starts (tests/conftest.py).
    return {**env, "RECMESH_TLS": os.environ.get("RECMESH_TLS", "off"), **extra}


@dataclass
class Probe:
    returncode: int
    stderr: str
    exit_s: float  # from its last span to the end of the process (the flush at exit)


def _probe(env: Mapping[str, str]) -> Probe:
    with subprocess.Popen([sys.executable, "-c", PROBE], env=_clean_env(env), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:  # fmt: skip
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        ended = time.monotonic()
        returncode = proc.wait(timeout=60)
        exit_s = time.monotonic() - ended
        stderr = proc.stderr.read()
    assert line.strip() == "spans ended" or returncode != 0, stderr
    return Probe(returncode, stderr, exit_s)


# --- one process, each standard variable ------------------------------------


def test_http_protobuf_to_the_generic_endpoint_with_headers_and_resource_attributes() -> None:
    with HttpReceiver("/v1/traces") as receiver:
        probe = _probe({
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,  # /v1/traces appended
            "OTEL_EXPORTER_OTLP_HEADERS": "x-otlp-token=s3cret",
            "OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attributes,deployment.environment=test",
        })  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    names = {s.name for s in receiver.spans}
    assert names == {"from-a-sampled-caller", "a-root"}, "no sampler set: the SDK's parentbased_always_on"
    assert {s.service for s in receiver.spans} == {"from-attributes"}
    assert receiver.spans[0].resource["deployment.environment"] == "test"
    assert all(h.get("x-otlp-token") == "s3cret" for h in receiver.headers)
    assert receiver.headers[0]["content-type"] == "application/x-protobuf"


def test_signal_specific_variables_win_and_the_traces_endpoint_is_used_as_is() -> None:
    with HttpReceiver("/custom/traces") as receiver:
        probe = _probe({
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{receiver.url}/custom/traces",
            "OTEL_EXPORTER_OTLP_HEADERS": "x-otlp-token=generic",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-otlp-token=traces",
            "OTEL_SERVICE_NAME": "named",
            "OTEL_RESOURCE_ATTRIBUTES": "service.name=not-this-one",
        })  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert receiver.refused == [] and len(receiver.spans) == 2
    assert {s.service for s in receiver.spans} == {"named"}, "OTEL_SERVICE_NAME wins"
    assert all(h.get("x-otlp-token") == "traces" for h in receiver.headers)


def test_grpc_by_default_with_the_sampler_from_the_environment() -> None:
    with GrpcReceiver() as receiver:
        probe = _probe({
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-otlp-token=s3cret",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0",
        })  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    # Ratio 0: no trace starts sampled here, but a sampled caller's is recorded.
    assert [(s.name, s.trace_id, s.service) for s in receiver.spans] == [
        ("from-a-sampled-caller", CALLER_TRACE, "probe")
    ]
    assert receiver.headers[0]["x-otlp-token"] == "s3cret"


@pytest.mark.parametrize("switch", [{"OTEL_TRACES_EXPORTER": "none"}, {"OTEL_SDK_DISABLED": "true"}])
def test_no_export_when_switched_off(switch: dict[str, str]) -> None:
    with GrpcReceiver() as receiver:
        probe = _probe({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, **switch})
    assert probe.returncode == 0, probe.stderr
    assert receiver.spans == [] and receiver.headers == []


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        (
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "http/json",
            "OTEL_EXPORTER_OTLP_PROTOCOL='http/json' is not supported",
        ),
        ("OTEL_TRACES_SAMPLER", "sometimes", "OTEL_TRACES_SAMPLER='sometimes' is not one of"),
        ("OTEL_TRACES_EXPORTER", "zipkin", "OTEL_TRACES_EXPORTER: unsupported exporter zipkin"),
    ],
)
def test_a_value_recmesh_cannot_honour_stops_start_up_naming_the_variable(
    variable: str, value: str, named: str
) -> None:
    probe = _probe({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}", variable: value})
    assert probe.returncode != 0 and named in probe.stderr, probe.stderr


class HungCollector:
    """Accepts connections (the kernel's backlog) and never answers."""

    def __enter__(self) -> str:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def __exit__(self, *_: object) -> None:
        self._sock.close()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize("collector", ["dead", "other protocol", "hung"])
def test_the_flush_at_exit_is_bounded(protocol: str, collector: str) -> None:
    """With the collector down, speaking the other protocol, or never
    answering, the process ends within its flush budget (the SDK's own
    shutdown retried each batch for up to 10 s), and says once what it dropped."""
    flush_s = 0.5
    with HttpReceiver() as http_receiver, GrpcReceiver() as grpc_receiver, HungCollector() as hung:
        endpoint = {
            "dead": f"http://127.0.0.1:{free_port()}",
            "other protocol": (http_receiver if protocol == "grpc" else grpc_receiver).url,
            "hung": hung,
        }[collector]
        probe = _probe({"OTEL_EXPORTER_OTLP_PROTOCOL": protocol, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                        "RECMESH_TELEMETRY_FLUSH_S": str(flush_s)})  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert probe.exit_s < flush_s + 1.0, f"{probe.exit_s:.2f} s to exit:\n{probe.stderr[-2000:]}"
    dropped = [orjson.loads(line) for line in probe.stderr.splitlines() if '"spans_dropped"' in line]
    assert len(dropped) == 1, probe.stderr
    counts = dropped[0]["dropped"]["otlp"]
    assert counts["unsent"] + counts["export_failed"] == 2, dropped
    assert http_receiver.spans == [] and grpc_receiver.spans == []


# --- the mesh, as separate processes -----------------------------------------

SERVICES = ("feature", "inference", "ranker", "gateway")
PORT_VARS = (
    "FEATURE_PORT", "INFERENCE_PORT", "RANKER_PORT", "GATEWAY_HTTP_PORT", "GATEWAY_GRPC_PORT",
    "GATEWAY_METRICS_PORT", "FEATURE_METRICS_PORT", "INFERENCE_METRICS_PORT", "RANKER_METRICS_PORT",
    "INGEST_METRICS_PORT",
)  # fmt: skip


@pytest.fixture(scope="module")
async def mesh_redis(redis_url: str, demo_feature_set: FeatureSet) -> str:
    """Database 3 with the demo catalog, so a recommendation runs every hop."""
    url = redis_url.rsplit("/", 1)[0] + "/3"
    client = connect(url, 4)
    try:
        await load_catalog(client, demo_feature_set, *offline_rows(make_catalog()))
    finally:
        await client.aclose()
    return url


@dataclass
class Mesh:
    procs: dict[str, ManagedProcess]
    ports: dict[str, int]
    events_topic: str

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.ports['GATEWAY_HTTP_PORT']}"

    def stop_all(self, sig: signal.Signals = signal.SIGTERM) -> dict[str, float]:
        """Signal every process at once (as a pod's containers are); seconds
        until each has exited and every port is free."""
        started = time.monotonic()
        for proc in self.procs.values():
            assert proc.proc is not None and proc.exited() is None, proc.log_tail()
            proc.proc.send_signal(sig)
        took: dict[str, float] = {}
        while len(took) < len(self.procs) and time.monotonic() - started < 15:
            for name, proc in self.procs.items():
                if name not in took and proc.exited() is not None:
                    took[name] = round(time.monotonic() - started, 2)
            time.sleep(0.01)
        while any(not port_is_free("127.0.0.1", p) for p in self.ports.values()):
            if time.monotonic() - started > 15:
                break
            time.sleep(0.01)
        took["ports free"] = round(time.monotonic() - started, 2)
        for proc in self.procs.values():
            proc.stop(timeout_s=1)
        return took


StartMesh = Callable[..., Awaitable[Mesh]]


@pytest.fixture
def start_mesh(mesh_redis: str, kafka_bootstrap: str, model_dir: Path, tmp_path: Path) -> Iterator[StartMesh]:
    """start(otel, ingest=False, names=True, overrides={service: env}): the
    services as processes with these variables (names: OTEL_SERVICE_NAME
    recmesh-<service>, as `recmesh up` sets it), once the gateway is ready."""
    started: list[Mesh] = []

    async def start(
        otel: Mapping[str, str],
        ingest: bool = False,
        names: bool = True,
        overrides: Mapping[str, Mapping[str, str]] | None = None,
    ) -> Mesh:
        ports = {name: free_port() for name in PORT_VARS}
        suffix = f"{len(started)}-{ports['GATEWAY_HTTP_PORT']}"
        topics = {"RECMESH_EVENTS_TOPIC": f"otlp-events-{suffix}", "RECMESH_DLQ_TOPIC": f"otlp-dlq-{suffix}",
                  "RECMESH_SERVED_TOPIC": f"otlp-served-{suffix}"}  # fmt: skip
        await ensure_topics(kafka_bootstrap, {topic: 1 for topic in topics.values()})
        env = _clean_env({
            "REDIS_URL": mesh_redis, "KAFKA_BOOTSTRAP": kafka_bootstrap, "RECMESH_MODEL_DIR": str(model_dir),
            "RECMESH_TEXT_BACKEND": "onnx", **topics, **{k: str(v) for k, v in ports.items()},
            **{f"{s}_ADDR": f"127.0.0.1:{ports[f'{s}_PORT']}" for s in ("FEATURE", "INFERENCE", "RANKER")},
            **otel,
        })  # fmt: skip
        modules = {name: f"services.{name}" for name in SERVICES}
        if ingest:
            modules["feature-ingest"] = "services.feature.ingest"
        procs = {}
        for name, module in modules.items():
            own = dict(env, OTEL_SERVICE_NAME=f"recmesh-{name}") if names else dict(env)
            own.update((overrides or {}).get(name, {}))
            procs[name] = ManagedProcess(
                name, [sys.executable, "-m", module], tmp_path / f"{suffix}-{name}.log", own
            )
        mesh = Mesh(procs, ports, topics["RECMESH_EVENTS_TOPIC"])
        started.append(mesh)
        for proc in procs.values():
            proc.start()
        async with httpx.AsyncClient(timeout=2.0) as http:

            async def ready() -> bool:
                dead = [p.name for p in procs.values() if p.exited() is not None]
                assert not dead, "\n".join(procs[n].log_tail() for n in dead)
                try:
                    return (await http.get(f"{mesh.http}/readyz")).status_code == 200
                except httpx.HTTPError:
                    return False

            await poll_until(ready, "the mesh's /readyz", timeout=90, interval=0.1)
        return mesh

    yield start
    for mesh in started:
        for proc in mesh.procs.values():
            proc.stop(timeout_s=2)


async def _recommend(mesh: Mesh, traceparent: str | None = None) -> str:
    headers = {"traceparent": traceparent} if traceparent else {}
    async with httpx.AsyncClient(timeout=5) as http:
        resp = await http.post(
            f"{mesh.http}/v1/recommend", json={"user_id": "u42", "count": 10}, headers=headers
        )
    assert resp.status_code == 200, resp.text
    return str(resp.json()["trace_id"])


async def _post_events(mesh: Mesh, prefix: str, count: int) -> set[str]:
    now = int(time.time() * 1000)
    ids = [f"{prefix}-{i}" for i in range(count)]
    events = [{"event_id": event_id, "user_id": "u42", "item_id": f"i{i}", "behavior": "click",
               "event_time": now - i} for i, event_id in enumerate(ids)]  # fmt: skip
    async with httpx.AsyncClient(timeout=5) as http:
        resp = await http.post(f"{mesh.http}/v1/events", json={"events": events})
    assert resp.status_code == 202, resp.text
    return set(ids)


async def _on_topic(bootstrap: str, topic: str, wanted: set[str]) -> set[str]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    await consumer.start()
    seen: set[str] = set()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.seek_to_beginning(TopicPartition(topic, 0))

        async def all_there() -> bool:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                seen.update(str(orjson.loads(r.value)["event_id"]) for r in records if r.value)
            return wanted <= seen

        await poll_until(all_there, f"{len(wanted)} accepted events on {topic}", timeout=10, interval=0)
    finally:
        await consumer.stop()
    return seen


async def _whole_trace(
    receiver: HttpReceiver | GrpcReceiver, trace_id: str, names: set[str]
) -> dict[str, int]:
    async def arrived() -> dict[str, int]:
        counts = receiver.per_service(trace_id)
        return counts if names <= set(counts) else {}

    # Spans leave each process in batches (OTEL_BSP_SCHEDULE_DELAY, 200 ms here).
    return await poll_until(arrived, f"spans of {trace_id} from {sorted(names)}", timeout=15)


# --- semantic conventions, as a backend reads them ---------------------------

# The HTTP attributes the stable conventions replaced (OTEL_SEMCONV_STABILITY_OPT_IN=http drops them).
OLD_HTTP = {"http.method", "http.status_code", "http.scheme", "http.target", "http.url", "http.flavor",
            "http.host", "http.server_name", "http.user_agent", "net.host.name", "net.host.port",
            "net.peer.ip", "net.peer.port", "net.peer.name", "net.transport"}  # fmt: skip


def _sampled_caller() -> tuple[str, str]:
    trace_id = os.urandom(16).hex()
    return trace_id, f"00-{trace_id}-{os.urandom(8).hex()}-01"


async def _spans(
    receiver: HttpReceiver | GrpcReceiver, what: str, match: Callable[[ReceivedSpan], bool]
) -> list[ReceivedSpan]:
    async def arrived() -> list[ReceivedSpan]:
        with receiver.lock:
            return [s for s in receiver.spans if match(s)]

    return await poll_until(arrived, what, timeout=30)


async def _route_span(
    receiver: HttpReceiver | GrpcReceiver, mesh: Mesh, method: str, path: str, **request: Any
) -> tuple[int, ReceivedSpan]:
    """The status of one request to the gateway and its SERVER span (the request's own trace)."""
    trace_id, caller = _sampled_caller()
    async with httpx.AsyncClient(timeout=10) as http:
        resp = await http.request(method, f"{mesh.http}{path}", headers={"traceparent": caller}, **request)
    spans = await _spans(receiver, f"the gateway's SERVER span of {method} {path}",
                         lambda s: s.trace_id == trace_id and s.kind == "SERVER"
                         and s.service == "recmesh-gateway")  # fmt: skip
    assert len(spans) == 1, spans
    return resp.status_code, spans[0]


def _assert_stable_http(span: ReceivedSpan, method: str, path: str, status: int, route: str | None) -> None:
    attributes = span.attributes
    assert span.name == (f"{method} {route}" if route else method), span
    assert attributes["http.request.method"] == method
    assert attributes["http.response.status_code"] == status
    assert attributes["url.scheme"] == "http" and attributes["url.path"] == path
    assert attributes.get("http.route") == route
    assert attributes["network.protocol.version"] == "1.1"
    assert str(attributes["user_agent.original"]).startswith("python-httpx/")
    assert "server.address" in attributes and "server.port" in attributes
    assert not OLD_HTTP & set(attributes), sorted(OLD_HTTP & set(attributes))


def _assert_has(span: ReceivedSpan, expected: Mapping[str, Any]) -> None:
    got = {k: span.attributes.get(k) for k in expected}
    assert got == dict(expected), f"{span.name}: {span.attributes}"


def _standard(span: ReceivedSpan) -> set[str]:
    return {k for k in span.attributes if not k.startswith("recmesh.")}


async def _assert_conventions(
    receiver: HttpReceiver | GrpcReceiver, mesh: Mesh, redis_url: str, kafka_bootstrap: str
) -> None:
    """Every gateway route's SERVER span in the stable HTTP vocabulary (the
    hand-written /v1/recommend one with the same attributes as FastAPI's),
    the Kafka spans in the messaging one, and the client spans naming their
    peer (a trace backend's service map)."""
    traced = receiver.in_trace(CALLER_TRACE)
    recommend = [s for s in traced if s.kind == "SERVER" and s.service == "recmesh-gateway"]
    assert len(recommend) == 1, recommend
    _assert_stable_http(recommend[0], "POST", "/v1/recommend", 200, "/v1/recommend")
    now = int(time.time() * 1000)
    events = [{"event_id": f"semconv-{i}", "user_id": "u42", "item_id": f"i{i}", "behavior": "click",
               "event_time": now - i} for i in range(3)]  # fmt: skip
    status, posted = await _route_span(receiver, mesh, "POST", "/v1/events", json={"events": events})
    assert status == 202
    _assert_stable_http(posted, "POST", "/v1/events", 202, "/v1/events")
    text = "The trail opened last spring. Hikers reach the summit in four hours. The hut serves soup."
    status, summarized = await _route_span(
        receiver, mesh, "POST", "/v2/ai-tool/summarize", json={"text": text, "max_sentences": 1}
    )
    _assert_stable_http(summarized, "POST", "/v2/ai-tool/summarize", status, "/v2/ai-tool/summarize")
    status, refused = await _route_span(receiver, mesh, "POST", "/v1/recommend", json={"count": 3})
    assert status == 400
    _assert_stable_http(refused, "POST", "/v1/recommend", 400, "/v1/recommend")
    status, unknown = await _route_span(receiver, mesh, "GET", "/v1/no-such-route")
    assert status == 404
    _assert_stable_http(unknown, "GET", "/v1/no-such-route", 404, None)  # no route matched: named by method
    # The hand-written span carries what the instrumentation's do.
    differ = _standard(recommend[0]) ^ _standard(posted)
    assert not differ and _standard(posted) == _standard(summarized), differ

    kafka_host, _, kafka_port = kafka_bootstrap.partition(":")
    kafka_peer = {"server.address": kafka_host, "server.port": int(kafka_port)}
    topic = mesh.events_topic
    sent = [s for s in receiver.in_trace(posted.trace_id) if s.kind == "PRODUCER"]
    assert len(sent) == 1 and sent[0].name == f"send {topic}", sent
    messaging = {"messaging.system": "kafka", "messaging.destination.name": topic,
                 "messaging.destination.partition.id": "0", **kafka_peer}  # fmt: skip
    _assert_has(sent[0], {**messaging, "messaging.operation.name": "send", "messaging.operation.type": "send",
                          "messaging.batch.message_count": 3})  # fmt: skip
    # The ingest's batch: its own trace, linked to the request that sent the events.
    processed = await _spans(receiver, "the ingest's CONSUMER span linked to the events' trace",
                             lambda s: s.kind == "CONSUMER" and posted.trace_id in s.links)  # fmt: skip
    consumed = processed[0]
    assert consumed.service == "recmesh-feature-ingest" and consumed.name == f"process {topic}", consumed
    _assert_has(consumed, {**messaging, "messaging.operation.name": "process",
                           "messaging.operation.type": "process",
                           "messaging.consumer.group.name": "recmesh-feature-ingest"})  # fmt: skip
    assert int(consumed.attributes["messaging.batch.message_count"]) >= 1

    ranker_calls = [s for s in traced if s.kind == "CLIENT"
                    and s.attributes.get("rpc.service") == "recmesh.v1.RankerService"]  # fmt: skip
    assert ranker_calls and all(s.service == "recmesh-gateway" for s in ranker_calls), ranker_calls
    for call in ranker_calls:
        _assert_has(call, {"server.address": "127.0.0.1", "server.port": mesh.ports["RANKER_PORT"]})
    redis = urlsplit(redis_url)
    redis_calls = [s for s in traced if s.attributes.get("db.system") == "redis"]
    assert redis_calls, sorted({s.name for s in traced})
    for call in redis_calls:
        assert call.kind == "CLIENT" and not OLD_HTTP & set(call.attributes), call
        _assert_has(call, {"server.address": redis.hostname, "server.port": redis.port})


async def test_one_recommendation_traced_across_the_mesh_at_an_otlp_http_receiver(
    start_mesh: StartMesh, mesh_redis: str, kafka_bootstrap: str
) -> None:
    with HttpReceiver("/v1/traces") as receiver:
        mesh = await start_mesh({
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_EXPORTER_OTLP_HEADERS": "x-otlp-token=s3cret",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }, ingest=True)  # fmt: skip
        assert await _recommend(mesh, SAMPLED_CALLER) == CALLER_TRACE
        counts = await _whole_trace(receiver, CALLER_TRACE, {f"recmesh-{s}" for s in SERVICES})
        print(f"\nOTLP/HTTP receiver, spans of one recommendation per service: {counts}")
        assert all(h.get("x-otlp-token") == "s3cret" for h in receiver.headers)
        await _assert_conventions(receiver, mesh, mesh_redis, kafka_bootstrap)
        # Stopping right after a request: the flush at exit delivers its spans to a live collector.
        last = await _recommend(mesh)
        took = mesh.stop_all()
        print(f"stop with the collector up: {took}")
        assert set(receiver.per_service(last)) >= {"recmesh-gateway", "recmesh-ranker"}
        assert max(took.values()) <= STOP_WITHIN_S, took


async def test_one_recommendation_traced_across_the_mesh_at_an_otlp_grpc_receiver(
    start_mesh: StartMesh, kafka_bootstrap: str
) -> None:
    receiver = GrpcReceiver().__enter__()
    try:
        mesh = await start_mesh({
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_RESOURCE_ATTRIBUTES": "service.namespace=recmesh,deployment.environment=test",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }, names=False)  # fmt: skip
        assert await _recommend(mesh, SAMPLED_CALLER) == CALLER_TRACE
        # No OTEL_SERVICE_NAME: each service is named after its process.
        counts = await _whole_trace(receiver, CALLER_TRACE, set(SERVICES))
        print(f"\nOTLP/gRPC receiver, spans of one recommendation per service: {counts}")
        assert {s.resource["deployment.environment"] for s in receiver.in_trace(CALLER_TRACE)} == {"test"}
    finally:
        receiver.stop()
    # The collector goes away while the mesh serves: spans queue, exports fail and retry.
    await _recommend(mesh)
    accepted = await _post_events(mesh, "grpc-down", 20)
    took = mesh.stop_all()
    print(f"stop after the collector went down: {took}")
    assert max(took.values()) <= STOP_WITHIN_S, took
    assert accepted <= await _on_topic(kafka_bootstrap, mesh.events_topic, accepted), "a 202 event was lost"


async def test_a_mesh_started_against_a_dead_or_mismatched_collector_stops_in_time(
    start_mesh: StartMesh, kafka_bootstrap: str
) -> None:
    """gateway and feature export over gRPC to a port nothing listens on;
    ranker, inference and the ingest over OTLP/HTTP to a gRPC receiver."""
    with GrpcReceiver() as grpc_receiver:
        mismatched = {
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": grpc_receiver.url,
        }
        mesh = await start_mesh(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}"},
            ingest=True,
            overrides={name: mismatched for name in ("ranker", "inference", "feature-ingest")},
        )
        for _ in range(5):
            await _recommend(mesh, SAMPLED_CALLER)
        accepted = await _post_events(mesh, "dead", 50)
        await asyncio.sleep(0.5)  # the ingest takes the events (its spans too)
        accepted |= await _post_events(mesh, "dead-last", 20)
        took = mesh.stop_all(signal.SIGINT)
        print(f"\nstop with the collector dead or speaking the other protocol: {took}")
        assert max(took.values()) <= STOP_WITHIN_S, took
        assert grpc_receiver.spans == []
    assert accepted <= await _on_topic(kafka_bootstrap, mesh.events_topic, accepted), "a 202 event was lost"
    for name, proc in mesh.procs.items():
        log = proc.log_path.read_text()
        assert log.count('"spans_dropped"') == 1, f"{name} says once what it dropped:\n{log[-2000:]}"
