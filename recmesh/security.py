"""Who may call whom inside the mesh: mutual TLS on every internal gRPC link,
and a peer check on every internal call.

Transport. With `RECMESH_TLS=on` (the default) a process serves and calls
over TLS with the certificate and key in RECMESH_TLS_CERT / RECMESH_TLS_KEY,
and trusts the CA in RECMESH_TLS_CA for both directions: a server requires
a client certificate from that CA (a caller without one, or with one from
another CA, fails the handshake, before any handler runs), and a client
checks the server's certificate against the service's name (its DNS SAN
`feature`, `inference`, `ranker`), whatever address it dialled.
`RECMESH_TLS=off` is plaintext, said as a warning at start-up. `recmesh up`
makes a throwaway CA and one certificate per identity (recmesh/pki.py); in
Kubernetes they come from cert-manager (deploy/k8s/base/tls.yaml).

Identity. A peer is who its certificate's URI SAN says,
`spiffe://<RECMESH_TLS_TRUST_DOMAIN>/<name>`. Each internal service admits
only the identities and methods of the mesh's call graph (DEFAULT_PEERS;
RECMESH_ALLOWED_PEERS overrides them): a certificate without a mesh identity
is UNAUTHENTICATED, a known identity calling what it may not PERMISSION_DENIED,
both counted in recmesh_auth_denied_total{service, reason} and logged. The
check runs before the call's class (`x-slo-class`), deadline and trace are
read, so they are believed only from an allowed peer. grpc.health and
reflection answer any peer that passed the handshake (a mesh certificate);
Kubernetes probes, which cannot present one, read /healthz and /readyz on
the plaintext metrics port (metrics_http.py).

Servers re-read their certificate files when they change (each new
handshake checks the files' mtimes), so a renewed certificate is served
without a restart; a client presents the certificate it started with until
its process restarts (docs/operations.md, *Security*).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import grpc
import structlog
from prometheus_client import Counter
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from recmesh.pki import DEFAULT_TRUST_DOMAIN, spiffe_id

_log = structlog.get_logger("recmesh.security")

ANY_METHOD = "*"
# Identities of the mesh: the four services, and `ops` for the operator's tools
# (the CLI, `recmesh up`'s readiness probes, the benchmarks).
IDENTITIES = ("gateway", "ranker", "feature", "inference", "ops")

# The call graph, per internal service: identity -> the methods it may call.
# Only the gateway calls the ranker; the ranker and (for its popular-items
# fallback) the gateway call the feature service; the ranker (scores, query
# embeddings) and the gateway's AI tools call inference. `ops` may read
# features and scores (`recmesh features get`, the benchmarks), never rank.
DEFAULT_PEERS: dict[str, dict[str, tuple[str, ...]]] = {
    "ranker": {"gateway": ("Rank",)},
    "feature": {
        "ranker": ("GetFeatures", "GetPopular", "GetRelated", "GetCategoryPopular"),
        "gateway": ("GetPopular",),
        "ops": (ANY_METHOD,),
    },
    "inference": {
        "ranker": ("Score", "Embed"),
        "gateway": ("Capabilities", "Embed", "Generate"),
        "ops": (ANY_METHOD,),
    },
}

AUTH_DENIED = Counter(
    "recmesh_auth_denied_total",
    "Internal calls refused by the peer check, by reason: no_identity (a certificate "
    "without a mesh identity: UNAUTHENTICATED), peer_not_allowed (an identity this "
    "service does not admit) and method_not_allowed (an admitted identity calling a "
    "method it may not): PERMISSION_DENIED. A caller without a certificate from the "
    "mesh CA never gets here: the TLS handshake refuses it (logged by gRPC core).",
    ("service", "reason"),
)


class TlsSettings(BaseSettings):
    model_config = SettingsConfigDict(extra="forbid", populate_by_name=True)

    mode: Literal["on", "off"] = Field("on", validation_alias="RECMESH_TLS")
    ca: Path | None = Field(None, validation_alias="RECMESH_TLS_CA")
    cert: Path | None = Field(None, validation_alias="RECMESH_TLS_CERT")
    key: Path | None = Field(None, validation_alias="RECMESH_TLS_KEY")
    trust_domain: str = Field(DEFAULT_TRUST_DOMAIN, validation_alias="RECMESH_TLS_TRUST_DOMAIN")
    # Service -> identity (a name in the trust domain, or a full URI) -> methods
    # ("*": all), replacing that service's defaults; services not named keep
    # theirs. E.g. '{"ranker": {"gateway": ["Rank"], "ops": ["Rank"]}}'.
    allowed_peers: dict[str, dict[str, list[str]]] = Field(
        default_factory=dict, validation_alias="RECMESH_ALLOWED_PEERS"
    )
    # Targets dialled in plaintext although TLS is on: a hop that runs through a
    # proxy which must read HTTP/2 (Knative's activator in front of inference).
    plaintext_targets: list[str] = Field(
        default_factory=list, validation_alias="RECMESH_TLS_PLAINTEXT_TARGETS"
    )
    # The gateway's public gRPC port: plaintext (TLS ends at the ingress, callers
    # authenticate with API keys), `tls` (the gateway's certificate) or `mtls`
    # (also a client certificate from RECMESH_PUBLIC_CLIENT_CA, else the mesh CA).
    public: Literal["off", "tls", "mtls"] = Field("off", validation_alias="RECMESH_GATEWAY_GRPC_TLS")
    public_client_ca: Path | None = Field(None, validation_alias="RECMESH_PUBLIC_CLIENT_CA")


class TlsConfigError(ValueError):
    pass


def _read(path: Path, what: str, variable: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise TlsConfigError(f"{variable}={path}: cannot read the {what}: {err.strerror}") from None


@dataclass
class _Files:
    ca: Path
    cert: Path
    key: Path

    def stamp(self) -> tuple[float, ...]:
        return tuple(os.stat(p).st_mtime_ns for p in (self.ca, self.cert, self.key))


@dataclass
class MeshTls:
    """This process's certificate and key, and the mesh CA it trusts."""

    files: _Files
    trust_domain: str
    plaintext_targets: frozenset[str] = frozenset()
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stamp: tuple[float, ...] = ()

    def _pems(self) -> tuple[bytes, bytes, bytes]:
        f = self.files
        return (_read(f.ca, "CA certificate", "RECMESH_TLS_CA"),
                _read(f.cert, "certificate", "RECMESH_TLS_CERT"),
                _read(f.key, "private key", "RECMESH_TLS_KEY"))  # fmt: skip

    def channel_credentials(self) -> grpc.ChannelCredentials:
        ca, cert, key = self._pems()
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)

    def server_credentials(self, client_ca: Path | None = None) -> grpc.ServerCredentials:
        """Credentials that demand a client certificate from the CA and pick up
        renewed files on the next handshake."""
        ca, cert, key = self._pems()
        if client_ca is not None:
            ca = _read(client_ca, "client CA certificate", "RECMESH_PUBLIC_CLIENT_CA")
        self._stamp = self.files.stamp()
        initial = grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            try:
                with self._lock:
                    stamp = self.files.stamp()
                    if stamp == self._stamp:
                        return None
                    new_ca, new_cert, new_key = self._pems()
                    self._stamp = stamp
                _log.info("tls_certificate_reloaded", cert=str(self.files.cert))
                return grpc.ssl_server_certificate_configuration(
                    [(new_key, new_cert)], root_certificates=new_ca if client_ca is None else ca
                )
            except (OSError, TlsConfigError) as err:  # half-written files: keep serving the old ones
                _log.warning("tls_certificate_reload_failed", error=str(err))
                return None

        return grpc.dynamic_ssl_server_credentials(initial, fetch, require_client_authentication=True)

    def public_credentials(
        self, mode: Literal["tls", "mtls"], client_ca: Path | None
    ) -> grpc.ServerCredentials:
        if mode == "mtls":
            return self.server_credentials(client_ca)
        _, cert, key = self._pems()
        return grpc.ssl_server_credentials([(key, cert)])


