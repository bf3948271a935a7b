"""The overload and attribution rules and the dashboard panels name metrics the code really exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import REGISTRY

import recmesh.admission
import recmesh.clients.base
import recmesh.controller
import services.attribution.consumer
import services.ranker.pipeline  # registers the degradation counter

ROOT = Path(__file__).resolve().parents[3]
NAME = re.compile(r"\brecmesh_[a-z0-9_]+")


def _exported() -> set[str]:
    names = set()
    for family in REGISTRY.collect():
        names.add(family.name)
        names.update(s.name for s in family.samples)
    names |= {f"{n}_total" for n in names} | {f"{n}_count" for n in names}
    return names


def _exposed() -> set[str]:
    """The series names /metrics carries, by metric type (prometheus_client: a Counter
    `x` or `x_total` is exposed as `x_total`, whatever else its name ends in)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
                "summary": ("", "_count", "_sum"), "info": ("_info",)}  # fmt: skip
    return {f"{f.name}{s}" for f in REGISTRY.collect() for s in suffixes.get(f.type, ("",))}


def _dashboard() -> dict[str, Any]:
    path = ROOT / "deploy" / "grafana" / "provisioning" / "dashboards" / "recmesh.json"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_resilience_rules_and_panels_use_exported_metrics() -> None:
    assert recmesh.admission.SHED and recmesh.controller.REWARD and recmesh.clients.base.BREAKER_FAILURES
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    (group,) = [g for g in rules["groups"] if g["name"] == "recmesh-resilience"]
    exprs = [r["expr"] for r in group["rules"]]
    exprs += [t["expr"] for p in _dashboard()["panels"] if p["id"] >= 7 for t in p.get("targets", [])]
    used = {m for e in exprs for m in NAME.findall(e)}
    exported = _exported()
    assert used, "found no metric names"
    assert used <= exported, f"not exported by the code: {sorted(used - exported)}"


def test_online_evaluation_panels_and_attribution_alerts_read_series_attribution_exposes() -> None:
    assert services.attribution.consumer.ONLINE_AUC and services.attribution.consumer.CLOCK_BEHIND
    dashboard = _dashboard()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    (row,) = [p for p in dashboard["panels"] if p["type"] == "row" and p["title"] == "Online evaluation"]
    below = [p for p in dashboard["panels"] if p["gridPos"]["y"] > row["gridPos"]["y"]]
    exprs = [t["expr"] for p in below for t in p["targets"]]
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"] if "attribution" in r["expr"]]
    used = {m for e in exprs for m in NAME.findall(e)}
    assert {"recmesh_online_auc_answers_total", "recmesh_attribution_clock_behind_seconds"} <= used
    exposed = _exposed()
    assert used <= exposed, f"not on attribution's /metrics: {sorted(used - exposed)}"
