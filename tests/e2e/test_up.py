"""`recmesh up` started as a user would (mutual TLS between the services, Redis
ACL users: its defaults), exercised over REST and gRPC, broken into from
outside the call graph, then stopped with SIGINT: every child must be gone
and every port free."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import psutil
import pytest

from recmesh.features.repository import DEMO_REPOSITORY, load_feature_set
from recmesh.tools.bench.proccpu import child_pids
from recmesh.tools.localinfra import port_is_free
from recmesh.tools.up import DEMO_API_KEY
from recmesh.v1 import recommender_pb2, recommender_pb2_grpc
from tests.helpers import free_port, own_model_dir, poll_until

pytestmark = pytest.mark.e2e

PORT_VARS = (
    "GATEWAY_HTTP_PORT", "GATEWAY_GRPC_PORT", "FEATURE_PORT", "INFERENCE_PORT", "RANKER_PORT",
    "GATEWAY_METRICS_PORT", "FEATURE_METRICS_PORT", "INFERENCE_METRICS_PORT", "RANKER_METRICS_PORT",
    "INGEST_METRICS_PORT", "RECMESH_REDIS_PORT", "RECMESH_KAFKA_PORT",
)  # fmt: skip


@dataclass
class Running:
    proc: subprocess.Popen[bytes]
    ports: dict[str, int]
    spans: Path
    log: Path
    state: Path

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.ports['GATEWAY_HTTP_PORT']}"

    def cli_env(self) -> dict[str, str]:
        """The CLI's credentials and addresses, as `up` wrote them (secrets/cli.env)."""
        pairs = (line.split("=", 1) for line in (self.state / "secrets" / "cli.env").read_text().splitlines())
        return {**os.environ, "RECMESH_TLS": "on", **{k: shlex.split(v)[0] for k, v in pairs}}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="module")
