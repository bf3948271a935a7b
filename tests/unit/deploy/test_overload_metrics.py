"""The overload rules and dashboard panels name metrics the code really exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import REGISTRY

import recmesh.admission
import recmesh.clients.base
import recmesh.controller
import services.ranker.pipeline  # noqa: F401 (registers the degradation counter)

ROOT = Path(__file__).resolve().parents[3]
NAME = re.compile(r"\brecmesh_[a-z0-9_]+")


def _exported() -> set[str]:
    names = set()
    for family in REGISTRY.collect():
        names.add(family.name)
        names.update(s.name for s in family.samples)
    names |= {f"{n}_total" for n in names} | {f"{n}_count" for n in names}
    return names


def test_resilience_rules_and_panels_use_exported_metrics() -> None:
    assert recmesh.admission.SHED and recmesh.controller.REWARD and recmesh.clients.base.BREAKER_FAILURES
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    (group,) = [g for g in rules["groups"] if g["name"] == "recmesh-resilience"]
    exprs = [r["expr"] for r in group["rules"]]
    dashboard = json.loads(
        (ROOT / "deploy" / "grafana" / "provisioning" / "dashboards" / "recmesh.json").read_text()
    )
    exprs += [t["expr"] for p in dashboard["panels"] if p["id"] >= 7 for t in p["targets"]]
    used = {m for e in exprs for m in NAME.findall(e)}
    exported = _exported()
    assert used, "found no metric names"
    assert used <= exported, f"not exported by the code: {sorted(used - exported)}"
