"""Mutual TLS and the peer check on a real feature service (real gRPC socket,
real Redis), with callers holding the certificates the mesh hands out, none,
or ones from another CA. tests/e2e/test_up.py tries the same on the
processes `recmesh up` starts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from recmesh.features.repository import FeatureSet
from recmesh.grpcserver import MeshServer
from recmesh.pki import CertificateAuthority, IdentityFiles, Issued, write_local_pki
from recmesh.redis_client import connect
from recmesh.security import IDENTITIES, reset_process_tls
from recmesh.settings import FeatureSettings
from recmesh.v1 import features_pb2, features_pb2_grpc
from services.feature.server import build_server
from services.feature.store import FeatureStore
from tests.helpers import free_port


@dataclass
class Secured:
    server: MeshServer
    pki: dict[str, IdentityFiles]
    directory: Path


def _files(f: IdentityFiles) -> Issued:
    return Issued(f.cert.read_bytes(), f.key.read_bytes())


def channel(address: str, ca: bytes, issued: Issued | None, name: str = "feature") -> grpc.aio.Channel:
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=issued.key_pem if issued else None,
        certificate_chain=issued.cert_pem if issued else None,
    )
    return grpc.aio.secure_channel(address, creds, options=(("grpc.ssl_target_name_override", name),))


REASONS = ("method_not_allowed", "peer_not_allowed", "no_identity")


def denied(service: str, reason: str) -> float:
    return (
        REGISTRY.get_sample_value("recmesh_auth_denied_total", {"service": service, "reason": reason}) or 0.0
    )


def handled(method: str, slo_class: str) -> float:
    return sum(
        REGISTRY.get_sample_value(
            "recmesh_request_duration_seconds_count",
            {"service": "feature", "method": method, "slo_class": slo_class, "code": code},
        )
        or 0.0
        for code in ("OK", "PERMISSION_DENIED", "UNAUTHENTICATED", "INTERNAL")
    )


@pytest.fixture
async def secured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str, demo_feature_set: FeatureSet
) -> AsyncIterator[Secured]:
    pki = write_local_pki(tmp_path / "tls", IDENTITIES)
    monkeypatch.setenv("RECMESH_TLS", "on")
    for variable, value in pki["feature"].env().items():
        monkeypatch.setenv(variable, value)
    reset_process_tls()
    redis = connect(redis_url, 4)
    server = build_server(
        FeatureSettings(feature_port=free_port(), redis_url=redis_url), FeatureStore(redis, demo_feature_set)
    )
    await server.start()
    await server.set_serving()
    try:
        yield Secured(server, pki, tmp_path)
    finally:
        await server.stop(0)
        await redis.aclose()
        monkeypatch.undo()
        reset_process_tls()


async def _popular(ch: grpc.aio.Channel, slo_class: str = "B") -> features_pb2.GetPopularResponse:
    try:
        stub = features_pb2_grpc.FeatureServiceStub(ch)
        resp: features_pb2.GetPopularResponse = await stub.GetPopular(
            features_pb2.GetPopularRequest(limit=3), timeout=5, metadata=(("x-slo-class", slo_class),)
        )
        return resp
    finally:
        await ch.close()


async def test_only_the_call_graph_gets_in(secured: Secured) -> None:
    pki, address = secured.pki, secured.server.address
    ca = pki["feature"].ca.read_bytes()
    assert secured.server.tls

    # The ranker and the gateway call GetPopular: they get in.
    for caller in ("ranker", "gateway"):
        await _popular(channel(address, ca, _files(pki[caller])))

    # The gateway may not read a user's features; inference may not call the feature service at all.
    before = {r: denied("feature", r) for r in REASONS}
    class_a_before = handled("GetFeatures", "A") + handled("GetPopular", "A")
    gw = channel(address, ca, _files(pki["gateway"]))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await features_pb2_grpc.FeatureServiceStub(gw).GetFeatures(
            features_pb2.GetFeaturesRequest(user_id="u1"), timeout=5, metadata=(("x-slo-class", "A"),)
        )
    await gw.close()
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "spiffe://recmesh.local/gateway may not call GetFeatures" in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _popular(channel(address, ca, _files(pki["inference"])), "A")
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED

    # A certificate from the mesh CA without a mesh identity: not authenticated.
    ca_key_holder = CertificateAuthority.create()  # a CA whose key we hold, trusted below as the mesh's
    trusted_dir = secured.directory / "tls"
    (trusted_dir / "ca.crt").write_bytes(
        ca + ca_key_holder.cert_pem
    )  # the server reloads on the next handshake
    anonymous = ca_key_holder.issue("nobody", with_identity=False)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _popular(channel(address, ca, anonymous), "A")
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED

    assert denied("feature", "method_not_allowed") == before["method_not_allowed"] + 1
    assert denied("feature", "peer_not_allowed") == before["peer_not_allowed"] + 1
    assert denied("feature", "no_identity") == before["no_identity"] + 1
    # Refused before the class was read: no class-A call was handled.
    assert handled("GetFeatures", "A") + handled("GetPopular", "A") == class_a_before


async def test_no_certificate_or_another_ca_fails_the_handshake(secured: Secured) -> None:
    pki, address = secured.pki, secured.server.address
    ca = pki["feature"].ca.read_bytes()
    total_before = sum(
        denied("feature", r) for r in ("method_not_allowed", "peer_not_allowed", "no_identity")
    )
    stranger = CertificateAuthority.create().issue("ranker")  # the right name, the wrong CA
    for attempt in (
        channel(address, ca, None),
        channel(address, ca, stranger),
        grpc.aio.insecure_channel(address),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _popular(attempt, "A")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    # Refused by TLS: no handler ran, nothing for the peer check to count.
    assert sum(denied("feature", r) for r in REASONS) == total_before
    # A client that does not trust the mesh CA refuses the server as well.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _popular(channel(address, CertificateAuthority.create().cert_pem, _files(pki["ranker"])))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    # And one that expects another service's certificate (name check) refuses it too.
    with pytest.raises(grpc.aio.AioRpcError):
        await _popular(channel(address, ca, _files(pki["ranker"]), name="ranker"))


async def test_health_answers_any_mesh_peer_and_renewed_files_are_served(secured: Secured) -> None:
    pki, address = secured.pki, secured.server.address
    ca = pki["feature"].ca.read_bytes()
    ops = channel(address, ca, _files(pki["ops"]))
    resp = await health_pb2_grpc.HealthStub(ops).Check(health_pb2.HealthCheckRequest(), timeout=5)
    await ops.close()
    assert resp.status == health_pb2.HealthCheckResponse.SERVING

    # Rotate everything (a new CA, new certificates) while the server runs: a new
    # connection with the new files gets in, one with the old CA's is refused.
    old_ranker = _files(pki["ranker"])
    await _popular(channel(address, ca, old_ranker))
    renewed = write_local_pki(secured.directory / "tls", IDENTITIES)
    await _popular(channel(address, renewed["ranker"].ca.read_bytes(), _files(renewed["ranker"])))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _popular(channel(address, ca, old_ranker))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
