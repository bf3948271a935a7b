"""The real `recmesh` command finds the mesh `recmesh up` left in its state
directory (secrets/cli.env) with nothing sourced, and what the environment sets wins."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TLS = ("RECMESH_TLS_CA", "RECMESH_TLS_CERT", "RECMESH_TLS_KEY")


def _recmesh(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recmesh.tools.cli.main", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _env(**extra: str) -> dict[str, str]:
    """A shell's: TLS on (the default), none of the mesh's settings, not the suite's RECMESH_CLI_ENV=off."""
    drop = {*TLS, "RECMESH_CLI_ENV", "RECMESH_STATE_DIR", "FEATURE_ADDR", "REDIS_URL"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "RECMESH_TLS": "on", **extra}


def test_the_cli_reads_up_s_cli_env_from_its_state_directory(tmp_path: Path) -> None:
    # `recmesh up`'s default state directory, `.recmesh` where it ran; certificate
    # paths that are not there, so the command fails on reading them, naming them.
    secrets = tmp_path / ".recmesh" / "secrets"
    secrets.mkdir(parents=True)
    (secrets / "cli.env").write_text(
        "".join(f"{v}={tmp_path}/from-file/{v.lower()}.pem\n" for v in TLS) + "FEATURE_ADDR=127.0.0.1:1\n"
    )
    get = ("features", "get", "--user", "u1")

    done = _recmesh(tmp_path, _env(), *get)
    assert done.returncode == 2, done.stderr
    assert f"RECMESH_TLS_CA={tmp_path}/from-file/recmesh_tls_ca.pem: cannot read" in done.stderr

    # An explicit variable wins over the file's, variable by variable.
    done = _recmesh(tmp_path, _env(RECMESH_TLS_CA=str(tmp_path / "mine.pem")), *get)
    assert done.returncode == 2 and f"RECMESH_TLS_CA={tmp_path / 'mine.pem'}: cannot read" in done.stderr

    done = _recmesh(tmp_path, _env(), "--verbose", "repository", "show")
    assert done.returncode == 0, done.stderr
    path = secrets.resolve() / "cli.env"
    assert f"recmesh: mesh settings from {path}: set {', '.join(TLS)}, FEATURE_ADDR\n" in done.stderr


def test_without_a_cli_env_the_error_says_what_is_missing_and_where_up_writes_it(tmp_path: Path) -> None:
    state = tmp_path / "state"  # RECMESH_STATE_DIR, as `recmesh up` takes it: nothing there
    done = _recmesh(tmp_path, _env(RECMESH_STATE_DIR=str(state)), "features", "get", "--user", "u1")
    assert done.returncode == 2
    assert "RECMESH_TLS_CA, RECMESH_TLS_CERT, RECMESH_TLS_KEY are not set" in done.stderr
    assert "secrets/cli.env" in done.stderr and "Traceback" not in done.stderr
