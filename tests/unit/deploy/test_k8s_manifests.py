"""deploy/k8s: every overlay rendered without the kustomize binary, validated, and held to the design notes.

Core kinds are validated by kubernetes-validate (strict: unknown fields fail), custom resources by the
JSON Schemas vendored in deploy/k8s/schemas. The renderer below supports only what the kustomizations
use (resources, patches by path incl. `$patch: delete`, configMapGenerator without hash suffixes, images)
and fails on the rest.
"""

from __future__ import annotations

import copy
import functools
import importlib
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from recmesh.credentials import ACL_RULES
from recmesh.settings import AttributionSettings
from services.inference import scaling
from tests.unit.deploy.test_deploy_files import NEEDS

# Neither ships type hints; a plain import would need a mypy override. A missing package fails here.
kubernetes_validate: Any = importlib.import_module("kubernetes_validate")
jsonschema: Any = importlib.import_module("jsonschema")

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("scale-to-zero", "warm", "gpu")
KNATIVE_OVERLAYS = ("scale-to-zero", "warm")  # inference as a Knative Service; gpu: a Deployment
# The oldest Kubernetes docs/operations.md supports (gRPC probes are GA from 1.27) and a recent one.
K8S_VERSIONS = ("1.27.0", "1.33.0")
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject-keda-v1alpha1.json",
    ("serving.knative.dev/v1", "Service"): "service-serving-v1.json",
    ("kafka.strimzi.io/v1beta2", "Kafka"): "kafka-kafka-v1beta2.json",
    ("kafka.strimzi.io/v1beta2", "KafkaNodePool"): "kafkanodepool-kafka-v1beta2.json",
    ("kafka.strimzi.io/v1beta2", "KafkaTopic"): "kafkatopic-kafka-v1beta2.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-monitoring-v1.json",
    ("kafka.strimzi.io/v1beta2", "KafkaUser"): "kafkauser-kafka-v1beta2.json",
    ("cert-manager.io/v1", "Certificate"): "certificate-cert-manager-v1.json",
    ("cert-manager.io/v1", "Issuer"): "issuer-cert-manager-v1.json",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "triggerauthentication-keda-v1alpha1.json",
}
KNATIVE_ONLY = ("containerConcurrency", "timeoutSeconds", "responseStartTimeoutSeconds", "idleTimeoutSeconds")
# Where each recmesh process serves gRPC and metrics (recmesh/settings.py defaults).
GRPC_PORT = {"services.feature": 50052, "services.inference": 50053, "services.ranker": 50054}
METRICS_PORT = {
    "services.feature": 9102,
    "services.inference": 9103,
    "services.ranker": 9104,
    "services.feature.ingest": 9105,
    "services.attribution": 9106,
    "services.gateway": 9101,
}
THIRD_PARTY_IMAGES = {"redis"}
DESIGN_SCALE_TO_ZERO = {
    "autoscaling.knative.dev/min-scale": "0",
    "autoscaling.knative.dev/max-scale": "10",
    "autoscaling.knative.dev/target": "10",
    "autoscaling.knative.dev/target-utilization-percentage": "100",
    "autoscaling.knative.dev/window": "60s",
    "autoscaling.knative.dev/scale-down-delay": "5m",
}
# Knative Serving's config-autoscaler defaults: the concurrency target of a revision that sets
# neither a target nor containerConcurrency, and the share of the target the autoscaler aims for.
KNATIVE_CONCURRENCY_TARGET_DEFAULT = 100.0  # container-concurrency-target-default
KNATIVE_TARGET_UTILIZATION_PERCENT = 70.0  # container-concurrency-target-percentage
SCALE_DOWN_WINDOW_S = 300  # design notes: a 30 s scale-down window flapped, 5 minutes fixed it

Doc = dict[str, Any]


# --- a small kustomize ------------------------------------------------------------------------


