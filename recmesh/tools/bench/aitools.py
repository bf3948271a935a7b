"""`recmesh bench ai-tools --url URL`: sequential latency of the AI-tool
endpoints against a running mesh, beside /v1/recommend class A measured in the
same run as the baseline. One request at a time: this is per-call latency, not
capacity (loadtest/mix.py measures the mix under load)."""

from __future__ import annotations

import argparse
import time
from typing import Any

import httpx

from recmesh.metadata import API_KEY_HEADER, SLO_HEADER
from recmesh.stats import percentile
from recmesh.tools.bench.common import emit
from recmesh.tools.up import DEMO_API_KEY

KEY = {API_KEY_HEADER: DEMO_API_KEY}
SHORT = (
    "The summit trail opened last spring. Hikers reach it in four hours. A hut serves soup. Parking is easy."
)
LONG = " ".join(
    f"Sentence {i} tells readers about the {t} and what happened next."
    for i, t in enumerate(["mountain hike", "jazz quartet", "smartphone launch", "pasta dinner"] * 4)
)
ACTION: dict[str, Any] = {
    "intent": "drive_trial_conversion",
    "constraints": ["must_include_cta", "avoid_price_mention"],
    "output_schema": {
        "type": "object",
        "properties": {
            "cta": {
                "type": "object",
                "properties": {"text": {"type": "string"}, "url": {"type": "string", "format": "uri"}},
                "required": ["text", "url"],
            }
        },
        "required": ["cta"],
    },
    "context": {"product": "recmesh Pro", "url": "https://example.com/trial"},
}


def _measure(
    client: httpx.Client, path: str, body: dict[str, Any], headers: dict[str, str], n: int
) -> dict[str, Any]:
    samples, backends, errors = [], set(), 0
    for _ in range(n):
        t0 = time.perf_counter()
        resp = client.post(path, json=body, headers=headers)
        samples.append(time.perf_counter() - t0)
        if resp.status_code != 200:
            errors += 1
        else:
            backends.add(str(resp.json().get("backend", resp.json().get("model_version", ""))))
    return {
        "p50_ms": round(percentile(samples, 50) * 1000, 1),
        "p99_ms": round(percentile(samples, 99) * 1000, 1),
        "errors": errors,
        "backend": sorted(backends),
    }


def main(args: argparse.Namespace) -> int:
    cases: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {
        "recommend_A (baseline)": (
            "/v1/recommend",
            {"user_id": "u42", "count": 10},
            {**KEY, SLO_HEADER: "A"},
        ),
        "summarize_4_sentences": ("/v2/ai-tool/summarize", {"text": SHORT, "max_sentences": 2}, KEY),
        "summarize_16_sentences": ("/v2/ai-tool/summarize", {"text": LONG, "max_sentences": 3}, KEY),
        "action_cta": ("/v2/ai-tool/action", ACTION, KEY),
    }
    figures: dict[str, Any] = {}
    with httpx.Client(base_url=args.url, timeout=10.0) as client:
        for name, (path, body, headers) in cases.items():
            _measure(client, path, body, headers, 3)  # warm-up
            figures[name] = _measure(client, path, body, headers, args.n)
    rows = [f"{'endpoint':<26} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}  backend"]
    rows += [f"{k:<26} {v['p50_ms']:>8} {v['p99_ms']:>8} {v['errors']:>6}  {','.join(v['backend'])}"
             for k, v in figures.items()]  # fmt: skip
    emit(figures, args.json, "\n".join(rows))
    return 0
