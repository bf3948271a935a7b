"""A team's own two-tower retrieval: item vectors and user vectors, served by dot product.

Read from JSON lines (`{"item_id": "42", "vector": [0.1, ...]}`, `{"user_id":
"7", "vector": [...]}`) or NumPy `.npz` files (`ids`, `vectors`), stored in a
recall version as `vectors.npz`. A user without a vector of their own is
represented by the mean of their history items' vectors (how a two-tower model
without a user-side encoder at hand would do it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import orjson

from recmesh.errors import InvalidArgument

F32 = npt.NDArray[np.float32]


@dataclass
class TwoTower:
    item_ids: list[str]
    items: F32  # [n_items, dim]
    user_ids: list[str]
    users: F32  # [n_users, dim]
    item_row: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    user_row: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if (
            self.items.ndim != 2
            or self.users.ndim != 2
            or (len(self.users) and self.users.shape[1] != self.dim)
        ):
            raise ValueError("item and user vectors must be 2-d arrays of one width")
        self.item_row = self.item_row or {i: n for n, i in enumerate(self.item_ids)}
        self.user_row = self.user_row or {u: n for n, u in enumerate(self.user_ids)}

    @property
    def dim(self) -> int:
        return int(self.items.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.items.nbytes + self.users.nbytes)

    def query(self, user_id: str, history: list[str]) -> F32 | None:
        """The user's vector, else the mean of their known history items' vectors."""
        n = self.user_row.get(user_id)
        if n is not None:
            own: F32 = self.users[n]
            return own
        rows = [self.item_row[i] for i in history if i in self.item_row]
        if not rows:
            return None
        mean: F32 = self.items[rows].mean(axis=0).astype(np.float32)
        return mean

    def save(self, path: Path) -> None:
        np.savez(path, item_ids=np.asarray(self.item_ids).astype(str), items=self.items,
                 user_ids=np.asarray(self.user_ids, dtype=str), users=self.users)  # fmt: skip

    @classmethod
    def load(cls, path: Path) -> TwoTower:
        with np.load(path, allow_pickle=False) as z:
            return cls([str(i) for i in z["item_ids"]], z["items"].astype(np.float32),
                       [str(u) for u in z["user_ids"]], z["users"].astype(np.float32))  # fmt: skip


def read_vectors(path: Path, key: str) -> tuple[list[str], F32]:
    """(ids, matrix) from JSON lines {key: id, "vector": [...]} or an .npz with ids and vectors."""
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as z:
                return [str(i) for i in z["ids"]], np.asarray(z["vectors"], np.float32)
        except (KeyError, ValueError, OSError) as err:
            raise InvalidArgument(f"{path}: want an .npz with arrays 'ids' and 'vectors' ({err})") from None
    ids: list[str] = []
    rows: list[list[float]] = []
    with path.open("rb") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
                ident, vec = str(obj[key]), [float(x) for x in obj["vector"]]
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                raise InvalidArgument(
                    f'{path}:{n}: want {{"{key}", "vector": [numbers]}} ({err!r})'
                ) from None
            if rows and len(vec) != len(rows[0]):
                raise InvalidArgument(
                    f"{path}:{n}: a vector of {len(vec)} numbers; the first had {len(rows[0])}"
                )
            ids.append(ident)
            rows.append(vec)
    if not rows:
        raise InvalidArgument(f"{path}: no vectors")
    return ids, np.asarray(rows, np.float32)
