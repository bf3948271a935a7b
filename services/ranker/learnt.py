"""Learnt retrieval in the ranker: the current recall version's tables
(recmesh.retrieval), mapped in this process and reloaded when it changes.

Each table (item-kNN, EASE, or a team's own similar-items table) is a recall
source: its seeds are the user's history (the newest distinct items the
feature service returns with the user look-up), weighted by the version's
learnt recency decay; its items are the summed neighbour rows. The tables live
in the ranker, not in Redis: a request reads 50 rows of a few hundred entries,
which NumPy sums in tens of microseconds, where Redis would cost a round trip
and 50 replies. A version built on another feature set is refused (logged,
the sources recall nothing and say why), as a model is.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import numpy.typing as npt
import structlog

from recmesh.errors import RecmeshError
from recmesh.features.repository import RecallRoles
from recmesh.retrieval import files
from recmesh.retrieval.table import recency_weights
from recmesh.retrieval.vectors import TwoTower
from services.ranker.fusion import Role
from services.ranker.recall import RecallContext, Recalled, history_seeds, never_again
from services.ranker.reload import ReloadOnChange

_log = structlog.get_logger("recmesh.ranker.learnt")

RELOAD_CHECK_S = 5.0
# The final order's weight on the recall order (policy.blend_orders) when a
# learnt version is in force. Measured on MovieLens-100k (docs/models.md,
# `recmesh train --events LOG --ranking` with RECMESH_RANKER_RECALL_BLEND):
# served HR@10 0.169 / 0.194 / 0.206 / 0.219 at 0 / 0.5 / 1 / 2. Not yet
# learnt per data set: a version's card may carry its own ("blend").
RECALL_BLEND = 2.0


class RecallHolder(ReloadOnChange):
    """The current recall version (None: none built, or refused), swapped whole."""

    def __init__(
        self, model_dir: Path, feature_set_version: str, check_every_s: float = RELOAD_CHECK_S
    ) -> None:
        super().__init__(check_every_s)
        self._model_dir = model_dir
        self._fs_version = feature_set_version
        self.current: files.RecallVersion | None = None
        self.vector_index: VectorIndex | None = None  # over the current version's item vectors
        self.problem: str | None = None  # why nothing is served (mismatch, unreadable)

    def _disk_stamp(self) -> tuple[str | None, float]:
        pointer = files.recall_root(self._model_dir) / "CURRENT"
        try:
            return pointer.read_text().strip() or None, os.stat(pointer).st_mtime
        except OSError:
            return None, 0.0

    def _load(self) -> bool:
        try:
            loaded = files.load_current(self._model_dir, self._fs_version)
            index = VectorIndex(loaded.vectors) if loaded is not None and loaded.vectors is not None else None
            self.current, self.vector_index, self.problem = loaded, index, None
        except RecmeshError as err:
            self.current, self.vector_index, self.problem = None, None, str(err)
            _log.error("recall_version_refused", error=str(err))
            return True
        except (OSError, ValueError, KeyError) as err:
            self.problem = f"unreadable: {err!r}"
            _log.warning("recall_version_unreadable", error=repr(err))
            return True
        if self.current is not None:
            v = self.current
            _log.info("recall_version", version=v.version, tables={n: len(t) for n, t in v.tables.items()},
                      bytes=sum(t.nbytes for t in v.tables.values()))  # fmt: skip
        return True

    def serves(self, source: str) -> bool:
        """Does the current version serve this source ("": any)?"""
        v = self.current
        if v is None:
            return False
        if source == "vectors":
            return self.vector_index is not None
        return not source or source in v.tables

    def blend(self) -> float:
        """The weight of the recall order against the model's (policy.blend_orders):
        the version's, else RECALL_BLEND; 0 without a version (the recall order
        then carries no learnt table)."""
        v = self.current
        return 0.0 if v is None else float(v.card.get("blend", RECALL_BLEND))

    def fusion(self) -> dict[str, float]:
        """The fusion weights learnt with the current version ({} without one)."""
        v = self.current
        return {} if v is None else {str(k): float(w) for k, w in v.card.get("fusion", {}).items()}

    def fusion_depth(self) -> dict[str, float]:
        """The weights learnt for the fused list past its head ({}: the same as `fusion`)."""
        v = self.current
        return {} if v is None else {str(k): float(w) for k, w in v.card.get("fusion_depth", {}).items()}


class LearntSource:
    """One table of the current recall version, seeded by the user's history."""

    role: Role = "learnt"

    def __init__(self, name: str, holder: RecallHolder, roles: RecallRoles) -> None:
        self.name = name
        self._holder = holder
        self._roles = roles

    async def fetch(self, ctx: RecallContext) -> Recalled:
        version = self._holder.current
        if version is None:
            return Recalled([], attributes={"table": self._holder.problem or "absent"})
        table = version.tables.get(self.name)
        if table is None:
            return Recalled([], attributes={"table": "absent"})
        seeds = history_seeds(self._roles, ctx)
        if not seeds:
            return Recalled([], attributes={"seeds": 0, "version": version.version})
        decay = float(version.sources.get(self.name, {}).get("decay", 1.0))
        items = table.top(seeds, recency_weights(len(seeds), decay), ctx.limit,
                          never_again(self._roles, ctx, seeds))  # fmt: skip
        return Recalled(items, attributes={"seeds": len(seeds), "version": version.version})


