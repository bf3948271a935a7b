"""The design notes' joint load test: 70% `POST /v1/recommend` in class A and
30% `POST /v2/ai-tool/summarize` in class B, every request marked synthetic.

Requests the mesh sheds (429) or degrades (a fallback named in `degraded`)
are recorded under their own names (`... [shed]`, `... [degraded]`) rather
than as failures, so a run shows which class gave way; anything else that is
not a 200 fails. `MIX_TOOL_SHARE` (default 0.3) sets the tool share; 0 gives
the recommend-only baseline of the same run.

    locust -f loadtest/mix.py --headless -u 20 -r 20 -t 20s --host http://127.0.0.1:8000
"""

from __future__ import annotations

import os
import random

from locust import FastHttpUser, between, task

API_KEY = os.environ.get("RECMESH_LOAD_API_KEY", "demo-interactive")  # may ask for class A
SYNTHETIC = {"baggage": "synthetic_request=true", "x-api-key": API_KEY}
TOOL_SHARE = float(os.environ.get("MIX_TOOL_SHARE", "0.3"))
USERS = [f"u{i}" for i in range(2000)]
TOPICS = (
    "mountain hike",
    "jazz quartet",
    "smartphone launch",
    "pasta dinner",
    "football derby",
    "mars rover",
)
TEMPLATES = (
    "The {t} drew a large crowd this week.",
    "Critics said the {t} was the best of the season.",
    "Tickets for the {t} sold out within hours.",
    "Local reporters followed the {t} from the first day.",
    "Many readers asked for more coverage of the {t}.",
    "Next month brings another {t} to the city.",
)


def tool_text(sentences: int = 16) -> str:
    """An article-sized text: the summary embeds every sentence, so each call costs real CPU."""
    return " ".join(random.choice(TEMPLATES).format(t=random.choice(TOPICS)) for _ in range(sentences))


class MixUser(FastHttpUser):  # type: ignore[misc]
    wait_time = between(0.01, 0.05)

    @task
    def one_request(self) -> None:
        if random.random() < TOOL_SHARE:
            self._summarize()
        else:
            self._recommend()

    def _recommend(self) -> None:
        with self.client.post(
            "/v1/recommend",
            json={"user_id": random.choice(USERS), "count": 10},
            headers={**SYNTHETIC, "x-slo-class": "A"},
            name="/v1/recommend [A]",
            catch_response=True,
        ) as resp:
            if resp.status_code == 429:
                resp.request_meta["name"] = "/v1/recommend [A, shed]"
                resp.success()
            elif resp.status_code != 200:
                resp.failure(f"status {resp.status_code}: {resp.text[:200]}")
            elif degraded := resp.json()["degraded"]:
                resp.request_meta["name"] = f"/v1/recommend [A, degraded: {degraded[0]}]"

    def _summarize(self) -> None:
        with self.client.post(
            "/v2/ai-tool/summarize",
            json={"text": tool_text(), "max_sentences": 2},
            headers={**SYNTHETIC, "x-slo-class": "B"},
            name="/v2/ai-tool/summarize [B]",
            catch_response=True,
        ) as resp:
            if resp.status_code == 429:
                resp.request_meta["name"] = "/v2/ai-tool/summarize [B, shed]"
                resp.success()
            elif resp.status_code != 200:
                resp.failure(f"status {resp.status_code}: {resp.text[:200]}")
            elif not resp.json()["summary"]:
                resp.failure("empty summary")
            elif degraded := resp.json()["degraded"]:
                resp.request_meta["name"] = f"/v2/ai-tool/summarize [B, degraded: {degraded[0]}]"
