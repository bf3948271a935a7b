"""docker-compose.yml and the Prometheus config, checked without a Docker engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]

# What each recmesh process needs from its environment to find its peers.
NEEDS = {
    "services.feature": {"REDIS_URL"},
    "services.feature.ingest": {"REDIS_URL", "KAFKA_BOOTSTRAP"},
    "services.inference": set(),
    "services.ranker": {"FEATURE_ADDR", "INFERENCE_ADDR"},
    "services.gateway": {"RANKER_ADDR", "FEATURE_ADDR", "INFERENCE_ADDR", "KAFKA_BOOTSTRAP"},
}


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def test_every_service_has_an_image_and_a_healthcheck() -> None:
    for name, svc in compose()["services"].items():
        assert "image" in svc or "build" in svc, name
        hc = svc.get("healthcheck", {})
        assert hc.get("test") or (hc.get("disable") and name == "init"), f"{name} has no healthcheck"


def test_full_stack_is_there() -> None:
    services = compose()["services"]
    for needed in ("kafka", "redis", "jaeger", "prometheus", "grafana", "feature", "feature-ingest",
                   "inference", "ranker", "gateway"):  # fmt: skip
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
        for dep, cond in svc.get("depends_on", {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            assert cond["condition"] in ("service_healthy", "service_completed_successfully")
    assert seen == set(NEEDS)


def test_prometheus_scrapes_every_recmesh_process() -> None:
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {"gateway:8000", "feature:9102", "inference:9103", "ranker:9104", "feature-ingest:9105"}
    services = compose()["services"]
    assert {t.split(":")[0] for t in targets} <= set(services)
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert {"RecommendP99OverClassABudget", "FeatureFreshnessLagHigh"} <= alerts


def test_dockerfile_is_multistage_pinned_and_non_root() -> None:
    text = (ROOT / "Dockerfile").read_text()
    froms = [line.split()[1] for line in text.splitlines() if line.startswith("FROM ")]
    assert len(froms) >= 2 and all(":" in f and not f.endswith(":latest") for f in froms)
    assert "USER 10001" in text and "--require-hashes" in text


def test_locustfile_marks_traffic_synthetic() -> None:
    text = (ROOT / "loadtest" / "locustfile.py").read_text()
    assert "synthetic_request=true" in text and "x-slo-class" in text
