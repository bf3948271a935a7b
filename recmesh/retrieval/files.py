"""Where learnt retrieval lives on disk, versioned and switched like models.

    MODEL_DIR/recall/CURRENT            names the served version
    MODEL_DIR/recall/<version>/
        card.json                       feature-set version, sources, their seed decay
                                        and fusion weight, how and from what it was built
        <source>.npz                    one NeighbourTable per source (knn, ease, similar),
                                        or the next-item model (sequence)
        vectors.npz                     a team's item and user vectors (the `vectors` source)

The ranker maps the current version (services/ranker/learnt.py) and reloads it
when CURRENT changes; a version built on another feature set is refused with
the reason (RecallMismatch), as models are.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recmesh.errors import FailedPrecondition, InvalidArgument
from recmesh.retrieval.sequence import SequenceModel
from recmesh.retrieval.table import NeighbourTable, RecallTable
from recmesh.retrieval.vectors import TwoTower

DIR_NAME = "recall"
VECTORS_FILE = "vectors.npz"
# How each source's file is read: the next-item model has its own form, every other a neighbour table.
_LOADERS: dict[str, Callable[[Path], RecallTable]] = {"sequence": SequenceModel.load}


class RecallMismatch(FailedPrecondition):
    """A recall version built on another feature set than the one served."""


@dataclass
class RecallVersion:
    version: str
    path: Path
    card: dict[str, Any]
    tables: dict[str, RecallTable]
    vectors: TwoTower | None = None

    @property
    def sources(self) -> dict[str, dict[str, Any]]:
        return dict(self.card.get("sources", {}))


def recall_root(model_dir: Path) -> Path:
    return model_dir / DIR_NAME


def current_version(model_dir: Path) -> str | None:
    pointer = recall_root(model_dir) / "CURRENT"
    try:
        return pointer.read_text().strip() or None
    except OSError:
        return None


def save(
    model_dir: Path,
    card: dict[str, Any],
    tables: Mapping[str, RecallTable],
    activate: bool = True,
    vectors: TwoTower | None = None,
) -> str:
    """Write a version (named by a hash of its files) and make it current."""
    root = recall_root(model_dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".build-"))
    digest = hashlib.sha256()
    for name in sorted(tables):
        tables[name].save(tmp / f"{name}.npz")
        digest.update((tmp / f"{name}.npz").read_bytes())
    if vectors is not None:
        vectors.save(tmp / VECTORS_FILE)
        digest.update((tmp / VECTORS_FILE).read_bytes())
    digest.update(json.dumps(card, sort_keys=True).encode())
    version = card.get("version") or f"recall-{digest.hexdigest()[:12]}"
    card = {**card, "version": version, "files": {n: f"{n}.npz" for n in sorted(tables)}}
    card["vectors_file"] = VECTORS_FILE if vectors is not None else None
    (tmp / "card.json").write_text(json.dumps(card, indent=2, sort_keys=True))
    final = root / version
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    if activate:
        set_current(model_dir, version)
    return version


def update_card(model_dir: Path, version: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Add `changes` to a version's card (what is learnt after its tables, e.g.
    the blend with the model trained beside them); the version keeps its name."""
    card = {**read_card(model_dir, version), **changes}
    path = recall_root(model_dir) / version / "card.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(card, indent=2, sort_keys=True))
    tmp.replace(path)
    return card


def set_current(model_dir: Path, version: str) -> None:
    root = recall_root(model_dir)
    tmp = root / ".CURRENT.tmp"
    tmp.write_text(version + "\n")
    os.replace(tmp, root / "CURRENT")


def read_card(model_dir: Path, version: str) -> dict[str, Any]:
    path = recall_root(model_dir) / version / "card.json"
    try:
        card: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        known = ", ".join(list_versions(model_dir)) or "none"
        raise InvalidArgument(
            f"no recall version {version!r} in {recall_root(model_dir)} (known: {known})"
        ) from None
    return card


def list_versions(model_dir: Path) -> list[str]:
    root = recall_root(model_dir)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "card.json").exists())


def check_feature_set(card: dict[str, Any], feature_set_version: str, where: str) -> None:
    built = card.get("feature_set_version")
    if built != feature_set_version:
        raise RecallMismatch(
            f"{where}: built on feature set {built}, but the repository serves {feature_set_version}; "
            "rebuild it with `recmesh recall build --events LOG` (or `recmesh train --events LOG`)"
        )


def activate(model_dir: Path, version: str, feature_set_version: str) -> dict[str, Any]:
    card = read_card(model_dir, version)
    check_feature_set(card, feature_set_version, f"recall version {version}")
    set_current(model_dir, version)
    return card


def load_current(model_dir: Path, feature_set_version: str) -> RecallVersion | None:
    """The current version's tables, or None when there is none; RecallMismatch
    when it was built on another feature set, ValueError/OSError when unreadable."""
    version = current_version(model_dir)
    if version is None:
        return None
    path = recall_root(model_dir) / version
    card = read_card(model_dir, version)
    check_feature_set(card, feature_set_version, f"recall version {version} ({path})")
    tables = {name: _LOADERS.get(name, NeighbourTable.load)(path / file)
              for name, file in card.get("files", {}).items()}  # fmt: skip
    vectors = TwoTower.load(path / card["vectors_file"]) if card.get("vectors_file") else None
    return RecallVersion(version, path, card, tables, vectors)
