"""Every header, gRPC metadata key and trailer name recmesh sends or reads.

One module, so a client and the server it talks to read the same name from
the same place (servers used to import theirs from the client module). HTTP
header names are written lower-case, as gRPC metadata keys must be; HTTP
compares them case-insensitively.
"""

from __future__ import annotations

# --- from the caller, read at the gateway (REST headers and gRPC metadata) ---

# The SLO class asked for; on every hop after the gateway, the class granted
# (recmesh.slo). The gateway also answers with the granted class under it.
SLO_HEADER = "x-slo-class"
# The caller's API key, naming its entitlement (RECMESH_API_KEYS).
API_KEY_HEADER = "x-api-key"
# A trusted caller's word on its user's tier and LLM token budget.
TIER_HEADER = "x-user-tier"
TOKEN_BUDGET_HEADER = "x-llm-token-budget"
# A REST caller's own deadline in ms (gRPC callers set theirs on the call).
TIMEOUT_HEADER = "x-request-timeout-ms"
# W3C trace context: written and read by OpenTelemetry's propagator on every
# hop; the gateway echoes it on its answers.
TRACEPARENT_HEADER = "traceparent"

# --- between services (gRPC metadata) ----------------------------------------

# Request metadata: comma-separated dependencies the callee must not call, e.g.
# "inference" when the gateway presumes it scaled to zero (services/gateway/cold.py).
SKIP_HEADER = "x-recmesh-skip"
# Request metadata the feature service records with a sampled served row.
REQUEST_ID_HEADER = "x-request-id"

# --- answers (HTTP headers and gRPC trailers) ---------------------------------

# Trailing metadata of every Score answer: the degradation level the inference
# service suggests to its callers (services/inference/pressure.py).
SUGGESTED_LEVEL_KEY = "x-recmesh-suggested-level"
# When to try again after a shed request: an HTTP 429's header, and a
# RESOURCE_EXHAUSTED status's trailer (with SLO_HEADER, the class it ran in).
RETRY_AFTER_HEADER = "retry-after"
# The same in milliseconds, under the name gRPC's client retry policy obeys (gRFC A6).
RETRY_PUSHBACK_TRAILER = "grpc-retry-pushback-ms"