def running(
    tmp_path_factory: pytest.TempPathFactory, model_dir: Path, embed_model_dir: Path
) -> Iterator[Running]:
    state = tmp_path_factory.mktemp("state")
    own = own_model_dir(model_dir, embed_model_dir, state / "models")
    ports = {name: free_port() for name in PORT_VARS}
    spans = state / "spans.jsonl"
    env = dict(os.environ, RECMESH_STATE_DIR=str(state), RECMESH_MODEL_DIR=str(own),
               RECMESH_SPANS_FILE=str(spans), RECMESH_SERVED_LOG_RATE="1",
               **{k: str(v) for k, v in ports.items()})  # fmt: skip
    for var in ("REDIS_URL", "KAFKA_BOOTSTRAP", "RECMESH_TLS"):  # RECMESH_TLS: its default, on
        env.pop(var, None)
    log = state / "up.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "recmesh.tools.cli.main", "up", "--demo-events", "500"],
            stdout=fh, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    running = Running(proc, ports, spans, log, state)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"recmesh up exited early:\n{log.read_text()}"
            if "recmesh is up" in log.read_text():
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"mesh not up in 120 s:\n{log.read_text()}")
        yield running
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_ready_events_and_recommendations(running: Running) -> None:
    # The wait for the posted clicks below can leave the connection idle past the
    # gateway's keep-alive (uvicorn's 5 s): a request sent as the server closes it
    # reads nothing (httpx.ReadError, seen once on a slow box). A client forgets
    # an idle connection sooner than the server does, as one should.
    limits = httpx.Limits(keepalive_expiry=2.0)
    async with httpx.AsyncClient(base_url=running.http, timeout=5, limits=limits) as http:
        ready = await http.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"] == {
            "ranker": True,
            "feature": True,
            "inference": True,
            "event_broker": True,
        }

        now = int(time.time() * 1000)
        events = [{"event_id": f"e2e-{i}", "user_id": "e2e-user", "item_id": f"i{i}",
                   "behavior": "click", "event_time": now - i * 1000} for i in range(3)]  # fmt: skip
        posted = await http.post("/v1/events", json={"events": events})
        assert posted.status_code == 202 and posted.json() == {"accepted": 3}
        events_trace = posted.headers["traceparent"].split("-")[1]

        bad = await http.post("/v1/events", json={"events": [{**events[0], "behavior": "like"}]})
        assert bad.status_code == 400 and "events[0].behavior" in bad.json()["message"]

        async def seen() -> bool:
            out = subprocess.run(  # noqa: ASYNC221 (the CLI, exactly as a user runs it)
                [sys.executable, "-m", "recmesh.tools.cli.main", "features", "get", "--user", "e2e-user",
                 "--addr", f"127.0.0.1:{running.ports['FEATURE_PORT']}"],
                capture_output=True, text=True, check=True, env=running.cli_env(),
            )  # fmt: skip
            feats = json.loads(out.stdout)["user"]["features"]
            return bool(feats["clicks_5m"]["value"] == 3 and feats["clicks_5m"]["source"] == "realtime")

        await poll_until(seen, "posted clicks visible as real-time features", timeout=15, interval=0.3)

        trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
        resp = await http.post(
            "/v1/recommend",
            json={"user_id": "e2e-user", "count": 10},
            headers={
                "x-slo-class": "A",
                "x-api-key": "demo-interactive",
                "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01",
            },
        )
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert len(body["items"]) == 10 and len({i["item_id"] for i in body["items"]}) == 10
        assert body["slo_class"] == "A" and body["trace_id"] == trace_id
        demo_version = load_feature_set(DEMO_REPOSITORY).version
        assert body["model_version"].startswith("ctr-") and body["feature_version"] == demo_version
        assert body["degraded"] == []
        assert resp.headers["traceparent"].split("-")[1] == trace_id
        clicked = {e["item_id"] for e in events}
        assert not clicked & {i["item_id"] for i in body["items"]}, "just-seen items are filtered"

        unknown = await http.post("/v1/recommend", json={"user_id": "u1"}, headers={"x-slo-class": "Q"})
        assert unknown.status_code == 400

        anonymous = await http.post("/v1/recommend", json={"user_id": "u1"}, headers={"x-slo-class": "A"})
        assert anonymous.status_code == 200 and anonymous.json()["slo_class"] == "B", (
            "no escalation by header"
        )
        assert "slo_class_downgraded:A->B" in anonymous.json()["degraded"]

        # Off the public port (tenant labels): on the gateway's metrics port.
        assert (await http.get("/metrics")).status_code == 404
        gateway_metrics = f"http://127.0.0.1:{running.ports['GATEWAY_METRICS_PORT']}/metrics"
        metrics = (await http.get(gateway_metrics)).text
        assert (
            'recmesh_request_duration_seconds_bucket{code="200",le="0.005",'
            'method="POST /v1/recommend",service="gateway",slo_class="A"}' in metrics
        )

        await _check_traces(running, trace_id, events_trace)


async def _check_traces(running: Running, trace_id: str, events_trace: str) -> None:
    """The recommendation's one trace across the services (its Redis reads, the served-feature
    log's send, a span per ranking stage) and the posted events' trace, linked from the consumer."""

    def spans_in_trace() -> list[dict[str, Any]]:
        if not running.spans.exists():
            return []
        rows = [json.loads(line) for line in running.spans.read_text().splitlines() if line]
        return [r for r in rows if r["trace_id"] == trace_id]

    async def whole_trace() -> bool:
        # Each process exports its spans in batches (every 200 ms), so poll
        # until every service's part, down to the last stage, has landed.
        spans = spans_in_trace()
        return {r["service"] for r in spans} >= {
            "recmesh-gateway",
            "recmesh-ranker",
            "recmesh-feature",
            "recmesh-inference",
        } and {"stage.diversity", "send served_features"} <= {r["name"] for r in spans}

    await poll_until(whole_trace, "one trace across gateway, ranker, feature and inference", timeout=10)
    rows = [json.loads(line) for line in running.spans.read_text().splitlines() if line]
    redis_spans = [
        r for r in rows if r["trace_id"] == trace_id and r["attributes"].get("db.system") == "redis"
    ]
    assert redis_spans and {r["attributes"]["recmesh.slo_class"] for r in redis_spans} == {"A"}
    # The feature service's served-feature log: its Kafka send is part of the trace.
    served = [r for r in rows if r["trace_id"] == trace_id and r["name"] == "send served_features"]
    feature_spans = {r["span_id"] for r in rows if r["service"] == "recmesh-feature"}
    assert served and all(
        r["kind"] == "PRODUCER" and r["attributes"]["messaging.system"] == "kafka"
        and r["attributes"]["recmesh.slo_class"] == "A" and r["parent_id"] in feature_spans
        for r in served
    ), served  # fmt: skip
    # One span per node of the ranking graph, recall sources with their counts and sigma.
    stages = {
        r["name"]: r["attributes"]
        for r in rows
        if r["trace_id"] == trace_id and r["name"].startswith("stage.")
    }
    assert set(stages) >= {"stage.user", "stage.popular", "stage.covisit", "stage.category",
                           "stage.semantic", "stage.fuse", "stage.score", "stage.diversity"}  # fmt: skip
    assert stages["stage.popular"]["recmesh.source"] == "popular"
    assert stages["stage.popular"]["recmesh.candidates"] > 0
    assert stages["stage.category"]["recmesh.candidates"] > 0
    assert "recmesh.sigma" in stages["stage.semantic"]
    publish = [r for r in rows if r["trace_id"] == events_trace and r["kind"] == "PRODUCER"]
    assert publish and publish[0]["attributes"]["messaging.system"] == "kafka"

    async def consumer_linked() -> bool:
        rows = [json.loads(line) for line in running.spans.read_text().splitlines() if line]
        return any(
            events_trace in r["links"]
            for r in rows
            if r["kind"] == "CONSUMER" and r["service"] == "recmesh-feature-ingest"
        )

    # The consumer applies the posted events on its own schedule: wait for its span.
    await poll_until(consumer_linked, "the consumer's span links to the producer", timeout=10)


