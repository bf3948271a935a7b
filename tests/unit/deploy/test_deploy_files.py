"""docker-compose.yml and the Prometheus config, checked without a Docker engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]

# What each recmesh process needs from its environment to find its peers, and to prove who it
# is to them: its certificate (gRPC), its Redis ACL user, its Kafka SASL user (issue #19).
# Every process serves the feature repository RECMESH_REPOSITORY names (an image has no default).
TLS = {"RECMESH_TLS_CA", "RECMESH_TLS_CERT", "RECMESH_TLS_KEY"}
REDIS_USER = {"REDIS_USERNAME"}  # and REDIS_PASSWORD or REDIS_PASSWORD_FILE
KAFKA_USER = {"KAFKA_SECURITY_PROTOCOL", "KAFKA_SASL_USERNAME"}  # and KAFKA_SASL_PASSWORD[_FILE]
NEEDS = {
    "services.feature": {"REDIS_URL", "RECMESH_REPOSITORY"} | TLS | REDIS_USER | KAFKA_USER,
    "services.feature.ingest": {"REDIS_URL", "KAFKA_BOOTSTRAP", "RECMESH_REPOSITORY"}
    | REDIS_USER
    | KAFKA_USER,
    "services.attribution": {"REDIS_URL", "KAFKA_BOOTSTRAP", "RECMESH_REPOSITORY"} | REDIS_USER | KAFKA_USER,
    "services.inference": {"RECMESH_REPOSITORY"} | TLS,
    "services.ranker": {"FEATURE_ADDR", "INFERENCE_ADDR", "RECMESH_REPOSITORY"} | TLS,
    "services.gateway": {
        "RANKER_ADDR",
        "FEATURE_ADDR",
        "INFERENCE_ADDR",
        "KAFKA_BOOTSTRAP",
        "RECMESH_REPOSITORY",
    }
    | TLS
    | KAFKA_USER,
}
PASSWORDS = ({"REDIS_PASSWORD", "REDIS_PASSWORD_FILE"}, {"KAFKA_SASL_PASSWORD", "KAFKA_SASL_PASSWORD_FILE"})


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def test_every_service_has_an_image_and_a_healthcheck() -> None:
    for name, svc in compose()["services"].items():
        assert "image" in svc or "build" in svc, name
        hc = svc.get("healthcheck", {})
        assert hc.get("test") or (hc.get("disable") and name in ("init", "credentials")), (
            f"{name}: no healthcheck"
        )


def test_full_stack_is_there() -> None:
    services = compose()["services"]
    for needed in ("kafka", "redis", "jaeger", "prometheus", "grafana", "feature", "feature-ingest",
                   "attribution", "inference", "ranker", "gateway"):  # fmt: skip
        assert needed in services
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"


def test_recmesh_services_get_the_environment_their_settings_need() -> None:
    services = compose()["services"]
    seen = set()
    for name, svc in services.items():
        cmd = svc.get("command", [])
        module = cmd[2] if cmd[:2] == ["python", "-m"] else None
        if module not in NEEDS:
            continue
        seen.add(module)
        env = svc["environment"]
        missing = NEEDS[module] - set(env)
        assert not missing, f"{name} lacks {missing}"
        assert env["BIND_HOST"] == "0.0.0.0", name
        assert env.get("OTEL_SERVICE_NAME", "").startswith("recmesh-"), name
        for user, passwords in zip((REDIS_USER, KAFKA_USER), PASSWORDS, strict=True):
            if user & NEEDS[module]:
                assert passwords & set(env), f"{name}: a user without a password"
        for dep, cond in svc.get("depends_on", {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            assert cond["condition"] in ("service_healthy", "service_completed_successfully")
    assert seen == set(NEEDS)


def test_each_container_mounts_only_its_own_credentials() -> None:
    services = compose()["services"]
    assert services["credentials"]["command"][-2:] == ["recmesh.localsecrets", "/credentials"]
    subpaths = {}
    for name, svc in services.items():
        for volume in svc.get("volumes", []):
            if isinstance(volume, dict) and volume.get("source") == "credentials":
                assert volume["read_only"] is True, name
                subpaths[name] = volume["volume"]["subpath"]
    recmesh = {n for n, s in services.items() if s.get("image") == services["credentials"]["image"]}
    assert {n: subpaths[n] for n in recmesh - {"credentials"}} == {n: n for n in recmesh - {"credentials"}}
    assert subpaths["redis"] == "redis" and subpaths["kafka"] == "kafka"
    assert "--aclfile" in services["redis"]["command"]
    kafka = services["kafka"]["environment"]
    assert kafka["KAFKA_SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-512"
    assert kafka["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    # The only listener other containers reach authenticates; the others are bound to localhost.
    listeners = dict(li.split("://") for li in kafka["KAFKA_LISTENERS"].split(","))
    assert listeners["SASL_PLAINTEXT"] == ":9092"
    assert all(v.startswith("localhost:") for k, v in listeners.items() if k != "SASL_PLAINTEXT")
    script = (ROOT / "deploy" / "compose" / "kafka-sasl.sh").read_text()
    assert "allow gateway --operation Write --operation Describe --topic user_behavior\n" in script
    assert "allow ingest --operation Write --operation Describe --topic user_behavior.dlq" in script
    # Attribution reads both topics in its own group; the gateway writes the impressions it reads.
    assert "allow gateway --operation Write --operation Describe --topic impressions\n" in script
    for topic in ("impressions", "user_behavior"):
        assert f"allow attribution --operation Read --operation Describe --topic {topic}\n" in script
    assert "allow attribution --operation Read --group recmesh-attribution\n" in script
    assert "for user in gateway feature ingest attribution cli; do" in script
    attribution = services["attribution"]["environment"]
    assert attribution["REDIS_USERNAME"] == attribution["KAFKA_SASL_USERNAME"] == "attribution"


def test_prometheus_scrapes_every_recmesh_process() -> None:
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {"gateway:9101", "feature:9102", "inference:9103", "ranker:9104", "feature-ingest:9105",
                       "attribution:9106"}  # fmt: skip
    services = compose()["services"]
    assert {t.split(":")[0] for t in targets} <= set(services)
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert {"RecommendP99OverClassABudget", "FeatureFreshnessLagHigh", "RecmeshAttributionBehind"} <= alerts


def dockerfile_stages() -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(base, stage name, [(instruction, arguments)]) per stage, continuation lines joined."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    stages: list[tuple[str, str, list[tuple[str, str]]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        if instruction == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else ""
            stages.append((words[0], name, []))
        else:
            stages[-1][2].append((instruction, args))
    return stages


def test_dockerfile_is_multistage_pinned_and_non_root() -> None:
    stages = dockerfile_stages()
    names = {name for _, name, _ in stages}
    external = [base for base, _, _ in stages if base not in names and base != "scratch"]
    assert len(stages) >= 2 and external
    for base in external:
        _, _, tag = base.partition(":")
        pinned_by_digest = "@sha256:" in base
        assert pinned_by_digest or (tag and tag != "latest" and tag[0].isdigit() and tag.count(".") >= 2), (
            f"{base}: pin the base image by digest or an exact version tag"
        )
    base, _, final = stages[-1]
    assert base in external, "the runtime stage starts from a clean base, not from the build stage"
    assert ("USER", "10001") in final, "the runtime stage runs as the non-root uid the manifests use"
    assert any(i == "RUN" and "useradd --uid 10001" in a for i, a in final)


def test_nothing_is_fetched_at_run_time() -> None:
    *_, (_, _, final) = dockerfile_stages()
    fetchers = ("pip install", "apt-get", "curl", "wget", "git clone", "huggingface-cli")
    for instruction, args in final:
        if instruction in ("RUN", "CMD", "ENTRYPOINT"):
            assert not any(f in args for f in fetchers), f"{instruction} {args} fetches in the runtime image"
    env = " ".join(a for i, a in final if i == "ENV")
    assert "RECMESH_MODEL_DIR=/opt/recmesh/models" in env
    assert "HF_HUB_OFFLINE=1" in env and "TRANSFORMERS_OFFLINE=1" in env
    copies = [a for i, a in final if i == "COPY"]
    # The model directory (model, card, item vectors, embedding weights) comes baked in from the
    # `models` stage, which `--build-context models=DIR` can replace with a model made elsewhere.
    assert any(a.startswith("--from=models") and a.endswith("/opt/recmesh/models") for a in copies)
    assert all(a.startswith("--from=") for a in copies), "the runtime stage copies only from build stages"
    stages = {name: body for _, name, body in dockerfile_stages()}
    baked = " ".join(a for i, a in stages["trained"] if i == "RUN")
    for step in ("recmesh train", "recmesh embed export", "recmesh embed items"):  # model, encoder, vectors
        assert f"{step} --model-dir /opt/recmesh/models" in baked, step


def test_dependencies_come_from_hash_pinned_locks_per_variant() -> None:
    stages = {name: body for _, name, body in dockerfile_stages()}
    install = next(a for i, a in stages["build"] if i == "RUN" and "--require-hashes" in a)
    assert "cpu) lock=requirements-runtime.lock" in install and "gpu) lock=requirements-gpu.lock" in install
    assert ("ARG", "VARIANT=cpu") in stages["build"]

    def pins(lock: str) -> set[str]:
        lines = (ROOT / lock).read_text().splitlines()
        return {line.split("==")[0] for line in lines if "==" in line and not line.startswith(" ")}

    cpu, gpu = pins("requirements-runtime.lock"), pins("requirements-gpu.lock")
    assert "onnxruntime" in cpu and "onnxruntime-gpu" not in cpu
    # Both packages install the module `onnxruntime`; the GPU lock must carry only the GPU one.
    assert "onnxruntime-gpu" in gpu and "onnxruntime" not in gpu and "nvidia-ml-py" in gpu
    assert {p for p in gpu if p.startswith("nvidia-cudnn")}, "CUDA libraries come from pip, not the base"
    stale = cpu - {"onnxruntime"} - gpu
    assert not stale, f"requirements-gpu.lock lacks {sorted(stale)}: run `make lock`"


def test_make_images_builds_both_variants_and_says_when_no_engine() -> None:
    makefile = (ROOT / "Makefile").read_text()
    target = makefile[makefile.index("\nimages:") :].split("\n\n")[0]
    assert "docker info" in target and "no Docker engine" in target and "no docker CLI" in target
    assert "--build-arg VARIANT=cpu --build-arg DEMO=$(DEMO) -t $(IMAGE):$(VERSION) " in target
    assert "--build-arg VARIANT=gpu --build-arg DEMO=$(DEMO) -t $(IMAGE)-gpu:$(VERSION) " in target


def test_the_image_holds_no_demo_model_unless_built_with_the_demo_flag() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    trained = dockerfile[dockerfile.index("AS trained") :].split("\nFROM ")[0]
    run = trained[trained.index("RUN ") :]
    guarded = run[run.index('if [ "$DEMO" = "true" ]') :]
    assert "recmesh train" in guarded and "recmesh train" not in run[: run.index("if [")]
    makefile = (ROOT / "Makefile").read_text()
    assert "DEMO    ?= false" in makefile


def test_locustfile_marks_traffic_synthetic() -> None:
    text = (ROOT / "loadtest" / "locustfile.py").read_text()
    assert "synthetic_request=true" in text and "x-slo-class" in text
