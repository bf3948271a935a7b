"""The credentials `recmesh up` makes for one run of the local mesh.

Throwaway and per run, under the state directory (owner-only files):
- `tls/`: a new CA and one certificate per mesh identity (recmesh.pki); its
  key is never written, so nothing else can be signed by it;
- `redis/users.acl`: the embedded Redis's ACL users (recmesh.credentials.
  ACL_RULES), passwords stored hashed, the default user off;
- `secrets/cli.env`: what the operator's tools need against this mesh (the
  `ops` certificate, the `cli` Redis user, the addresses). The `recmesh` CLI
  reads it at start-up (recmesh/tools/cli/clienv.py); other tools:
  `set -a; . .recmesh/secrets/cli.env; set +a`.

Each child process gets only its own: the feature service its certificate
and the read-only Redis user, the ingest the writing Redis user, attribution
its own (online evaluation's keys only), the ranker,
inference and gateway their certificates.
"""

from __future__ import annotations

import os
import secrets
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from recmesh.credentials import aclfile
from recmesh.pki import IdentityFiles, write_local_pki
from recmesh.security import IDENTITIES

TLS_VARIABLES = ("RECMESH_TLS_CA", "RECMESH_TLS_CERT", "RECMESH_TLS_KEY")
REDIS_VARIABLES = ("REDIS_USERNAME", "REDIS_PASSWORD", "REDIS_PASSWORD_FILE")

# Process -> Redis user (processes not named here do not talk to Redis).
REDIS_USERS = {"feature": "feature", "feature-ingest": "ingest", "attribution": "attribution", "cli": "cli"}
# Process -> its certificate's identity.
TLS_IDENTITIES = {"feature": "feature", "inference": "inference", "ranker": "ranker",
                  "gateway": "gateway", "cli": "ops"}  # fmt: skip


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


@dataclass
class LocalSecrets:
    state: Path
    tls: dict[str, IdentityFiles] = field(default_factory=dict)
    redis_passwords: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, state: Path, tls: bool, embedded_redis: bool) -> LocalSecrets:
        out = cls(state)
        if tls:
            out.tls = write_local_pki(_private_dir(state / "tls"), IDENTITIES)
        if embedded_redis:
            out.redis_passwords = {
                user: secrets.token_urlsafe(24) for user in sorted(set(REDIS_USERS.values()))
            }
            _write_private(_private_dir(state / "redis") / "users.acl", aclfile(out.redis_passwords))
        return out

    @property
    def aclfile(self) -> Path | None:
        return self.state / "redis" / "users.acl" if self.redis_passwords else None

    def replaced(self) -> tuple[str, ...]:
        """Variables whose inherited values a child must not see: those this run
        made its own (a child gets only its own, env_for)."""
        return (TLS_VARIABLES if self.tls else ()) + (REDIS_VARIABLES if self.redis_passwords else ())

    def env_for(self, process: str) -> dict[str, str]:
        """The credentials of one process (`cli`: the operator's tools and `up` itself)."""
        env: dict[str, str] = {}
        identity = TLS_IDENTITIES.get(process)
        if self.tls and identity is not None:
            env.update(self.tls[identity].env())
        user = REDIS_USERS.get(process)
        if self.redis_passwords and user is not None:
            env.update(REDIS_USERNAME=user, REDIS_PASSWORD=self.redis_passwords[user])
        return env

    def write_cli_env(self, extra: Mapping[str, str]) -> Path:
        """secrets/cli.env: the CLI's credentials and this mesh's addresses."""
        path = _private_dir(self.state / "secrets") / "cli.env"
        values = {**extra, **self.env_for("cli")}
        _write_private(path, "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items()))
        return path


# --- docker compose: one tree of per-container directories ----------------------------------------

# Compose service -> (certificate identity, Redis user, Kafka user); None: not needed.
COMPOSE_PROCESSES: dict[str, tuple[str | None, str | None, str | None]] = {
    "gateway": ("gateway", None, "gateway"),
    "ranker": ("ranker", None, None),
    "feature": ("feature", "feature", "feature"),
    "feature-ingest": (None, "ingest", "ingest"),
    "attribution": (None, "attribution", "attribution"),
    "inference": ("inference", None, None),
    "init": (None, "cli", "cli"),
}
RECMESH_UID, REDIS_UID, KAFKA_UID = 10001, 999, 1000  # the Dockerfile's USER, redis:alpine's, apache/kafka's


def _chown_tree(path: Path, uid: int) -> None:
    if os.geteuid() != 0:
        return
    for p in [path, *path.rglob("*")]:
        os.chown(p, uid, uid)


def write_tree(directory: Path) -> None:
    """The stack's credentials as docker-compose.yml mounts them, each container
    seeing only its own directory (a volume subpath): <service>/ca.crt, tls.crt,
    tls.key, redis.password, kafka.password; redis/users.acl (hashed, the
    default user may only PING); kafka/<user>.password for the broker's set-up."""
    pki = write_local_pki(_private_dir(directory / ".pki"), IDENTITIES)
    redis = {
        user: secrets.token_urlsafe(24) for user in sorted({r for _, r, _ in COMPOSE_PROCESSES.values() if r})
    }
    kafka = {
        user: secrets.token_urlsafe(24) for user in sorted({k for _, _, k in COMPOSE_PROCESSES.values() if k})
    }
    for service, (identity, redis_user, kafka_user) in COMPOSE_PROCESSES.items():
        own = _private_dir(directory / service)
        if identity is not None:
            files = pki[identity]
            (own / "ca.crt").write_bytes(files.ca.read_bytes())
            (own / "tls.crt").write_bytes(files.cert.read_bytes())
            _write_private(own / "tls.key", files.key.read_text())
        if redis_user is not None:
            _write_private(own / "redis.password", redis[redis_user])
        if kafka_user is not None:
            _write_private(own / "kafka.password", kafka[kafka_user])
        _chown_tree(own, RECMESH_UID)
    for path in (directory / ".pki").iterdir():
        path.unlink()  # each key now lives only in its own container's directory
    (directory / ".pki").rmdir()
    redis_dir = _private_dir(directory / "redis")
    _write_private(redis_dir / "users.acl", aclfile(redis, probe=True))
    _chown_tree(redis_dir, REDIS_UID)
    kafka_dir = _private_dir(directory / "kafka")
    for user, password in kafka.items():
        _write_private(kafka_dir / f"{user}.password", password)
    _chown_tree(kafka_dir, KAFKA_UID)


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m recmesh.localsecrets DIR  (docker compose's credentials)")
    write_tree(Path(sys.argv[1]))
    print(f"credentials for docker compose written under {sys.argv[1]}")
