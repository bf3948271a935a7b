"""The CLI finds the mesh `recmesh up` started, as kubectl finds its kubeconfig.

`recmesh up` writes the CLI's certificate, Redis user and the mesh's addresses
to `<state dir>/secrets/cli.env` (recmesh.localsecrets). At start-up, before
any command reads a setting, the CLI reads that file and sets each variable it
names that the environment does not: an explicit variable wins, variable by
variable (REDIS_PASSWORD_FILE set keeps the file's REDIS_PASSWORD out, as a
password would win over it; KAFKA_SASL_PASSWORD_FILE likewise). The state
directory is the one `recmesh up` uses: RECMESH_STATE_DIR, else `.recmesh` in
the current directory. RECMESH_CLI_ENV names another file (which must exist),
or is `off` for none. No file: nothing is set, and a command that needs the
credentials says which ones are missing. `recmesh up`, `init` and `bench`,
which start or prepare a mesh of their own, read none and turn it off for the
processes they start (main.OWN_MESH_COMMANDS).

The file is what `recmesh up` writes and a shell can source: `NAME=value`
lines, the value one shell word (quoted as shlex.quote quotes; read without
`$` expansion). Blank lines, `#` comments and an `export ` prefix are allowed;
any other line is an error naming the file and line, not a credential
silently left out.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

from recmesh.errors import RecmeshError
from recmesh.settings import CliSettings

OFF = "off"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# A file's variable -> variables that, set in the environment, count as it being
# set (the file's value would win over them: recmesh.credentials._secret).
_SHADOWED_BY = {
    "REDIS_PASSWORD": ("REDIS_PASSWORD_FILE",),
    "KAFKA_SASL_PASSWORD": ("KAFKA_SASL_PASSWORD_FILE",),
}


class CliEnvError(RecmeshError):
    """The mesh's cli.env cannot be read as `NAME=value` lines."""


@dataclass
class CliEnv:
    """What start-up did: the file looked for (None: RECMESH_CLI_ENV=off), whether
    it was there, the variables set from it and those the environment kept."""

    path: Path | None
    found: bool = False
    applied: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """One line for --verbose: which file, and which of its variables took effect (never values)."""
        if self.path is None:
            return f"RECMESH_CLI_ENV={OFF}: the mesh's settings come from the environment"
        if not self.found:
            return f"no {self.path} (`recmesh up` writes it): the mesh's settings come from the environment"
        kept = f"; kept from the environment: {', '.join(self.kept)}" if self.kept else ""
        return f"mesh settings from {self.path}: set {', '.join(self.applied) or 'nothing'}{kept}"


def cli_env_path() -> tuple[Path | None, bool]:
    """The file to read, and whether RECMESH_CLI_ENV named it (else it is
    `recmesh up`'s); None when RECMESH_CLI_ENV is off."""
    settings = CliSettings()
    if settings.cli_env == OFF:
        return None, True
    if settings.cli_env:
        return Path(settings.cli_env).resolve(), True
    return (settings.state_dir / "secrets" / "cli.env").resolve(), False


def parse(text: str, path: Path) -> dict[str, str]:
    """`NAME=value` lines -> {NAME: value}; a line that is not one raises CliEnvError."""
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        assignment = line.strip()
        if not assignment or assignment.startswith("#"):
            continue
        if assignment.startswith("export "):
            assignment = assignment.removeprefix("export ").lstrip()
        name, equals, raw = assignment.partition("=")
        if not equals or not _NAME.match(name):
            raise CliEnvError(f"{path} line {number}: not NAME=value")
        try:
            words = shlex.split(raw, comments=True)
        except ValueError as err:
            raise CliEnvError(f"{path} line {number}: {name}: {err}") from None
        if len(words) > 1:
            raise CliEnvError(f"{path} line {number}: {name}: the value is more than one word (quote it)")
        values[name] = words[0] if words else ""
    return values


def apply(values: Mapping[str, str], environ: MutableMapping[str, str]) -> tuple[list[str], list[str]]:
    """Set in `environ` each of `values` it does not set already -> (set, kept).
    Names compare without case, as the settings read them (pydantic-settings)."""
    present = {name.upper() for name in environ}
    applied: list[str] = []
    kept: list[str] = []
    for name, value in values.items():
        if {name.upper(), *_SHADOWED_BY.get(name.upper(), ())} & present:
            kept.append(name)
        else:
            environ[name] = value
            applied.append(name)
    return applied, kept


def load_cli_env() -> CliEnv:
    """Apply the mesh's cli.env (cli_env_path) to this process's environment."""
    path, named = cli_env_path()
    out = CliEnv(path)
    if path is None:
        return out
    try:
        text = path.read_text()
    except FileNotFoundError:
        if named:
            raise CliEnvError(f"RECMESH_CLI_ENV={path}: no such file") from None
        return out
    except OSError as err:
        raise CliEnvError(f"{path}: cannot read it: {err.strerror}") from None
    out.found = True
    out.applied, out.kept = apply(parse(text, path), os.environ)
    return out