def _load(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _inside(directory: Path, entry: str) -> Path:
    path = (directory / entry).resolve()
    # kustomize's default load restrictor: files must lie under the kustomization's directory.
    assert path.is_relative_to(directory.resolve()), f"{directory}: {entry} is outside the kustomization root"
    return path


def _key(doc: Doc) -> tuple[str, str, str, str]:
    meta = doc["metadata"]
    return doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta["name"]


def _merge(target: Doc, patch: Doc) -> None:
    """JSON merge patch (RFC 7386): maps merge, lists and scalars replace, null deletes."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)


def _render(directory: Path) -> list[Doc]:
    kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(kust) - {"apiVersion", "kind", "resources", "patches", "configMapGenerator", "images"}
    assert not unsupported, f"{directory}: the test's renderer does not support {unsupported}"
    docs: list[Doc] = []
    for entry in kust.get("resources", []):
        path = (directory / entry).resolve()
        docs += _render(path) if path.is_dir() else _load(_inside(directory, entry))
    for gen in kust.get("configMapGenerator", []):
        assert set(gen) <= {"name", "namespace", "files", "options"}, gen
        assert gen.get("options") == {"disableNameSuffixHash": True}, "the renderer adds no hash suffixes"
        data = {Path(f).name: _inside(directory, f).read_text() for f in gen["files"]}
        meta = {"name": gen["name"], "namespace": gen["namespace"]}
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    for patch in kust.get("patches", []):
        assert set(patch) == {"path"}, f"only strategic-merge patch files are supported: {patch}"
        for p in _load(_inside(directory, patch["path"])):
            targets = [d for d in docs if _key(d) == _key(p)]
            assert len(targets) == 1, f"patch {patch['path']} matches {len(targets)} resources"
            if p.get("$patch") == "delete":  # kustomize's strategic-merge delete directive
                docs.remove(targets[0])
            else:
                _merge(targets[0], p)
    for image in kust.get("images", []):
        for _, pod in _pod_specs(docs):
            for c in _containers(pod):
                name, _, tag = c["image"].partition(":")
                if name == image["name"]:
                    c["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"
    return docs


@functools.cache
def rendered(overlay: str) -> tuple[Doc, ...]:
    return tuple(_render(K8S / "overlays" / overlay))


def _pod_specs(docs: Any) -> Iterator[tuple[Doc, Doc]]:
    """(resource, pod spec) for every resource that makes pods."""
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "Job") or _is_knative(d):
            yield d, d["spec"]["template"]["spec"]


def _containers(pod: Doc) -> list[Doc]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def _is_knative(doc: Doc) -> bool:
    return bool(doc["apiVersion"] == "serving.knative.dev/v1" and doc["kind"] == "Service")


def _one(docs: tuple[Doc, ...], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind}/{name}"
    return found[0]


_TARGET, _UTILIZATION = (
    "autoscaling.knative.dev/target",
    "autoscaling.knative.dev/target-utilization-percentage",
)


def knative_concurrency_target(annotations: dict[str, str], container_concurrency: int) -> float:
    """In-flight requests per replica Knative's autoscaler (KPA, metric `concurrency`) aims for, as
    knative/serving resolves it (pkg/reconciler/autoscaling/resources/target.go, ResolveMetricTarget):
    the `target` annotation capped by containerConcurrency when that is > 0; without the annotation
    containerConcurrency, or container-concurrency-target-default when it is 0 (no limit); then
    times the target utilisation (`target-utilization-percentage`, else the cluster's 70 %)."""
    metric = annotations.get("autoscaling.knative.dev/metric", "concurrency")
    assert metric == "concurrency", f"{metric}: not the concurrency target"
    hard = float(container_concurrency)
    total = hard or KNATIVE_CONCURRENCY_TARGET_DEFAULT
    if (soft := annotations.get(_TARGET)) is not None:
        total = min(float(soft), hard) if hard > 0 else float(soft)
    percent = annotations.get(_UTILIZATION)
    utilization = float(percent if percent is not None else KNATIVE_TARGET_UTILIZATION_PERCENT) / 100
    return max(1.0, total * utilization)


@pytest.mark.parametrize(
    ("annotations", "container_concurrency", "target"),
    [
        ({}, 0, 70.0),  # Knative's defaults: 100 x 70 %
        ({}, 5, 3.5),  # containerConcurrency is the target when none is annotated
        ({}, 200, 140.0),  # ... even above the default
        ({_TARGET: "10"}, 5, 3.5),  # the soft target capped by the hard limit (the old manifest)
        ({_TARGET: "10"}, 0, 7.0),
        ({_TARGET: "10", _UTILIZATION: "100"}, 0, 10.0),
        ({_TARGET: "10", _UTILIZATION: "100"}, 20, 10.0),
        ({_TARGET: "1"}, 0, 1.0),  # never below one request
    ],
)
def test_knative_concurrency_target_resolves_as_knative_does(
    annotations: dict[str, str], container_concurrency: int, target: float
) -> None:
    assert knative_concurrency_target(annotations, container_concurrency) == pytest.approx(target)


def _documented_inference_target() -> float:
    """The in-flight target per replica docs/operations.md (*Scaling*) states for Knative's inference."""
    text = (ROOT / "docs" / "operations.md").read_text()
    (row,) = [line for line in text.splitlines() if line.startswith("| inference | Knative")]
    (target,) = re.findall(r"target (\d+(?:\.\d+)?)", row)
    return float(target)


def _module(container: Doc) -> str | None:
    cmd = container.get("command", [])
    return str(cmd[2]) if cmd[:2] == ["python", "-m"] and len(cmd) > 2 else None


def _env(docs: tuple[Doc, ...], container: Doc) -> dict[str, str]:
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "secretRef" in source:
            # Secrets are made by the operator (docs/operations.md), never shipped: optional only.
            assert source["secretRef"].get("optional") is True, source
            continue
        env.update(_one(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
    env.update({e["name"]: e.get("value", "") for e in container.get("env", [])})
    return env


def _services(docs: tuple[Doc, ...]) -> Iterator[tuple[Doc, Doc, str]]:
    """(resource, container, module) for every long-running recmesh process."""
    for d, pod in _pod_specs(docs):
        if d["kind"] == "Job":
            continue
        for c in pod["containers"]:
            module = _module(c)
            if module is not None:
                yield d, c, module


def _port(container: Doc, port: int | str) -> int:
    if isinstance(port, int):
        return port
    return int(next(p["containerPort"] for p in container["ports"] if p.get("name") == port))


# --- rendering and schemas --------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_one_namespace_without_duplicates(overlay: str) -> None:
    docs = rendered(overlay)
    keys = [_key(d) for d in docs]
    assert len(keys) == len(set(keys))
    assert _one(docs, "Namespace", "recmesh")
    for d in docs:
        if d["kind"] != "Namespace":
            assert d["metadata"].get("namespace") == "recmesh", _key(d)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_core_kinds_validate_against_kubernetes_schemas(overlay: str, version: str) -> None:
    docs = rendered(overlay)
    for d in docs:
        if (d["apiVersion"], d["kind"]) not in CRD_SCHEMAS:
            kubernetes_validate.validate(copy.deepcopy(d), version, strict=True)
    for d in docs:
        if _is_knative(d):
            # A Knative revision template is a PodSpec plus Knative's own fields.
            template = copy.deepcopy(d["spec"]["template"])
            for field in KNATIVE_ONLY:
                template["spec"].pop(field, None)
            meta = {"name": d["metadata"]["name"], "namespace": "recmesh"}
            pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": meta, "template": template}
            kubernetes_validate.validate(pod, version, strict=True)
        if d["kind"] == "ScaledObject":
            # KEDA hands advanced.horizontalPodAutoscalerConfig.behavior to the HPA it creates.
            spec = d["spec"]
            hpa = {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": d["metadata"]["name"]},
                "spec": {
                    "scaleTargetRef": spec["scaleTargetRef"],
                    "minReplicas": max(1, spec["minReplicaCount"]),
                    "maxReplicas": spec["maxReplicaCount"],
                    "behavior": spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"],
                },
            }
            kubernetes_validate.validate(hpa, version, strict=True)


def test_custom_resources_validate_against_vendored_schemas() -> None:
    used = set()
    for d in (d for overlay in OVERLAYS for d in rendered(overlay)):
        name = CRD_SCHEMAS.get((d["apiVersion"], d["kind"]))
        if name is None:
            continue
        used.add(name)
        schema = json.loads((K8S / "schemas" / name).read_text())
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        cls(schema).validate(d)
    assert used == set(CRD_SCHEMAS.values())
    assert {p.name for p in (K8S / "schemas").glob("*.json")} == used


def test_vendored_schemas_say_where_they_come_from() -> None:
    for path in (K8S / "schemas").glob("*.json"):
        schema = json.loads(path.read_text())
        assert "subset of the openAPIV3Schema" in schema["description"], path.name
        spec = schema["properties"]["spec"]
        # An Issuer is exactly one kind of issuer: its schema says which with oneOf.
        assert spec.get("required") or spec.get("oneOf") or path.name.startswith("prometheusrule")


def test_renderer_merges_like_a_merge_patch() -> None:
    target: Doc = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    _merge(target, {"a": {"c": [3], "e": "x"}, "d": None})
    assert target == {"a": {"b": 1, "c": [3], "e": "x"}}


# --- containers -------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_pinned_and_pods_run_as_non_root(overlay: str) -> None:
    tags = set()
    for d, pod in _pod_specs(rendered(overlay)):
        pod_ctx = pod.get("securityContext", {})
        for c in _containers(pod):
            where = f"{d['kind']}/{d['metadata']['name']}/{c['name']}"
            name, _, tag = c["image"].rpartition("/")[2].partition(":")
            assert tag and tag != "latest" and "@" not in name, f"{where}: {c['image']} is not pinned"
            wants_gpu = "nvidia.com/gpu" in c["resources"].get("limits", {})
            if name in ("recmesh", "recmesh-gpu"):
                # A container given a GPU runs the gpu variant (onnxruntime-gpu), others the cpu one.
                assert (name == "recmesh-gpu") == wants_gpu, f"{where}: {c['image']} (GPU: {wants_gpu})"
                name = "recmesh"
            ctx = c.get("securityContext", {})
            assert {**pod_ctx, **ctx}.get("runAsNonRoot") is True, where
            assert ctx.get("readOnlyRootFilesystem") is True, where
            assert ctx.get("allowPrivilegeEscalation") is False, where
            assert ctx.get("capabilities", {}).get("drop") == ["ALL"], where
            assert c["resources"].get("requests") and c["resources"].get("limits"), where
            if name == "recmesh":
                tags.add(tag)
                assert {**pod_ctx, **ctx}.get("runAsUser") == 10001, where  # USER 10001 in the Dockerfile
            else:
                assert name in THIRD_PARTY_IMAGES, f"{where}: unexpected image {c['image']}"
    assert len(tags) == 1, f"one recmesh / recmesh-gpu image tag for every container, got {tags}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_has_probes_and_drains(overlay: str) -> None:
    for d, c, module in _services(rendered(overlay)):
        where = f"{d['kind']}/{d['metadata']['name']}"
        ready, live = c["readinessProbe"], c["livenessProbe"]
        if module in GRPC_PORT and _env(rendered(overlay), c).get("RECMESH_TLS") == "off":
            assert ready["grpc"]["port"] == live["grpc"]["port"] == GRPC_PORT[module], where
        elif module in GRPC_PORT:
            # Mutual TLS on the gRPC port: the kubelet (no certificate) reads the metrics port.
            assert ready["httpGet"]["path"] == "/readyz" and live["httpGet"]["path"] == "/healthz", where
            assert (
                _port(c, ready["httpGet"]["port"])
                == _port(c, live["httpGet"]["port"])
                == METRICS_PORT[module]
            )
        elif module == "services.gateway":
            assert ready["httpGet"]["path"] == "/readyz" and live["httpGet"]["path"] == "/healthz"
            assert _port(c, ready["httpGet"]["port"]) == _port(c, live["httpGet"]["port"]) == 8000
        else:
            assert ready and live, where
        if d["kind"] == "Deployment":
            pod = d["spec"]["template"]["spec"]
            sleep = c["lifecycle"]["preStop"]["exec"]["command"]
            assert sleep[0] == "sleep" and 0 < int(sleep[1]) < pod["terminationGracePeriodSeconds"], where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_process_gets_the_environment_its_settings_need(overlay: str) -> None:
    docs = rendered(overlay)
    seen = set()
    for d, c, module in _services(docs):
        assert module in NEEDS, module
        seen.add(module)
        env = _env(docs, c)
        missing = NEEDS[module] - set(env)
        assert not missing, f"{d['metadata']['name']} lacks {missing}"
        assert env["BIND_HOST"] == "0.0.0.0"
        assert env["OTEL_SERVICE_NAME"] == f"recmesh-{d['metadata']['name']}"
        assert env["RECMESH_MODEL_DIR"] == "/opt/recmesh/models"  # baked into the image
        annotations = d["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(METRICS_PORT[module])
    assert seen == set(NEEDS)
    # The addresses name Services that exist, on the ports the processes listen on.
    env = _one(docs, "ConfigMap", "recmesh-env")["data"]
    for var, module in (("FEATURE_ADDR", "services.feature"), ("RANKER_ADDR", "services.ranker")):
        host, port = env[var].split(":")
        ports = {p["port"] for p in _one(docs, "Service", host)["spec"]["ports"]}
        assert int(port) == GRPC_PORT[module] and int(port) in ports, var
    inference = _one(docs, "Service", "inference")
    if _is_knative(inference):
        assert env["INFERENCE_ADDR"] == "inference.recmesh.svc.cluster.local:80"  # the Knative route
        assert json.loads(env["RECMESH_MAY_BE_COLD"]) == ["inference"], "scaled to zero: may be cold"
    else:
        host, port = env["INFERENCE_ADDR"].split(":")
        assert host == "inference" and int(port) == GRPC_PORT["services.inference"]
        assert int(port) in {p["port"] for p in inference["spec"]["ports"]}
        assert json.loads(env["RECMESH_MAY_BE_COLD"]) == [], "never scaled to zero"
    assert env["REDIS_URL"] == "redis+cluster://redis-cluster:6379"
    kafka = _one(docs, "Kafka", "recmesh")
    plain = next(li for li in kafka["spec"]["kafka"]["listeners"] if not li["tls"])
    assert env["KAFKA_BOOTSTRAP"] == f"recmesh-kafka-bootstrap:{plain['port']}"


def test_init_job_runs_recmesh_init_against_the_cluster() -> None:
    docs = rendered("scale-to-zero")
    pod = _one(docs, "Job", "recmesh-init")["spec"]["template"]["spec"]
    (init,) = pod["containers"]
    assert init["command"][:2] == ["recmesh", "init"]
    env = _env(docs, init)
    assert {"REDIS_URL", "KAFKA_BOOTSTRAP"} <= set(env)
    topic = _one(docs, "KafkaTopic", "user-behavior")["spec"]
    assert env["RECMESH_TOPIC_PARTITIONS"] == str(topic["partitions"])
    waits = pod["initContainers"][0]["command"][2]
    compile(waits, "wait-for-topics", "exec")
    assert "list_topics" in waits


# --- scaling ----------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grpc_and_http_services_scale_on_cpu_with_a_long_scale_down_window(overlay: str) -> None:
    docs = rendered(overlay)
    for name in ("gateway", "ranker", "feature"):
        hpa = _one(docs, "HorizontalPodAutoscaler", name)["spec"]
        assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
        assert [m["resource"]["name"] for m in hpa["metrics"]] == ["cpu"]
        assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= SCALE_DOWN_WINDOW_S
        assert 1 < hpa["minReplicas"] <= hpa["maxReplicas"]
        pdb = _one(docs, "PodDisruptionBudget", name)["spec"]
        labels = _one(docs, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        assert pdb["selector"]["matchLabels"].items() <= labels.items()
        assert pdb["minAvailable"] < hpa["minReplicas"], "a PDB must leave room to drain a node"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ingest_scales_on_consumer_lag_up_to_the_partition_count(overlay: str) -> None:
    docs = rendered(overlay)
    so = _one(docs, "ScaledObject", "feature-ingest")["spec"]
    assert so["scaleTargetRef"]["name"] == "feature-ingest"
    hpas = {d["metadata"]["name"] for d in docs if d["kind"] == "HorizontalPodAutoscaler"}
    assert "feature-ingest" not in hpas, "KEDA creates the HPA; a second one would fight it"
    (trigger,) = so["triggers"]
    env = _one(docs, "ConfigMap", "recmesh-env")["data"]
    meta = trigger["metadata"]
    assert trigger["type"] == "kafka"
    assert meta["consumerGroup"] == env["RECMESH_CONSUMER_GROUP"] == "recmesh-feature-ingest"
    assert meta["topic"] == env["RECMESH_EVENTS_TOPIC"] == "user_behavior"
    assert meta["bootstrapServers"].split(".")[0] == env["KAFKA_BOOTSTRAP"].split(":")[0]
    assert int(meta["activationLagThreshold"]) < int(meta["lagThreshold"])
    topics = {t["spec"]["topicName"]: t["spec"] for t in docs if t["kind"] == "KafkaTopic"}
    partitions = topics[meta["topic"]]["partitions"]
    assert so["minReplicaCount"] == 1
    assert so["maxReplicaCount"] <= partitions
    assert so["cooldownPeriod"] >= SCALE_DOWN_WINDOW_S
    behavior = so["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= SCALE_DOWN_WINDOW_S


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_attribution_is_one_consumer_of_both_topics_in_its_group(overlay: str) -> None:
    docs = rendered(overlay)
    deployment = _one(docs, "Deployment", "attribution")
    # Its event-time clock is shared in Redis: a second consumer could make answers final
    # before another's partitions were read (base/attribution.yaml). One replica, never two.
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    scaled = {
        d["spec"]["scaleTargetRef"]["name"]
        for d in docs
        if d["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")
    }
    assert "attribution" not in scaled
    env = _one(docs, "ConfigMap", "recmesh-env")["data"]
    defaults = AttributionSettings.model_fields
    assert env["RECMESH_ATTRIBUTION_GROUP"] == defaults["consumer_group"].default == "recmesh-attribution"
    assert env["RECMESH_IMPRESSIONS_TOPIC"] == defaults["impressions_topic"].default == "impressions"
    topics = {t["spec"]["topicName"] for t in docs if t["kind"] == "KafkaTopic"}
    assert {env["RECMESH_IMPRESSIONS_TOPIC"], env["RECMESH_EVENTS_TOPIC"]} <= topics
    user = _one(docs, "KafkaUser", "recmesh-attribution")["spec"]["authorization"]["acls"]
    assert {a["resource"]["name"] for a in user if a["resource"]["type"] == "group"} == {
        env["RECMESH_ATTRIBUTION_GROUP"]
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_attribution_sees_the_model_directory_inference_serves(overlay: str) -> None:
    """The guard (services/attribution/guard.py) reads ctr/EXPERIMENT where inference follows it
    and writes CURRENT there: the same RECMESH_MODEL_DIR, from the same source (the image, or
    the same volume mounted at it)."""
    docs = rendered(overlay)

    def model_dir(resource: Doc) -> tuple[str, Any]:
        (container,) = resource["spec"]["template"]["spec"]["containers"]
        path = _env(docs, container)["RECMESH_MODEL_DIR"]
        mounts = [m for m in container.get("volumeMounts", []) if path.startswith(m["mountPath"])]
        volumes = {v["name"]: v for v in resource["spec"]["template"]["spec"].get("volumes", [])}
        return path, [({**volumes[m["name"]], "name": ""}, m.get("subPath")) for m in mounts]

    inference = next(d for d, c, module in _services(docs) if module == "services.inference")
    assert model_dir(_one(docs, "Deployment", "attribution")) == model_dir(inference)


@pytest.mark.parametrize("overlay", KNATIVE_OVERLAYS)
def test_inference_is_a_knative_service_with_the_design_notes_autoscaling(overlay: str) -> None:
    docs = rendered(overlay)
    ksvc = _one(docs, "Service", "inference")
    assert _is_knative(ksvc)
    template = ksvc["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    expected = dict(DESIGN_SCALE_TO_ZERO)
    if overlay == "warm":
        expected["autoscaling.knative.dev/min-scale"] = "1"
    assert {k: annotations.get(k) for k in expected} == expected
    scale = {k.rpartition("/")[2]: v for k, v in annotations.items()}
    assert int(scale["min-scale"]) <= int(scale["max-scale"])
    spec = template["spec"]
    # No hard limit: the pod refuses what it cannot queue itself (base/inference.yaml).
    assert spec.get("containerConcurrency", 0) == 0
    # The target in force, as Knative resolves it, is the one the runbook states.
    in_force = knative_concurrency_target(annotations, spec.get("containerConcurrency", 0))
    assert in_force == _documented_inference_target() == 10
    (c,) = spec["containers"]
    assert c["ports"] == [{"name": "h2c", "containerPort": 50053}]
    assert c["resources"]["requests"]["nvidia.com/gpu"] == c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert spec["nodeSelector"]["recmesh.io/task"] == template["metadata"]["labels"]["recmesh.io/task"]


def test_only_the_warm_overlay_keeps_an_inference_replica() -> None:
    def min_scale(overlay: str) -> str:
        ksvc = _one(rendered(overlay), "Service", "inference")
        return str(ksvc["spec"]["template"]["metadata"]["annotations"]["autoscaling.knative.dev/min-scale"])

    assert (min_scale("scale-to-zero"), min_scale("warm")) == ("0", "1")
    base = _render(K8S / "base")
    assert [d for d in rendered("warm") if not _is_knative(d)] == [d for d in base if not _is_knative(d)]


def test_gpu_overlay_scales_inference_by_the_gpu_rule_of_the_policy() -> None:
    docs = rendered("gpu")
    assert not [d for d in docs if _is_knative(d)], "the Knative Service gives way to the Deployment"
    deployment = _one(docs, "Deployment", "inference")
    hpas = {d["metadata"]["name"] for d in docs if d["kind"] == "HorizontalPodAutoscaler"}
    assert "inference" not in hpas, "KEDA creates the HPA; a second one would fight it"
    so = _one(docs, "ScaledObject", "inference")["spec"]
    assert so["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "inference"}
    assert 1 <= so["minReplicaCount"] < so["maxReplicaCount"] == 10
    (trigger,) = so["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "Value"
    meta = trigger["metadata"]
    assert meta["threshold"] == "1" and meta["ignoreNullValues"] == "false"
    # The series the query selects are the ones the scrape job gives the inference pods.
    scrape = _one(docs, "ConfigMap", "recmesh-prometheus-scrape")["data"]["scrape-configs.yml"]
    (job,) = yaml.safe_load(scrape)
    job_label = next(r for r in job["relabel_configs"] if r.get("target_label") == "job")
    assert job_label["source_labels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_name"]
    template = deployment["spec"]["template"]
    pod_job = template["metadata"]["labels"]["app.kubernetes.io/name"]
    metrics_port = template["metadata"]["annotations"]["prometheus.io/port"]
    assert metrics_port == str(METRICS_PORT["services.inference"])
    assert meta["query"] == scaling.scale_ratio_promql(f'namespace="recmesh",job="{pod_job}"')
    # The thresholds, read back from the manifest's query, are the policy's constants.
    query = meta["query"]
    assert re.findall(r">= bool ([0-9.]+)", query) == [str(scaling.SCALE_OUT_GPU_MEMORY_RATIO)]
    assert re.findall(r"> bool ([0-9.]+)", query) == [str(scaling.SCALE_OUT_PENDING)]
    assert re.findall(r"<= bool ([0-9.]+)", query) == [
        str(scaling.SCALE_IN_GPU_MEMORY_RATIO),
        str(scaling.SCALE_IN_PENDING),
    ]
    assert set(re.findall(r"\[(\d+)s\]", query)) == {str(scaling.SCALE_IN_AFTER_S)}
    # One replica per evaluation out, one per SCALE_IN_AFTER_S in, as `scaling.replay` models it.
    behavior = so["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"] == {
        "stabilizationWindowSeconds": 0,
        "policies": [{"type": "Pods", "value": 1, "periodSeconds": so["pollingInterval"]}],
    }
    assert behavior["scaleDown"] == {
        "stabilizationWindowSeconds": 0,
        "policies": [{"type": "Pods", "value": 1, "periodSeconds": scaling.SCALE_IN_AFTER_S}],
    }
    # The HPA wants ceil(current x answer) unless the answer is within 10% of 1: the query's
    # out / in answers must move it by at least one replica at every count in range.
    tolerance = 0.1
    assert tolerance < scaling.OUT_RATIO - 1 and tolerance < 1 - scaling.IN_RATIO
    for current in range(so["minReplicaCount"], so["maxReplicaCount"] + 1):
        assert math.ceil(current * scaling.OUT_RATIO) >= current + 1
        assert current == 1 or math.ceil(current * scaling.IN_RATIO) <= current - 1
    (c,) = template["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    task = template["metadata"]["labels"]["recmesh.io/task"]
    assert template["spec"]["nodeSelector"]["recmesh.io/task"] == task


# --- state: Redis Cluster and Kafka -----------------------------------------------------------


def test_redis_cluster_is_three_masters_with_one_replica_each() -> None:
    docs = rendered("scale-to-zero")
    sts = _one(docs, "StatefulSet", "redis-cluster")
    svc = _one(docs, "Service", "redis-cluster")
    assert sts["spec"]["replicas"] == 6 and sts["spec"]["serviceName"] == "redis-cluster"
    assert svc["spec"]["clusterIP"] == "None"
    conf = _one(docs, "ConfigMap", "redis-cluster")["data"]["redis.conf"]
    assert "cluster-enabled yes" in conf
    job = _one(docs, "Job", "redis-cluster-create")["spec"]["template"]["spec"]
    script = job["containers"][0]["command"][-1]
    assert "--cluster create" in script and "--cluster-replicas 1" in script and "--cluster-yes" in script
    assert "for i in 0 1 2 3 4 5;" in script  # one entry per StatefulSet pod
    assert "cluster_state:ok" in script  # a re-run leaves a formed cluster alone


def test_kafka_is_kraft_with_the_topics() -> None:
    docs = rendered("scale-to-zero")
    kafka = _one(docs, "Kafka", "recmesh")
    annotations = kafka["metadata"]["annotations"]
    assert annotations == {"strimzi.io/node-pools": "enabled", "strimzi.io/kraft": "enabled"}
    pools = [d for d in docs if d["kind"] == "KafkaNodePool"]
    assert all(p["metadata"]["labels"]["strimzi.io/cluster"] == "recmesh" for p in pools)
    assert {r for p in pools for r in p["spec"]["roles"]} == {"controller", "broker"}
    brokers = sum(p["spec"]["replicas"] for p in pools if "broker" in p["spec"]["roles"])
    topics = {t["spec"]["topicName"]: t["spec"] for t in docs if t["kind"] == "KafkaTopic"}
    day_ms = 86_400_000
    assert topics["user_behavior"]["partitions"] == 6
    assert topics["user_behavior"]["config"]["retention.ms"] == 7 * day_ms
    assert topics["user_behavior.dlq"]["partitions"] == 1
    assert topics["user_behavior.dlq"]["config"]["retention.ms"] == 14 * day_ms
    assert topics["served_features"]["config"]["retention.ms"] == 7 * day_ms
    assert topics["impressions"]["config"]["retention.ms"] == 7 * day_ms
    for spec in topics.values():
        assert spec["config"]["min.insync.replicas"] < spec["replicas"] <= brokers


# --- Prometheus and the runbook ---------------------------------------------------------------


def _alert_rules() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    return data


def _alert_names(groups: list[dict[str, Any]]) -> set[str]:
    return {r["alert"] for g in groups for r in g["rules"] if "alert" in r}


def test_prometheus_rule_holds_the_same_rules_as_alerts_yml() -> None:
    rule = _one(rendered("scale-to-zero"), "PrometheusRule", "recmesh-alerts")
    groups = _alert_rules()["groups"]
    assert _alert_names(rule["spec"]["groups"]) == _alert_names(groups)
    assert rule["spec"]["groups"] == groups
    needed = {
        "RecommendP95OverClassABudget",  # class A p95 over 300 ms
        "FeatureFreshnessLagHigh",  # event -> feature lag over 60 s
        "RequestsShedHigh",  # 429 / RESOURCE_EXHAUSTED
        "RecommendFallbacksHigh",
        "IngestConsumerLagHigh",
        "FeatureProcessingDelayHigh",  # state drift: processing delay > 15 s for 30 s
        "FeatureStateGrowthHigh",  # state drift: growth > 25 %/min
        "RecmeshAttributionBehind",  # online figures late: attribution's clock > 15 min behind
    }
    assert needed <= _alert_names(groups)


def test_prometheus_scrapes_annotated_pods_by_kubernetes_sd() -> None:
    scrape = _one(rendered("scale-to-zero"), "ConfigMap", "recmesh-prometheus-scrape")
    (job,) = yaml.safe_load(scrape["data"]["scrape-configs.yml"])
    (sd,) = job["kubernetes_sd_configs"]
    assert sd == {"role": "pod", "namespaces": {"names": ["recmesh"]}}
    sources = {tuple(r["source_labels"]) for r in job["relabel_configs"]}
    assert ("__meta_kubernetes_pod_annotation_prometheus_io_scrape",) in sources
    assert ("__meta_kubernetes_pod_ip", "__meta_kubernetes_pod_annotation_prometheus_io_port") in sources


def test_operations_runbook_covers_deploying_and_every_alert() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    for needed in (
        "kubectl apply -k deploy/k8s/overlays/scale-to-zero",
        "kubectl apply -k deploy/k8s/overlays/warm",
        "docker build -t",
        "recmesh-init",
    ):
        assert needed in text, needed
    for alert in _alert_names(_alert_rules()["groups"]):
        assert f"`{alert}`" in text, f"docs/operations.md does not explain {alert}"


# --- security (issue #19) ---------------------------------------------------------------------

SPIFFE = "spiffe://recmesh.local/"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_grpc_service_has_its_own_certificate_or_says_plaintext(overlay: str) -> None:
    docs = rendered(overlay)
    certs = {d["spec"]["secretName"]: d["spec"] for d in docs if d["kind"] == "Certificate"}
    plaintext = json.loads(_one(docs, "ConfigMap", "recmesh-env")["data"]["RECMESH_TLS_PLAINTEXT_TARGETS"])
    for d, c, module in _services(docs):
        name = d["metadata"]["name"]
        env = _env(docs, c)
        if module in ("services.feature.ingest", "services.attribution"):
            continue  # no gRPC
        if env.get("RECMESH_TLS") == "off":
            # Only inference behind Knative, and then its callers dial it in plaintext.
            assert name == "inference" and _is_knative(d) and plaintext == ["inference"], name
            continue
        assert env["RECMESH_TLS"] == "on" and not (_is_knative(d) and name in plaintext), name
        pod = d["spec"]["template"]["spec"]
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        (volume,) = [v for v in pod["volumes"] if v["name"] in mounts and "secret" in v]
        directory = mounts[volume["name"]]
        assert {
            env[v].rpartition("/")[0] for v in ("RECMESH_TLS_CA", "RECMESH_TLS_CERT", "RECMESH_TLS_KEY")
        } == {directory}
        assert volume["secret"]["defaultMode"] & 0o007 == 0 and pod["securityContext"]["fsGroup"] == 10001
        cert = certs[volume["secret"]["secretName"]]
        assert cert["uris"] == [SPIFFE + name], "the identity the peer check reads"
        assert name in cert["dnsNames"], "what clients check the server against"
        assert {"server auth", "client auth"} <= set(cert["usages"])
        assert cert["issuerRef"]["name"] == "recmesh-ca"
    if overlay == "gpu":
        assert plaintext == []


def _allowed(docs: tuple[Doc, ...]) -> set[tuple[str, str, int]]:
    """(source, target app, port) the NetworkPolicies admit; source is an app name, a
    namespace ("ns:<name>") or "*" (anywhere)."""
    out = set()
    for d in docs:
        if d["kind"] != "NetworkPolicy":
            continue
        target = d["spec"]["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/name", "*")
        assert d["spec"]["policyTypes"] == ["Ingress"]
        for rule in d["spec"].get("ingress", []):
            sources = []
            for peer in rule.get("from", [{"*": None}]):
                if "podSelector" in peer:
                    sources.append(peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"])
                elif "namespaceSelector" in peer:
                    sources.append(
                        "ns:" + peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                    )
                else:
                    sources.append("*")
            out |= {(src, target, p["port"]) for src in sources for p in rule["ports"]}
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_allow_exactly_the_call_graph_and_scraping(overlay: str) -> None:
    docs = rendered(overlay)
    deny = _one(docs, "NetworkPolicy", "default-deny-ingress")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress"]}
    scrape = {("ns:monitoring", "ranker", 9104), ("ns:monitoring", "feature", 9102),
              ("ns:monitoring", "inference", 9103), ("ns:monitoring", "feature-ingest", 9105),
              ("ns:monitoring", "attribution", 9106), ("ns:monitoring", "gateway", 9101)}  # fmt: skip
    calls = {
        ("*", "gateway", 8000), ("*", "gateway", 50051),
        ("gateway", "ranker", 50054),
        ("ranker", "feature", 50052), ("gateway", "feature", 50052),
        ("feature", "redis-cluster", 6379), ("feature-ingest", "redis-cluster", 6379),
        ("attribution", "redis-cluster", 6379),
        ("recmesh-init", "redis-cluster", 6379), ("redis-cluster-create", "redis-cluster", 6379),
        ("redis-cluster", "redis-cluster", 6379), ("redis-cluster", "redis-cluster", 16379),
    }  # fmt: skip
    if overlay in KNATIVE_OVERLAYS:
        calls |= {
            (f"ns:{ns}", "inference", port)
            for ns in ("knative-serving", "kourier-system")
            for port in (8012, 8013)
        }
    else:
        calls |= {("ranker", "inference", 50053), ("gateway", "inference", 50053)}
    assert _allowed(docs) == calls | scrape
    # Every port a policy opens is one its pods listen on (a Knative pod's queue-proxy aside).
    for source, target, port in calls | scrape:
        workloads = [d for d, _ in _pod_specs(docs) if d["metadata"]["name"] == target]
        if not workloads or (target == "inference" and overlay in KNATIVE_OVERLAYS and port != 9103):
            continue
        (workload,) = workloads
        ports = {
            p["containerPort"]
            for c in workload["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
        }
        annotated = workload["spec"]["template"]["metadata"].get("annotations", {}).get("prometheus.io/port")
        assert port in ports or str(port) == annotated, (source, target, port)


def test_kafka_users_may_do_only_what_their_process_does() -> None:
    docs = rendered("scale-to-zero")
    kafka = _one(docs, "Kafka", "recmesh")["spec"]["kafka"]
    (listener,) = kafka["listeners"]
    assert listener["authentication"] == {"type": "scram-sha-512"} and kafka["authorization"] == {
        "type": "simple"
    }
    env = _one(docs, "ConfigMap", "recmesh-env")["data"]
    assert (
        env["KAFKA_SECURITY_PROTOCOL"] == "SASL_PLAINTEXT" and env["KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512"
    )
    users = {d["metadata"]["name"]: d for d in docs if d["kind"] == "KafkaUser"}

    def rights(user: str) -> set[tuple[str, str, str]]:
        acls = users[user]["spec"]["authorization"]["acls"]
        return {(a["resource"]["type"], a["resource"]["name"], op) for a in acls for op in a["operations"]}

    assert rights("recmesh-gateway") == {
        ("topic", "user_behavior", "Write"),
        ("topic", "user_behavior", "Describe"),
        ("topic", "impressions", "Write"),
        ("topic", "impressions", "Describe"),
    }
    assert rights("recmesh-feature-ingest") == {
        ("topic", "user_behavior", "Read"), ("topic", "user_behavior", "Describe"),
        ("group", "recmesh-feature-ingest", "Read"),
        ("topic", "user_behavior.dlq", "Write"), ("topic", "user_behavior.dlq", "Describe"),
    }  # fmt: skip
    assert rights("recmesh-attribution") == {
        ("topic", "impressions", "Read"), ("topic", "impressions", "Describe"),
        ("topic", "user_behavior", "Read"), ("topic", "user_behavior", "Describe"),
        ("group", "recmesh-attribution", "Read"),
    }  # fmt: skip
    assert rights("recmesh-feature") == {
        ("topic", "served_features", "Write"),
        ("topic", "served_features", "Describe"),
    }
    assert {op for _, _, op in rights("recmesh-init")} == {"Describe"}
    # Each process logs in as its own user, its password from Strimzi's Secret of that user.
    peers = set()
    for d, pod in _pod_specs(docs):
        for c in _containers(pod):
            entries = {e["name"]: e for e in c.get("env", [])}
            if "KAFKA_SASL_USERNAME" not in entries:
                continue
            user = entries["KAFKA_SASL_USERNAME"]["value"]
            assert users[user]["metadata"]["labels"]["app.kubernetes.io/name"] == d["metadata"]["name"]
            assert entries["KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
                "name": user,
                "key": "password",
            }
            peers.add(d["metadata"]["name"])
    assert peers == {"gateway", "feature", "feature-ingest", "attribution", "recmesh-init"}
    listed = {
        p["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
        for p in listener["networkPolicyPeers"]
        if "podSelector" in p
    }
    assert listed == peers
    so = _one(docs, "ScaledObject", "feature-ingest")["spec"]["triggers"][0]
    assert so["metadata"]["sasl"] == "scram_sha512"
    auth = _one(docs, "TriggerAuthentication", so["authenticationRef"]["name"])["spec"]["env"]
    assert {(a["parameter"], a["name"]) for a in auth} == {
        ("username", "KAFKA_SASL_USERNAME"),
        ("password", "KAFKA_SASL_PASSWORD"),
    }


def test_redis_users_and_passwords_come_from_secrets_never_the_configmap() -> None:
    docs = rendered("scale-to-zero")
    env = _one(docs, "ConfigMap", "recmesh-env")["data"]
    assert not [k for k in env if "PASSWORD" in k or "USERNAME" in k]
    users = {}
    for d, pod in _pod_specs(docs):
        for c in _containers(pod):
            entries = {e["name"]: e for e in c.get("env", [])}
            if "REDIS_USERNAME" in entries:
                ref = entries["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
                assert ref == {"name": "recmesh-redis-credentials", "key": entries["REDIS_USERNAME"]["value"]}
                users[d["metadata"]["name"]] = entries["REDIS_USERNAME"]["value"]
    assert users == {
        "feature": "feature",
        "feature-ingest": "ingest",
        "attribution": "attribution",
        "recmesh-init": "cli",
    }
    # Every user a pod logs in as has its rules (the aclfile is made from ACL_RULES).
    assert set(users.values()) <= set(ACL_RULES)
    conf = _one(docs, "ConfigMap", "redis-cluster")["data"]["redis.conf"]
    assert "aclfile /etc/redis-acl/users.acl" in conf and "masteruser replica" in conf