def test_the_supervisor_keeps_nothing_of_its_start_up_steps(running: Running) -> None:
    # The model check, the encoder's export and the catalog load ran in a child
    # (up.in_child): ONNX, which they load, is not in the long-lived process.
    maps = Path(f"/proc/{running.proc.pid}/maps").read_text()
    assert "/site-packages/onnx" not in maps
    assert "/site-packages/onnxruntime" not in maps


async def test_grpc_recommender(running: Running) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.ports['GATEWAY_GRPC_PORT']}") as channel:
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        resp = await stub.Recommend(
            recommender_pb2.RecommendRequest(user_id="u42", count=5),
            metadata=(("x-slo-class", "B"),),
            timeout=5,
        )
        assert len(resp.items) == 5 and resp.slo_class == "B" and len(resp.trace_id) == 32
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Recommend(recommender_pb2.RecommendRequest(user_id="u42", count=5),
                                 metadata=(("x-slo-class", "Z"),), timeout=5)  # fmt: skip
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # No key: asking for A is granted B, and the call is labelled with what was granted.
        call = stub.Recommend(recommender_pb2.RecommendRequest(user_id="u42"),
                              metadata=(("x-slo-class", "A"),), timeout=5)  # fmt: skip
        capped = await call
        assert capped.slo_class == "B" and "slo_class_downgraded:A->B" in capped.degraded
        assert ("x-slo-class", "B") in tuple(await call.initial_metadata()), (
            "the granted class, as REST's header"
        )
        assert len(capped.items) == 10, "no count: REST's default"
        with pytest.raises(grpc.aio.AioRpcError) as too_many:
            await stub.Recommend(recommender_pb2.RecommendRequest(user_id="u42", count=101), timeout=5)
        assert too_many.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "count must be in 1..100" in (too_many.value.details() or "")
    async with httpx.AsyncClient(timeout=5) as http:
        metrics = (await http.get(f"http://127.0.0.1:{running.ports['GATEWAY_METRICS_PORT']}/metrics")).text
    labels = {
        line.split('slo_class="')[1].split('"')[0]
        for line in metrics.splitlines()
        if line.startswith("recmesh_request_duration_seconds_count{") and 'method="Recommend"' in line
    }
    assert labels == {"B", "invalid"}, f"gRPC Recommend labelled {labels}: not the granted class"


