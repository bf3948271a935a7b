"""Loading: reading a repository file, its errors (file:line of the key), and the loaders."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from pydantic import ValidationError

from recmesh.errors import InvalidArgument
from recmesh.features.repository.compiler import compile_repository
from recmesh.features.repository.declarations import RepositoryDecl
from recmesh.features.repository.feature_set import FeatureSet


class RepositoryError(InvalidArgument):
    """A repository file that cannot be used; the message names the file and the key."""


def _line_of(text: str, loc: tuple[str | int, ...]) -> int | None:
    """Best effort: the line of the key `loc` names in a TOML text (its table's
    header, then the key inside it), for error messages."""
    lines = text.splitlines()
    parts = [str(p) for p in loc if not isinstance(p, int)]
    best: int | None = None
    # the longest table header that is a prefix of loc
    for depth in range(len(parts), 0, -1):
        header = ".".join(parts[:depth])
        for n, line in enumerate(lines):
            stripped = line.strip().replace(" ", "")
            if stripped in (f"[{header}]", f"[[{header}]]"):
                best = n + 1
                rest = parts[depth:]
                if rest:
                    key = rest[0]
                    for m in range(n + 1, len(lines)):
                        s = lines[m].strip()
                        if s.startswith("["):
                            break
                        if re.match(rf"^{re.escape(key)}\s*=", s):
                            return m + 1
                return best
    if parts:
        key = parts[-1]
        for n, line in enumerate(lines):
            if re.match(rf"^\s*{re.escape(key)}\s*=", line):
                return n + 1
    return best


def key_location(feature_set: FeatureSet, key: str) -> str:
    """ "path:line" of a dotted repository key (the file's name alone when the
    line cannot be found), for messages about the team's file."""
    if feature_set.path is None:
        return "(repository)"
    try:
        text = feature_set.path.read_text()
    except OSError:
        return str(feature_set.path)
    line = _line_of(text, tuple(key.split(".")))
    return f"{feature_set.path}{f':{line}' if line else ''}"


def _describe(err: ValidationError, path: Path, text: str) -> str:
    out = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if p not in ("function-after[_shape(), RealtimeDecl]",))
        key = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in loc).replace(".[", "[")
        line = _line_of(text, loc)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see docs/features.md)"
        out.append(f"{path}{f':{line}' if line else ''}: {key or '(top level)'}: {msg}")
    return "\n".join(out)


def parse_feature_set(text: str, path: Path) -> FeatureSet:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise RepositoryError(f"{path}: not valid TOML: {err}") from None
    try:
        decl = RepositoryDecl.model_validate(raw)
    except ValidationError as err:
        raise RepositoryError(_describe(err, path, text)) from None
    try:
        return compile_repository(decl, path.resolve())
    except ValueError as err:
        key = str(err).split(":", 1)[0]
        line = _line_of(text, tuple(re.split(r"[.\[\]]+", key)))
        raise RepositoryError(f"{path}{f':{line}' if line else ''}: {err}") from None


def load_feature_set(path: Path) -> FeatureSet:
    """Read, validate and compile a repository file (a directory means its recmesh.toml)."""
    if path.is_dir():
        path = path / "recmesh.toml"
    try:
        text = path.read_text()
    except OSError as err:
        raise RepositoryError(f"{path}: cannot read the repository file: {err.strerror or err}") from None
    return parse_feature_set(text, path)


# The demo repository, next to the source tree (a checkout or an editable
# install); an installed package has none, and services there must be told
# where the team's repository is (RECMESH_REPOSITORY).
DEMO_REPOSITORY = Path(__file__).resolve().parents[3] / "examples" / "demo" / "recmesh.toml"


def configured_feature_set(path: Path | None) -> FeatureSet:
    """The repository a process serves: `path` (RECMESH_REPOSITORY), else the demo one."""
    if path is not None:
        return load_feature_set(path)
    if DEMO_REPOSITORY.exists():
        return load_feature_set(DEMO_REPOSITORY)
    raise RepositoryError(
        "RECMESH_REPOSITORY is not set and there is no demo repository next to this installation: "
        "point RECMESH_REPOSITORY at your recmesh.toml (docs/features.md)"
    )


def served_feature_set(path: Path | None, service: str) -> FeatureSet:
    """The repository a service serves, announced in its log (a warning when it is the demo's)."""
    import structlog

    feature_set = configured_feature_set(path)
    log = structlog.get_logger(f"recmesh.{service}")
    log.info(
        "repository",
        name=feature_set.name,
        feature_set_version=feature_set.version,
        path=str(feature_set.path),
        features=len(feature_set.features),
        streams=len(feature_set.streams),
    )
    if feature_set.demo:
        log.warning(
            "serving_demo_repository",
            detail="the demo's feature repository is served: set RECMESH_REPOSITORY to your recmesh.toml "
            "(docs/features.md)",
        )
    return feature_set
