"""A service's plaintext side port: Prometheus /metrics plus the probes.

With mutual TLS on the gRPC port (recmesh.security), a caller without a mesh
certificate cannot reach grpc.health there, and the kubelet's probes present
none. So the metrics port also answers `/healthz` (200 while the process
runs) and `/readyz` (200 while its gRPC server reports SERVING, else 503):
a status and nothing else, which is what Prometheus and the kubelet may see.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import make_server

from prometheus_client import REGISTRY, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

# Set while this process's gRPC server reports SERVING (recmesh.grpcserver.MeshServer).
SERVING = threading.Event()

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def probe_app(metrics: Callable[[dict[str, Any], StartResponse], Iterable[bytes]]) -> Any:
    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok\n"]
        if path == "/readyz":
            if SERVING.is_set():
                start_response("200 OK", [("Content-Type", "text/plain")])
                return [b"serving\n"]
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"not serving\n"]
        return metrics(environ, start_response)

    return app


def start_metrics_server(port: int, addr: str = "0.0.0.0") -> ThreadingWSGIServer:
    """/metrics, /healthz and /readyz on addr:port, served from a daemon thread."""
    httpd = make_server(addr, port, probe_app(make_wsgi_app(REGISTRY)), ThreadingWSGIServer,
                        handler_class=_SilentHandler)  # fmt: skip
    threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True).start()
    return httpd