def test_bench_graph_replays_the_rankers_graph_over_the_meshs_answers(running: Running) -> None:
    """`recmesh bench graph` as a user runs it beside `recmesh up`: the ranker's graph
    built in the bench's process from the same model directory, every node answered
    while recording (nothing degraded: the feature and inference services answered
    the CLI's certificate), then the replay's CPU per Rank."""
    env = {**running.cli_env(), "RECMESH_MODEL_DIR": str(running.state / "models")}
    out = subprocess.run(
        [sys.executable, "-m", "recmesh.tools.cli.main", "bench", "graph", "--sample", "10", "--passes", "2",
         "--repeat", "2", "--json"],
        capture_output=True, text=True, check=True, env=env, timeout=120,
    )  # fmt: skip
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["users"] == 10 and figures["ranks_per_repeat"] == 20
    assert figures["degraded_when_recorded"] == [], figures
    lo, hi = figures["cpu_ms_per_rank_range"]
    assert 0 < lo <= figures["cpu_ms_per_rank"] <= hi
    # each node of the shipped graph with its own time
    assert {"user", "popular", "fuse", "features", "score"} <= set(figures["node_ms_per_rank"])
    assert all(ms >= 0 for ms in figures["node_ms_per_rank"].values())


def _process_env(running: Running, module: str) -> dict[str, str]:
    """What one child of `up` was started with (an attacker on the box as that user sees as much)."""
    for pid in child_pids(running.proc.pid):
        try:
            child = psutil.Process(pid)
            if child.cmdline()[-1:] == [module]:
                return child.environ()
        except psutil.Error:
            continue
    raise AssertionError(f"no child runs {module}")


def _scrape(port: int, name: str, labels: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    line = next((x for x in text.splitlines() if x.startswith(f"{name}{{{labels}}} ")), None)
    return float(line.split()[-1]) if line else 0.0


async def _redis_writes_refused(running: Running, cli: dict[str, str]) -> None:
    """The feature service's read-only Redis user, the CLI's (`cli`: offline keys only) and
    no user at all each fail to write a real-time feature key."""
    import redis.asyncio as aioredis
    from redis.exceptions import AuthenticationError, NoPermissionError

    redis_url = f"redis://127.0.0.1:{running.ports['RECMESH_REDIS_PORT']}/0"
    feature_env = _process_env(running, "services.feature")
    key = "{u:e2e-break-in}:s:click"
    for user, password in ((feature_env["REDIS_USERNAME"], feature_env["REDIS_PASSWORD"]),
                           (cli["REDIS_USERNAME"], cli["REDIS_PASSWORD"])):  # fmt: skip
        client = aioredis.Redis.from_url(redis_url, username=user, password=password, protocol=2)
        try:
            with pytest.raises(NoPermissionError):
                await client.zadd(key, {"forged": time.time() * 1000})
        finally:
            await client.aclose()
    assert feature_env["REDIS_USERNAME"] == "feature" and cli["REDIS_USERNAME"] == "cli"
    anonymous = aioredis.Redis.from_url(redis_url, protocol=2)
    try:
        with pytest.raises(AuthenticationError):
            await anonymous.zadd(key, {"forged": 1.0})
    finally:
        await anonymous.aclose()


async def test_break_in_attempts_fail_and_are_counted_while_the_mesh_serves(running: Running) -> None:
    """The issue's break-in list against the real processes (Kafka: the embedded
    Tansu broker cannot authenticate clients, docs/operations.md *Security*)."""
    from recmesh.pki import CertificateAuthority
    from recmesh.v1 import ranker_pb2, ranker_pb2_grpc

    tls = running.state / "tls"
    ca = (tls / "ca.crt").read_bytes()
    internal = {
        name: f"127.0.0.1:{running.ports[f'{name.upper()}_PORT']}"
        for name in ("feature", "inference", "ranker")
    }
    stranger = CertificateAuthority.create().issue("gateway")  # the gateway's name, another CA

    def creds(cert: bytes | None, key: bytes | None) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)

    async def rank(address: str, channel_creds: grpc.ChannelCredentials | None, name: str) -> grpc.StatusCode:
        override = (("grpc.ssl_target_name_override", name),)
        ch = (
            grpc.aio.insecure_channel(address)
            if channel_creds is None
            else grpc.aio.secure_channel(address, channel_creds, options=override)
        )
        try:
            await ranker_pb2_grpc.RankerServiceStub(ch).Rank(
                ranker_pb2.RankRequest(user_id="u42", count=5), metadata=(("x-slo-class", "A"),), timeout=5
            )
            return grpc.StatusCode.OK
        except grpc.aio.AioRpcError as err:
            return err.code()
        finally:
            await ch.close()

    # 1. No certificate, one from another CA, or plaintext: the handshake refuses every internal service.
    for name, address in internal.items():
        for attempt in (creds(None, None), creds(stranger.cert_pem, stranger.key_pem), None):
            assert await rank(address, attempt, name) == grpc.StatusCode.UNAVAILABLE, (name, attempt)

    # 2. Valid mesh certificates with the wrong identity ask the ranker for class A: refused and counted.
    ranker_metrics = running.ports["RANKER_METRICS_PORT"]
    labels = 'reason="peer_not_allowed",service="ranker"'
    before = _scrape(ranker_metrics, "recmesh_auth_denied_total", labels)
    for identity in ("ops", "feature"):
        own = creds((tls / f"{identity}.crt").read_bytes(), (tls / f"{identity}.key").read_bytes())
        assert await rank(internal["ranker"], own, "ranker") == grpc.StatusCode.PERMISSION_DENIED
    assert _scrape(ranker_metrics, "recmesh_auth_denied_total", labels) == before + 2
    ranker_log = (running.state / "logs" / "ranker.log").read_text()
    assert '"event":"auth_denied"' in ranker_log and "spiffe://recmesh.local/ops" in ranker_log

    # 3. Redis: the feature service's read-only user, the CLI's (offline keys only) and no user
    #    try to write a real-time feature key.
    cli = running.cli_env()
    await _redis_writes_refused(running, cli)

    # 4. Meanwhile the mesh serves, and every accepted event arrives.
    now = int(time.time() * 1000)
    events = [{"event_id": f"break-in-{i}", "user_id": "e2e-break-in", "item_id": f"i{i}",
               "behavior": "click", "event_time": now - i * 1000} for i in range(4)]  # fmt: skip
    async with httpx.AsyncClient(base_url=running.http, timeout=5) as http:
        posted = await http.post("/v1/events", json={"events": events})
        assert posted.status_code == 202 and posted.json() == {"accepted": 4}
        resp = await http.post("/v1/recommend", json={"user_id": "u42", "count": 5},
                               headers={"x-slo-class": "A", "x-api-key": DEMO_API_KEY})  # fmt: skip
        assert resp.status_code == 200 and resp.json()["degraded"] == [], resp.text

    async def arrived() -> bool:
        out = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "recmesh.tools.cli.main", "features", "get", "--user", "e2e-break-in"],
            capture_output=True, text=True, check=True, env=cli,
        )  # fmt: skip
        return bool(json.loads(out.stdout)["user"]["features"]["clicks_5m"]["value"] == 4)

    await poll_until(
        arrived, "the 4 accepted clicks, none forged, as real-time features", timeout=15, interval=0.3
    )


