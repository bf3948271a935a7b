"""Mixed synthetic traffic against the gateway.

Recommendations in SLO classes A, B and C plus event ingestion, every request
marked synthetic (W3C baggage `synthetic_request=true`) so it can be told apart
from real traffic in traces. `make load` runs it headless for a short time;
Locust exits non-zero when any request failed.
"""

from __future__ import annotations

import os
import random
import time
import uuid

from locust import FastHttpUser, between, task

API_KEY = os.environ.get("RECMESH_LOAD_API_KEY", "demo-interactive")  # the key `recmesh up` configures
SYNTHETIC = {"baggage": "synthetic_request=true", "x-api-key": API_KEY}
USERS = [f"u{i}" for i in range(2000)]
ITEMS = [f"i{i}" for i in range(3000)]


class MeshUser(FastHttpUser):  # type: ignore[misc]
    wait_time = between(0.01, 0.05)

    def _recommend(self, slo_class: str) -> None:
        with self.client.post(
            "/v1/recommend",
            json={"user_id": random.choice(USERS), "count": 10},
            headers={**SYNTHETIC, "x-slo-class": slo_class},
            name=f"/v1/recommend [{slo_class}]",
            catch_response=True,
        ) as resp:
            if resp.status_code != 200:
                resp.failure(f"status {resp.status_code}: {resp.text[:200]}")
            elif len(resp.json()["items"]) != 10:
                resp.failure("fewer than 10 items")

    @task(5)
    def recommend_a(self) -> None:
        self._recommend("A")

    @task(2)
    def recommend_b(self) -> None:
        self._recommend("B")

    @task(1)
    def recommend_c(self) -> None:
        self._recommend("C")

    @task(2)
    def events(self) -> None:
        now = int(time.time() * 1000)
        user = random.choice(USERS)
        batch = [
            {"event_id": uuid.uuid4().hex, "user_id": user, "item_id": random.choice(ITEMS),
             "behavior": random.choice(("view", "view", "view", "click")), "event_time": now}
            for _ in range(5)
        ]  # fmt: skip
        self.client.post("/v1/events", json={"events": batch}, headers=SYNTHETIC, name="/v1/events")