class RevisitSource:
    """The user's own history items that are not seen (the repository's
    `recall.seen`: what was bought), newest first: the products they viewed or
    carted and did not buy. Nothing when the repository declares no `seen`
    (then every history item is seen)."""

    name = "revisit"
    role: Role = "learnt"

    def __init__(self, roles: RecallRoles) -> None:
        self._roles = roles

    async def fetch(self, ctx: RecallContext) -> Recalled:
        if self._roles.seen is None:
            return Recalled([], attributes={"seen": "undeclared"})
        seeds = history_seeds(self._roles, ctx)
        never = never_again(self._roles, ctx, seeds)
        items = [s for s in seeds if s not in never][: ctx.limit]
        return Recalled([(s, 1.0 / (1 + n)) for n, s in enumerate(items)], attributes={"seeds": len(seeds)})


# Exact inner-product search up to this many items; an HNSW graph beyond (as the
# semantic index: M 32, efSearch 128).
EXACT_SEARCH_ITEMS = 100_000


class VectorIndex:
    """Inner-product search over a team's item vectors (faiss)."""

    def __init__(self, vectors: TwoTower) -> None:
        import faiss

        faiss.omp_set_num_threads(1)
        self.vectors = vectors
        matrix = np.ascontiguousarray(vectors.items, dtype=np.float32)
        if len(matrix) <= EXACT_SEARCH_ITEMS:
            self._index: faiss.Index = faiss.IndexFlatIP(vectors.dim)
        else:
            hnsw = faiss.IndexHNSWFlat(vectors.dim, 32, faiss.METRIC_INNER_PRODUCT)
            hnsw.hnsw.efSearch = 128
            self._index = hnsw
        self._index.add(matrix)

    def search(
        self, query: npt.NDArray[np.float32], k: int, exclude: frozenset[str]
    ) -> list[tuple[str, float]]:
        ids = self.vectors.item_ids
        want = min(len(ids), k + len(exclude))
        scores, rows = self._index.search(query.reshape(1, -1).astype(np.float32), want)
        out = [(ids[int(r)], float(s)) for s, r in zip(scores[0], rows[0], strict=True) if r >= 0]
        return [(i, s) for i, s in out if i not in exclude][:k]


class VectorSource:
    """A team's two-tower retrieval: the user's vector (else the mean of their
    history items' vectors) searched against the item vectors."""

    name = "vectors"
    role: Role = "learnt"

    def __init__(self, holder: RecallHolder, roles: RecallRoles) -> None:
        self._holder = holder
        self._roles = roles

    async def fetch(self, ctx: RecallContext) -> Recalled:
        index = self._holder.vector_index
        if index is None:
            return Recalled([], attributes={"table": self._holder.problem or "absent"})
        seeds = history_seeds(self._roles, ctx)
        query = index.vectors.query(ctx.user_id, seeds)
        if query is None:
            return Recalled([], attributes={"query": "none"})
        own = ctx.user_id in index.vectors.user_row
        items = index.search(query, ctx.limit, never_again(self._roles, ctx, seeds))
        return Recalled(items, attributes={"query": "user" if own else "history"})