def tls_settings() -> TlsSettings:
    return TlsSettings()


@functools.cache
def process_tls() -> MeshTls | None:
    """This process's TLS, read once from the environment; None in plaintext mode."""
    s = tls_settings()
    if s.mode == "off":
        _log.warning("tls_off", detail="RECMESH_TLS=off: plaintext internal gRPC, every caller trusted")
        return None
    paths = {"RECMESH_TLS_CA": s.ca, "RECMESH_TLS_CERT": s.cert, "RECMESH_TLS_KEY": s.key}
    missing = [variable for variable, path in paths.items() if path is None]
    if missing:
        raise TlsConfigError(
            f"RECMESH_TLS is on (the default) but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set: point them at this process's "
            "certificate, key and the mesh CA (`recmesh up` makes them and writes the CLI's in "
            "<state dir>/secrets/cli.env, which the CLI reads when run where `recmesh up` runs or with "
            "its RECMESH_STATE_DIR), or set RECMESH_TLS=off for plaintext"
        )
    assert s.ca is not None and s.cert is not None and s.key is not None
    tls = MeshTls(_Files(s.ca, s.cert, s.key), s.trust_domain, frozenset(s.plaintext_targets))
    tls._pems()  # unreadable files fail at start-up, naming the variable
    return tls


def reset_process_tls() -> None:
    """Forget the cached configuration (tests that change the environment)."""
    process_tls.cache_clear()