CONTRACT_CONFIG = Path(__file__).with_name("schemathesis.toml")


@pytest.mark.parametrize("api_key", [None, DEMO_API_KEY], ids=["anonymous", "demo-key"])
def test_openapi_contract(running: Running, api_key: str | None, tmp_path: Path) -> None:
    """schemathesis against the live gateway's /openapi.json, every route, with
    every documented header generated (x-api-key too: mostly unknown keys, so
    401s) and then again with the demo key sent on every request: no 5xx, and
    every answer's status, body, content type and headers as documented."""
    command = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(CONTRACT_CONFIG),
        "run", f"{running.http}/openapi.json", "--checks", "all", "--max-examples", "25",
        "--seed", "16", "--workers", "1", "--generation-database", "none", "--no-color",
        *(["--header", f"x-api-key: {api_key}"] if api_key else []),
    ]  # fmt: skip
    # In a scratch directory: schemathesis keeps a cache of what it found in its working directory.
    out = subprocess.run(command, check=False, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    summary = out.stdout[out.stdout.find("SUMMARY") :]
    print(f"\nschemathesis ({api_key or 'no key'}):\n{summary}")
    assert out.returncode == 0, out.stdout[-8000:] + out.stderr[-2000:]
    assert "Tested: 6" in summary, summary


def test_sigint_stops_every_child_and_frees_every_port(running: Running) -> None:
    children = child_pids(running.proc.pid)
    assert len(children) >= 7, f"expected redis, broker and 5 services, got {children}"
    running.proc.send_signal(signal.SIGINT)
    assert running.proc.wait(timeout=40) == 0, running.log.read_text()[-3000:]
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in children if _alive(p)], "orphaned children"
    busy = [name for name, port in running.ports.items() if not port_is_free("127.0.0.1", port)]
    assert not busy, f"ports still bound: {busy}"
