"""The HTTP semantic-convention opt-in: the stable HTTP attribute names on every instrumented route."""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Any

SEMCONV_OPT_IN = "OTEL_SEMCONV_STABILITY_OPT_IN"
HTTP_SEMCONV_MODES = ("http", "http/dup")


def semconv_opt_in(value: str | None) -> str:
    """The OTEL_SEMCONV_STABILITY_OPT_IN a recmesh process runs with: `value`
    (comma-separated) with `http` added, unless it already names an HTTP mode
    (`http`, or `http/dup` for the old and the stable names side by side)."""
    opted = [part.strip() for part in (value or "").split(",") if part.strip()]
    if value and any(part in HTTP_SEMCONV_MODES for part in opted):
        return value
    return ",".join([*opted, "http"])


def opt_in_stable_http(env: MutableMapping[str, str] = os.environ) -> None:
    """Ask the OpenTelemetry instrumentations for the stable HTTP conventions
    (`http.request.method`, `http.response.status_code`, `url.scheme`, and
    `server.address`/`server.port` on the Redis client spans), keeping a
    user's own choice. Must run before an instrumentation initialises its
    stability mode (once per process, from the environment: FastAPIInstrumentor
    .instrument_app, RedisInstrumentor.instrument)."""
    env[SEMCONV_OPT_IN] = semconv_opt_in(env.get(SEMCONV_OPT_IN))


def http_semconv_mode() -> Any:
    """The HTTP stability mode the instrumentations of this process use
    (opentelemetry.instrumentation._semconv._StabilityMode): the gateway's
    hand-written SERVER span follows it, so every route speaks one vocabulary."""
    from opentelemetry.instrumentation._semconv import (
        _OpenTelemetrySemanticConventionStability as Stability,
    )
    from opentelemetry.instrumentation._semconv import _OpenTelemetryStabilitySignalType as Signal

    opt_in_stable_http()
    Stability._initialize()  # type: ignore[no-untyped-call]
    return Stability._get_opentelemetry_stability_opt_in_mode(Signal.HTTP)