def open_secure_channel(
    address: str, server_name: str | None, options: Sequence[tuple[str, Any]]
) -> grpc.aio.Channel:
    """A channel to `address`: TLS with this process's certificate unless it is
    off (or `server_name` is a plaintext target); the server must hold a
    certificate for `server_name` when one is given, else for the address's host."""
    tls = process_tls()
    if tls is None or (server_name is not None and server_name in tls.plaintext_targets):
        return grpc.aio.insecure_channel(address, options=options)
    opts = list(options)
    if server_name is not None:
        opts.append(("grpc.ssl_target_name_override", server_name))
    return grpc.aio.secure_channel(address, tls.channel_credentials(), options=opts)


# --- the peer check -------------------------------------------------------------------------------

Denial = tuple[grpc.StatusCode, str, str]  # code, reason (metric label), message
Authorize = Callable[[grpc.aio.ServicerContext, str], Denial | None]


@dataclass(frozen=True)
class PeerPolicy:
    """Identity URI -> methods it may call on one service."""

    service: str
    allowed: Mapping[str, frozenset[str]]

    @classmethod
    def build(cls, service: str, peers: Mapping[str, Sequence[str]], trust_domain: str) -> PeerPolicy:
        allowed = {
            (name if "://" in name else spiffe_id(name, trust_domain)): frozenset(methods)
            for name, methods in peers.items()
        }
        return cls(service, allowed)

    def check(self, peer_uris: Sequence[str], method: str) -> Denial | None:
        if not peer_uris:
            return (grpc.StatusCode.UNAUTHENTICATED, "no_identity",
                    f"{self.service}: the peer certificate carries no mesh identity (URI SAN)")  # fmt: skip
        known = [u for u in peer_uris if u in self.allowed]
        if not known:
            return (grpc.StatusCode.PERMISSION_DENIED, "peer_not_allowed",
                    f"{self.service}: {peer_uris[0]} may not call this service")  # fmt: skip
        if any(ANY_METHOD in self.allowed[u] or method in self.allowed[u] for u in known):
            return None
        return (grpc.StatusCode.PERMISSION_DENIED, "method_not_allowed",
                f"{self.service}: {known[0]} may not call {method}")  # fmt: skip

    def authorize(self, context: grpc.aio.ServicerContext, method: str) -> Denial | None:
        auth = context.auth_context()
        uris = [u.decode() for u in auth.get("peer_uri", ())]
        denial = self.check(uris, method)
        if denial is not None:
            AUTH_DENIED.labels(self.service, denial[1]).inc()
            _log.warning("auth_denied", service=self.service, method=method, reason=denial[1],
                         peer=uris[0] if uris else None, address=context.peer())  # fmt: skip
        return denial


def peer_policy(service: str, settings: TlsSettings | None = None) -> PeerPolicy:
    s = settings or tls_settings()
    peers: Mapping[str, Sequence[str]] = s.allowed_peers.get(service, DEFAULT_PEERS.get(service, {}))
    return PeerPolicy.build(service, peers, s.trust_domain)


__all__ = [
    "AUTH_DENIED",
    "DEFAULT_PEERS",
    "IDENTITIES",
    "MeshTls",
    "PeerPolicy",
    "TlsConfigError",
    "TlsSettings",
    "open_secure_channel",
    "peer_policy",
    "process_tls",
]
