"""POST /v2/ai-tool/action over HTTP with random output schemas
(hypothesis strategies, tests/schema_strategies.py). The gateway runs as its
own process (`python -m services.gateway`, as `recmesh up` starts it) with no
inference service behind it, so the template filler answers every call.

Each answer is a 200 whose output validates against the schema (formats
checked) with its placeholders listed in `degraded`, or a 422 naming a keyword
of the schema: never a 5xx, never invalid output. Counts print with `pytest -s`.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from recmesh.aitools import actions
from recmesh.tools.localinfra import ManagedProcess
from tests.helpers import free_port
from tests.schema_strategies import output_schemas

EXAMPLES = int(os.environ.get("RECMESH_HTTP_PROPERTY_EXAMPLES", "200"))
CONTEXT = {"product": "recmesh Pro", "url": "https://example.org/trial"}
_KEYWORD = re.compile(r"cannot meet `([^`]+)`|\((\$?\w+)\)['\"]")


@pytest.fixture(scope="module")
def gateway_url(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens: no generative model, the template answers
    http_port = free_port()
    env = dict(
        os.environ, KAFKA_BOOTSTRAP=kafka_bootstrap, FEATURE_ADDR=dead, INFERENCE_ADDR=dead, RANKER_ADDR=dead,
        GATEWAY_HTTP_PORT=str(http_port), GATEWAY_GRPC_PORT=str(free_port()),
        GATEWAY_METRICS_PORT=str(free_port()),
    )  # fmt: skip
    log = Path(tmp_path_factory.mktemp("gateway")) / "gateway.log"
    proc = ManagedProcess("gateway", [sys.executable, "-m", "services.gateway"], log, env)
    proc.start()
    url = f"http://127.0.0.1:{http_port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.exited() is None, f"the gateway exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, (
                f"the gateway did not answer /healthz: {log.read_text()[-2000:]}"
            )
            try:
                if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield url
    finally:
        proc.stop()


def _at(output: Any, pointer: str) -> Any:
    node = output
    for part in pointer.split("/")[1:]:
        node = node[int(part)] if isinstance(node, list) else node[part.replace("~1", "/").replace("~0", "~")]
    return node


def test_random_schemas_get_valid_output_or_a_422_naming_the_keyword(gateway_url: str) -> None:
    counts: Counter[int] = Counter()
    keywords: Counter[str] = Counter()
    with httpx.Client(base_url=gateway_url, timeout=10.0) as client:

        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
        @given(output_schemas())
        def check(schema: dict[str, Any]) -> None:
            payload = {"intent": "drive_trial_conversion", "output_schema": schema, "context": CONTEXT}
            resp = client.post("/v2/ai-tool/action", json=payload)
            counts[resp.status_code] += 1
            assert resp.status_code in (200, 422), (resp.status_code, resp.text, schema)
            body = resp.json()
            if resp.status_code == 422:
                found = _KEYWORD.search(body["message"])
                assert found, body["message"]
                keyword = found.group(1) or found.group(2)
                keywords[keyword] += 1
                assert f'"{keyword}"' in json.dumps(schema), (body["message"], schema)
                return
            assert actions.violations(body["output"], schema, []) == [], (schema, body["output"])
            for note in body["degraded"]:
                assert note.startswith("placeholder:") and isinstance(_at(body["output"], note[12:]), str)

        check()
    print(f"\nPOST /v2/ai-tool/action, random schemas: {dict(counts)}; 422 by keyword: {dict(keywords)}")
    assert sum(counts.values()) >= EXAMPLES * 0.9
    assert counts[200] >= sum(counts.values()) * 0.7, counts
