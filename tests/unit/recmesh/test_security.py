"""The peer policy, the TLS and store-credential settings (pure logic)."""

from __future__ import annotations

import fnmatch
import hashlib
from pathlib import Path

import grpc
import pytest

from recmesh.credentials import ACL_RULES, KafkaAuth, RedisAuth, aclfile
from recmesh.features import keys
from recmesh.security import DEFAULT_PEERS, PeerPolicy, TlsConfigError, TlsSettings, peer_policy, process_tls


def uri(name: str) -> str:
    return f"spiffe://recmesh.local/{name}"


def test_the_ranker_admits_only_the_gateway_and_only_rank() -> None:
    policy = peer_policy("ranker", TlsSettings())
    assert policy.check([uri("gateway")], "Rank") is None
    for caller in ("ops", "feature", "inference", "ranker"):
        denial = policy.check([uri(caller)], "Rank")
        assert denial is not None and denial[:2] == (grpc.StatusCode.PERMISSION_DENIED, "peer_not_allowed")
    denial = policy.check([], "Rank")
    assert denial is not None and denial[:2] == (grpc.StatusCode.UNAUTHENTICATED, "no_identity")
    # The same name in another trust domain is another identity.
    assert policy.check(["spiffe://elsewhere/gateway"], "Rank") is not None


def test_each_service_admits_its_call_graph() -> None:
    feature = peer_policy("feature", TlsSettings())
    assert feature.check([uri("gateway")], "GetPopular") is None
    denial = feature.check([uri("gateway")], "GetFeatures")
    assert denial is not None and denial[1] == "method_not_allowed"
    assert all(feature.check([uri("ranker")], m) is None for m in DEFAULT_PEERS["feature"]["ranker"])
    assert feature.check([uri("ops")], "GetFeatures") is None
    inference = peer_policy("inference", TlsSettings())
    assert inference.check([uri("ranker")], "Score") is None
    assert inference.check([uri("gateway")], "Generate") is None
    denial = inference.check([uri("gateway")], "Score")
    assert denial is not None and denial[1] == "method_not_allowed"


def test_allowed_peers_override_by_name_or_uri() -> None:
    settings = TlsSettings(
        allowed_peers={"ranker": {"gateway": ["Rank"], "spiffe://ops.example/bench": ["*"]}},
        trust_domain="prod.example",
    )
    policy = peer_policy("ranker", settings)
    assert policy.check(["spiffe://prod.example/gateway"], "Rank") is None
    assert policy.check([uri("gateway")], "Rank") is not None
    assert policy.check(["spiffe://ops.example/bench"], "Anything") is None
    assert PeerPolicy.build("x", {}, "d").check([uri("gateway")], "M") is not None
    # A service the override does not name keeps its call graph.
    assert peer_policy("feature", settings).check(["spiffe://prod.example/ranker"], "GetFeatures") is None


def test_tls_on_without_files_names_what_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RECMESH_TLS", "on")
    monkeypatch.delenv("RECMESH_TLS_CERT", raising=False)
    monkeypatch.delenv("RECMESH_TLS_KEY", raising=False)
    monkeypatch.setenv("RECMESH_TLS_CA", str(tmp_path / "ca.crt"))
    process_tls.cache_clear()
    try:
        with pytest.raises(TlsConfigError, match="RECMESH_TLS_CERT, RECMESH_TLS_KEY are not set"):
            process_tls()
        monkeypatch.setenv("RECMESH_TLS_CERT", str(tmp_path / "c.crt"))
        monkeypatch.setenv("RECMESH_TLS_KEY", str(tmp_path / "c.key"))
        process_tls.cache_clear()
        with pytest.raises(TlsConfigError, match=r"RECMESH_TLS_CA=.*ca.crt: cannot read the CA certificate"):
            process_tls()
    finally:
        monkeypatch.undo()
        process_tls.cache_clear()


def test_redis_credentials_come_from_env_or_file(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    auth = RedisAuth(REDIS_USERNAME="feature", REDIS_PASSWORD_FILE=secret, REDIS_TLS_CA=tmp_path / "ca.pem")
    assert auth.client_options("redis://r:6379/0") == {"username": "feature", "password": "s3cret"}
    assert auth.client_options("rediss://r:6379/0")["ssl_ca_certs"] == str(tmp_path / "ca.pem")


def test_aclfile_turns_the_default_user_off_and_hashes_passwords() -> None:
    text = aclfile({"feature": "pw-f", "ingest": "pw-i"})
    lines = text.splitlines()
    assert lines[0] == "user default off"
    assert lines[1] == f"user feature on #{hashlib.sha256(b'pw-f').hexdigest()} {ACL_RULES['feature']}"
    assert "pw-f" not in text and "pw-i" not in text
    assert "+@write" not in ACL_RULES["feature"] and "-@dangerous" in ACL_RULES["feature"]


def test_attribution_may_touch_only_online_evaluations_keys() -> None:
    def granted(user: str, key: str) -> bool:
        patterns = [w[1:] for w in ACL_RULES[user].split() if w.startswith("~")]
        return any(fnmatch.fnmatchcase(key, p) for p in patterns)

    own = [keys.impression("u1", "r1"), keys.user_impressions("u1"), keys.user_positives("u1"),
           keys.EVAL_PENDING, keys.EVAL_CLOCK, keys.EVAL_TOTAL, keys.eval_sums(7),
           keys.eval_done(7)]  # fmt: skip
    assert all(granted("attribution", k) for k in own)
    others = [keys.user_profile("u1"), keys.user_ids("u1"), keys.user_history("u1"), keys.POPULARITY,
              keys.item_static("i1"), keys.applied("user_behavior")]  # fmt: skip
    assert not any(granted("attribution", k) for k in others)
    rules = ACL_RULES["attribution"].split()
    assert "~*" not in rules and "-@dangerous" in rules and not [r for r in rules if r.startswith("&")]
    # `recmesh eval online` reads the figures as the CLI; the answers themselves stay attribution's.
    assert granted("cli", keys.EVAL_TOTAL) and granted("cli", keys.eval_sums(7))
    assert not granted("cli", keys.impression("u1", "r1"))


def test_kafka_sasl_options() -> None:
    assert KafkaAuth(KAFKA_SECURITY_PROTOCOL="PLAINTEXT").client_options() == {}
    options = KafkaAuth(
        KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT", KAFKA_SASL_USERNAME="gateway", KAFKA_SASL_PASSWORD="pw"
    ).client_options()
    assert options == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "gateway",
        "sasl_plain_password": "pw",
    }
    with pytest.raises(ValueError, match="needs KAFKA_SASL_USERNAME"):
        KafkaAuth(KAFKA_SECURITY_PROTOCOL="SASL_SSL").client_options()
    assert "ssl_context" in KafkaAuth(KAFKA_SECURITY_PROTOCOL="SSL").client_options()


def test_compose_credentials_tree_gives_each_container_only_its_own(tmp_path: Path) -> None:
    from cryptography import x509

    from recmesh.localsecrets import COMPOSE_PROCESSES, write_tree

    write_tree(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*COMPOSE_PROCESSES, "redis", "kafka"])
    for service, (identity, redis_user, kafka_user) in COMPOSE_PROCESSES.items():
        files = {p.name for p in (tmp_path / service).iterdir()}
        expected = {"ca.crt", "tls.crt", "tls.key"} if identity else set()
        expected |= {"redis.password"} if redis_user else set()
        expected |= {"kafka.password"} if kafka_user else set()
        assert files == expected, service
        if identity:
            cert = x509.load_pem_x509_certificate((tmp_path / service / "tls.crt").read_bytes())
            sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            assert sans.get_values_for_type(x509.UniformResourceIdentifier) == [uri(identity)]
            assert (tmp_path / service / "tls.key").stat().st_mode & 0o077 == 0
    acl = (tmp_path / "redis" / "users.acl").read_text()
    assert acl.startswith("user default on nopass -@all +ping +cluster|info\n")
    feature_pw = (tmp_path / "feature" / "redis.password").read_text()
    assert f"user feature on #{hashlib.sha256(feature_pw.encode()).hexdigest()} " in acl
    assert feature_pw not in acl
    assert (tmp_path / "gateway" / "kafka.password").read_text() == (
        tmp_path / "kafka" / "gateway.password"
    ).read_text()
