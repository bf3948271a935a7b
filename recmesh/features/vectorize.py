"""Feature values -> model input columns, by declared transforms.

A model's input is a list of `Transform`s, each turning one declared feature
(of the user, of the candidate item, or their ids) into one or more float
columns. The list lives in the model's card (recmesh train writes it, a team
writes it for a model of its own: docs/models.md), so the inference service
builds exactly the inputs its served model was trained on, from the feature
values the feature service serves; training builds them with the same code
from replayed rows. Vocabularies are learned from the training data and kept
in the card; nothing is imported from demo code.

Transforms (`KINDS`): value, log1p, one_hot (a categorical or multi-valued
feature over a vocabulary; unknown values set no column), share (a count_by
map's share of the other side's attribute values), distribution (a count_by
map over a vocabulary, as shares), contains (a list feature holds the other
side's id), match (a user value list meets an item attribute), hash_bucket (an
id hashed into buckets), id_sequence (a list of ids, e.g. the user's recent
items, each hashed into buckets, one column per position).
"""

from __future__ import annotations

import math
import random
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from recmesh.errors import FailedPrecondition
from recmesh.features.block import BlockView, as_list
from recmesh.features.repository import Entity, FeatureDef, FeatureSet

KINDS: dict[str, str] = {
    "value": "the number as it is",
    "log1p": "log(1 + max(0, x))",
    "one_hot": "1 per vocabulary value the feature holds (categorical or multi-valued); one column per value",
    "share": "a count_by map's count for the other side's `of` attribute value(s), over its total",
    "distribution": "a count_by map as shares over the vocabulary; one column per value",
    "contains": "1 when a list feature holds the other side's id (`of`: item_id or user_id)",
    "match": "1 when a user value (list) and the item's `of` attribute share a value",
    "hash_bucket": "an id (`feature`: item_id or user_id) hashed into `buckets` (crc32)",
    "id_sequence": "the first `length` ids of a list feature, each hashed into `buckets` (crc32), -1 past "
    "its end; one column per position",
}
Role = Literal["dense", "item_id", "item_attr", "intent", "history"]
IDS = ("item_id", "user_id")
# Columns a transform that reads both sides produces: dropped by the level-3 variant.
CROSS_KINDS = frozenset({"share", "contains", "match"})


@dataclass(frozen=True)
class Transform:
    kind: str
    feature: str  # a declared feature, or item_id / user_id
    entity: Entity  # whose feature (for ids: whose id)
    name: str  # column name; multi-column transforms add '=<value>'
    of: str | None = None  # share/match: the other side's attribute; contains: the id
    vocabulary: tuple[str, ...] = ()
    buckets: int = 0
    length: int = 0  # id_sequence: positions
    default: Any = None  # the feature's declared default
    of_default: Any = None
    role: Role = "dense"  # what recmesh's own model family does with it

    @property
    def width(self) -> int:
        if self.kind == "id_sequence":
            return self.length
        return len(self.vocabulary) if self.kind in ("one_hot", "distribution") else 1

    @property
    def columns(self) -> list[str]:
        if self.kind in ("one_hot", "distribution"):
            return [f"{self.name}={v}" for v in self.vocabulary]
        if self.kind == "id_sequence":
            return [f"{self.name}[{n}]" for n in range(self.length)]
        return [self.name]

    @property
    def cross(self) -> bool:
        return self.kind in CROSS_KINDS

    def to_json(self) -> dict[str, Any]:
        keep = ("kind", "feature", "default", "of_default")
        out = {k: v for k, v in asdict(self).items() if v not in (None, (), 0, "") or k in keep}
        if self.vocabulary:
            out["vocabulary"] = list(self.vocabulary)
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Transform:
        data = dict(raw)
        data["vocabulary"] = tuple(data.get("vocabulary", ()))
        if data.get("kind") not in KINDS:
            raise ValueError(f"unknown transform {data.get('kind')!r}; known: {', '.join(KINDS)}")
        return cls(**data)


def item_bucket(item_id: str, buckets: int) -> int:
    """A stable hash of an id (the same in every process, unlike hash())."""
    return zlib.crc32(item_id.encode()) % buckets


_as_list = as_list


@dataclass
class Vectorizer:
    """Builds the input matrix of a list of transforms."""

    transforms: tuple[Transform, ...]
    _index: list[dict[str, int]] = field(default_factory=list, init=False, repr=False)
    _buckets: dict[int, dict[str, int]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._index = [{v: n for n, v in enumerate(t.vocabulary)} for t in self.transforms]

    @property
    def columns(self) -> list[str]:
        return [c for t in self.transforms for c in t.columns]

    @property
    def width(self) -> int:
        return sum(t.width for t in self.transforms)

    def _bucketed(self, ids: Iterable[str], buckets: int) -> list[int]:
        """crc32 buckets of ids, cached (the same ids come back request after request)."""
        cache = self._buckets.get(buckets)
        if cache is None or len(cache) > 200_000:
            cache = self._buckets[buckets] = {}
        out = []
        for e in ids:
            b = cache.get(e)
            if b is None:
                b = cache[e] = item_bucket(e, buckets)
            out.append(b)
        return out

    def features(self) -> set[tuple[Entity, str]]:
        return {(t.entity, t.feature) for t in self.transforms if t.feature not in IDS}

    def matrix(
        self,
        users: Sequence[Mapping[str, Any]],
        items: Mapping[str, Sequence[Any]],
        item_ids: Sequence[str],
        user_ids: Sequence[str] = ("",),
    ) -> npt.NDArray[np.float32]:
        """One row per item. `users` holds one user (broadcast to every row) or
        one per row; `items` one column of values per item feature (a missing
        feature, or a missing value, takes the declared default)."""
        n = len(item_ids)
        rows = _Rows(users, items, item_ids, user_ids, len(users) == n and n != 1, n)
        out = np.zeros((n, self.width), dtype=np.float64)
        shared = _SharedUsers.of(rows)
        at = 0
        for t, index in zip(self.transforms, self._index, strict=True):
            if shared is not None and t.entity == "user" and t.kind in OWN_SIDE and t.feature not in IDS:
                part = np.zeros((len(shared.rows.users), t.width), dtype=np.float64)
                self._fill(t, index, part, shared.rows)
                out[:, at : at + t.width] = part[shared.inverse]
            else:
                self._fill(t, index, out[:, at : at + t.width], rows)
            at += t.width
        return out.astype(np.float32)

    def matrix_from_block(
        self, user: Mapping[str, Any], block: BlockView, user_id: str = ""
    ) -> npt.NDArray[np.float32]:
        """`matrix` for one user and the items of a block (recmesh/features/block.py):
        the same columns, bit for bit, with the item side read from the block's
        arrays: numbers, categorical and list features, and a user's match and
        share against an item attribute, without a Python step per item. Other
        item-side transforms read the block's values decoded."""
        n = block.rows
        rows = _Rows([user], _BlockColumns(block), block.entity_ids, [user_id], False, n)
        out = np.zeros((n, self.width), dtype=np.float64)
        at = 0
        for t, index in zip(self.transforms, self._index, strict=True):
            cols = out[:, at : at + t.width]
            if not _fill_from_block(t, index, cols, rows, block):
                self._fill(t, index, cols, rows)
            at += t.width
        return out.astype(np.float32)

    def _fill(self, t: Transform, index: dict[str, int], out: npt.NDArray[np.float64], rows: _Rows) -> None:
        """One transform's columns, by its kind's filler (_FILLERS)."""
        fill = _FILLERS.get(t.kind)
        if fill is None:  # validated at construction
            raise FailedPrecondition(f"unknown transform {t.kind!r}")
        one, v = rows.side(t.entity, t.feature, t.default)
        fill(self, t, index, out, rows, one, v)


@dataclass(frozen=True, slots=True)
class _Rows:
    """The values one `Vectorizer.matrix` call reads. A side that holds one
    value for every row (the user, when one user is broadcast) is worked out
    once, not per row: at serving every row is a candidate of the same user."""

    users: Sequence[Mapping[str, Any]]
    items: Mapping[str, Sequence[Any]]
    item_ids: Sequence[str]
    user_ids: Sequence[str]
    per_row: bool  # one user per row (else users[0] for every row)
    n: int

    def side(self, entity: Entity, name: str, default: Any) -> tuple[bool, Any]:
        """(one value for all rows?, the value or one per row)."""
        n = self.n
        if name == "item_id":
            return False, self.item_ids
        if name == "user_id":
            user_ids = self.user_ids
            return (False, user_ids) if len(user_ids) == n and n != 1 else (True, user_ids[0])
        if entity == "item":
            col = self.items.get(name)
            if col is None or len(col) != n:
                return True, default
            return False, [default if v is None else v for v in col]
        if self.per_row:
            return False, [u.get(name, default) for u in self.users]
        users = self.users
        return True, users[0].get(name, default) if users else default


# Kinds whose columns read their own side's value alone (not the other side's, nor ids)
OWN_SIDE = frozenset({"value", "log1p", "hash_bucket", "id_sequence", "one_hot", "distribution"})


@dataclass(frozen=True, slots=True)
class _SharedUsers:
    """Per-row users of which some rows hold the very same row (training's
    examples: an example and its sampled negatives read one user row): their
    user-side columns are worked out once a distinct row and copied to the
    rows that hold it (the same values: each row's columns depend on it alone)."""

    rows: _Rows  # the distinct user rows, one each
    inverse: npt.NDArray[np.intp]  # row -> its user row's place in `rows.users`

    @staticmethod
    def of(rows: _Rows) -> _SharedUsers | None:
        if not rows.per_row:
            return None
        place: dict[int, int] = {}
        distinct: list[Mapping[str, Any]] = []
        inverse = []
        for u in rows.users:
            at = place.setdefault(id(u), len(place))
            if at == len(distinct):
                distinct.append(u)
            inverse.append(at)
        if len(distinct) > rows.n // 2:
            return None
        return _SharedUsers(_Rows(distinct, {}, [], [], True, len(distinct)), np.asarray(inverse, np.intp))


class _BlockColumns(Mapping[str, Sequence[Any]]):
    """A block's columns as the message form's (feature -> one value per item), decoded when read."""

    def __init__(self, block: BlockView) -> None:
        self._block = block
        self._decoded: dict[str, list[Any]] = {}

    def __getitem__(self, name: str) -> Sequence[Any]:
        got = self._decoded.get(name)
        if got is None:
            got = self._block.column(name)
            if got is None:
                raise KeyError(name)
            self._decoded[name] = got
        return got

    def __iter__(self) -> Iterator[str]:
        return self._block.names()

    def __len__(self) -> int:
        return sum(1 for _ in self._block.names())


def _fill_from_block(
    t: Transform, index: dict[str, int], out: npt.NDArray[np.float64], rows: _Rows, block: BlockView
) -> bool:
    """`t`'s columns from the block's arrays, where its kind reads the item side
    as arrays (False: not one of those; `_fill` does it). Each branch gives what
    the kind's filler gives for the same values (the block tests compare them)."""
    if t.entity == "item" and t.feature not in IDS:
        if t.kind in ("value", "log1p"):
            x = block.number(t.feature)
            if x is None:
                return False
            out[:, 0] = np.log1p(np.maximum(x, 0.0)) if t.kind == "log1p" else x
            return True
        if t.kind == "one_hot":
            hits = _per_value(block, t.feature, lambda d: float(index.get(d, -1)))
            if hits is None:
                return False
            at, j = hits
            keep = j >= 0
            out[at[keep], j[keep].astype(np.intp)] = 1.0
            return True
        return False
    if t.entity == "user" and t.kind in ("match", "share") and t.of not in (None, *IDS):
        one, v = rows.side("user", t.feature, t.default)
        if not one:
            return False
        if t.kind == "match":
            mine = set(_as_list(v))
            hits = _per_value(block, t.of or "", lambda d: 1.0 if d in mine else 0.0)
            if hits is None:
                return False
            out[:, 0] = np.bincount(hits[0], weights=hits[1], minlength=rows.n) > 0
            return True
        total = sum(v.values()) if isinstance(v, dict) else 0
        hits = _per_value(block, t.of or "", lambda d: float(v.get(d, 0)) if total else 0.0)
        if hits is None:
            return False
        if total:
            out[:, 0] = np.bincount(hits[0], weights=hits[1], minlength=rows.n) / total
        return True
    return False


def _per_value(
    block: BlockView, name: str, of: Callable[[str], float]
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]] | None:
    """For a categorical or list column of the block: each entry's row, and `of`
    its value, worked out once per distinct value (None: no such column)."""
    coded = block.coded(name)
    if coded is not None:
        codes, dictionary = coded
        return np.arange(block.rows), np.array([of(d) for d in dictionary], dtype=np.float64)[codes]
    lst = block.lists.get(name)
    if lst is None or lst.counts is not None:
        return None
    table = np.array([of(d) for d in lst.dictionary], dtype=np.float64)
    return lst.rows, table[lst.codes]


def _other(t: Transform) -> Entity:
    """The side a cross transform (share, contains, match) reads besides its own."""
    return "item" if t.entity == "user" else "user"


# A filler writes one transform's columns into `out` (rows x the transform's
# width, zeros); `one`, `v`: the transform's own side as _Rows.side gives it.
Filler = Callable[[Vectorizer, Transform, dict[str, int], npt.NDArray[np.float64], _Rows, bool, Any], None]


def _fill_number(
    vec: Vectorizer, t: Transform, index: dict[str, int], out: npt.NDArray[np.float64], rows: _Rows,
    one: bool, v: Any,
) -> None:  # fmt: skip
    """value and log1p: the number (None: 0), log1p of it at least 0."""
    x = np.asarray(float(v) if v is not None else 0.0) if one else np.asarray(
        [float(e) if e is not None else 0.0 for e in v], dtype=np.float64
    )  # fmt: skip
    out[:, 0] = np.log1p(np.maximum(x, 0.0)) if t.kind == "log1p" else x


def _fill_hash_bucket(
    vec: Vectorizer, t: Transform, index: dict[str, int], out: npt.NDArray[np.float64], rows: _Rows,
    one: bool, v: Any,
) -> None:  # fmt: skip
    out[:, 0] = vec._bucketed([str(v)], t.buckets) * rows.n if one else vec._bucketed(map(str, v), t.buckets)


def _fill_id_sequence(
    vec: Vectorizer, t: Transform, index: dict[str, int], out: npt.NDArray[np.float64], rows: _Rows,
    one: bool, v: Any,
) -> None:  # fmt: skip
    """The first t.length ids' buckets, -1 past the end of the list."""
    out[:] = -1.0
    for r, ids in enumerate([v] if one else v):
        row = vec._bucketed(_as_list(ids)[: t.length], t.buckets)
        if row:
            if one:
                out[:, : len(row)] = row
            else:
                out[r, : len(row)] = row


def _fill_one_hot(
    vec: Vectorizer, t: Transform, index: dict[str, int], out: npt.NDArray[np.float64], rows: _Rows,
    one: bool, v: Any,
) -> None:  # fmt: skip
    if one:
        for token in _as_list(v):
            j = index.get(token)
            if j is not None:
                out[:, j] = 1.0
        return
    hit_rows, cols = [], []
    for r, e in enumerate(v):
        for token in (e,) if isinstance(e, str) else _as_list(e):
            j = index.get(token)
            if j is not None:
                hit_rows.append(r)
                cols.append(j)
    out[hit_rows, cols] = 1.0


def _fill_distribution(
    vec: Vectorizer, t: Transform, index: dict[str, int], out: npt.NDArray[np.float64], rows: _Rows,
    one: bool, v: Any,
) -> None:  # fmt: skip
    """A count_by map's shares over the whole map, one column per vocabulary value."""
    for r, m in enumerate([v] if one else v):
        total = sum(m.values()) if isinstance(m, dict) else 0
        if total:
            for key, c in m.items():
                j = index.get(key)
                if j is not None:
                    if one:
                        out[:, j] = c / total
                    else:
                        out[r, j] = c / total


def _fill_share(
    vec: Vectorizer, t: Transform, index: dict[str, int], out: npt.NDArray[np.float64], rows: _Rows,
    one: bool, v: Any,
) -> None:  # fmt: skip
    """A count_by map's count of the other side's `of` value(s), over its total."""
    one_attr, attrs = rows.side(_other(t), t.of or "", t.of_default)
    if one and isinstance(v, dict):
        total = sum(v.values())
        if not total:
            return
        if one_attr:
            out[:, 0] = sum(v.get(x, 0) for x in _as_list(attrs)) / total
            return
        get = v.get
        out[:, 0] = [
            (get(a, 0) if isinstance(a, str) else sum(get(x, 0) for x in _as_list(a))) / total for a in attrs
        ]
        return
    maps = [v] * rows.n if one else v
    attrs = [attrs] * rows.n if one_attr else attrs
    for r, (m, a) in enumerate(zip(maps, attrs, strict=True)):
        total = sum(m.values()) if isinstance(m, dict) else 0
        if total:
            out[r, 0] = sum(m.get(x, 0) for x in _as_list(a)) / total


def _fill_contains(
    vec: Vectorizer, t: Transform, index: dict[str, int], out: npt.NDArray[np.float64], rows: _Rows,
    one: bool, v: Any,
) -> None:  # fmt: skip
    """1 where the list holds the other side's id."""
    one_id, ids = rows.side(_other(t), t.of or "item_id", "")
    if one:
        held = set(v or ())
        out[:, 0] = (1.0 if ids in held else 0.0) if one_id else [1.0 if i in held else 0.0 for i in ids]
        return
    ids = [ids] * rows.n if one_id else ids
    out[:, 0] = [1.0 if i in (lst or ()) else 0.0 for lst, i in zip(v, ids, strict=True)]


def _fill_match(
    vec: Vectorizer, t: Transform, index: dict[str, int], out: npt.NDArray[np.float64], rows: _Rows,
    one: bool, v: Any,
) -> None:  # fmt: skip
    """1 where the user's values and the other side's `of` values share one."""
    one_theirs, theirs = rows.side(_other(t), t.of or "", t.of_default)
    if one:
        mine = set(_as_list(v))
        if one_theirs:
            out[:, 0] = 1.0 if mine & set(_as_list(theirs)) else 0.0
            return
        out[:, 0] = [
            (1.0 if b in mine else 0.0) if isinstance(b, str) else (1.0 if mine & set(_as_list(b)) else 0.0)
            for b in theirs
        ]
        return
    theirs = [theirs] * rows.n if one_theirs else theirs
    out[:, 0] = [1.0 if set(_as_list(a)) & set(_as_list(b)) else 0.0 for a, b in zip(v, theirs, strict=True)]


# Transform kind -> the function that fills its columns (every kind of KINDS).
_FILLERS: dict[str, Filler] = {
    "value": _fill_number,
    "log1p": _fill_number,
    "hash_bucket": _fill_hash_bucket,
    "id_sequence": _fill_id_sequence,
    "one_hot": _fill_one_hot,
    "distribution": _fill_distribution,
    "share": _fill_share,
    "contains": _fill_contains,
    "match": _fill_match,
}
assert set(_FILLERS) == set(KINDS)


# --- the default inputs of a recmesh-trained model -------------------------------------

MAX_VOCABULARY = 64
# Positions of a recent-items history the family reads.
MAX_HISTORY = 20
ITEM_BUCKETS = 4096


# Values of a numeric feature kept to judge its skew (InputStats): every one up
# to this many, a uniform sample of them past it (its median from the sample).
SKEW_SAMPLE = 262_144


class _Numbers:
    """A numeric feature's values as `_skewed` reads them, in bounded memory."""

    def __init__(self, seed: int) -> None:
        self.kept: list[float] = []
        self.seen = 0
        self.lowest = math.inf
        self.highest = -math.inf
        self._rng = random.Random(seed)

    def add(self, v: Any) -> None:
        if not isinstance(v, int | float) or isinstance(v, bool):
            return
        x = float(v)
        self.seen += 1
        self.lowest, self.highest = min(self.lowest, x), max(self.highest, x)
        if len(self.kept) < SKEW_SAMPLE:
            self.kept.append(x)
        else:  # reservoir sampling: each value kept with probability SKEW_SAMPLE / seen
            n = self._rng.randrange(self.seen)
            if n < SKEW_SAMPLE:
                self.kept[n] = x

    def skewed(self) -> bool:
        if not self.seen or self.lowest < 0:
            return False
        kept = sorted(self.kept)
        return self.highest > 10 * (kept[len(kept) // 2] + 1)


class InputStats:
    """What `plan_inputs` learns from training rows, gathered a row at a time
    (bounded memory: counts per value, a sample of each numeric feature), so
    the rows themselves need not be held."""

    def __init__(self, feature_set: FeatureSet) -> None:
        self.feature_set = feature_set
        offline = feature_set.features_of("item", "offline")
        offline_texts = [f.name for f in offline if f.dtype in ("str", "strings")]
        self.item_attr = feature_set.roles.category or next(iter(offline_texts), None)
        self.counts: dict[str, Counter[str]] = {f.name: Counter() for f in feature_set.features}
        self.maps: dict[str, Counter[str]] = {f.name: Counter() for f in feature_set.features}
        self.numbers = {f.name: _Numbers(n) for n, f in enumerate(feature_set.features)}
        specs = [(f.entity, (f.name, f.default, self._kind(f))) for f in feature_set.features]
        self.user_specs = [s for entity, s in specs if entity == "user"]
        self.item_specs = [s for entity, s in specs if entity == "item"]

    @staticmethod
    def _kind(f: FeatureDef) -> str:
        if f.kind == "realtime":
            if f.aggregate in ("sum", "mean"):
                return "number"
            return "map" if f.aggregate == "count_by" else "none"
        return "number" if f.dtype in ("int", "float") else "values"

    def add(self, user: Mapping[str, Any], item: Mapping[str, Any]) -> None:
        """One training row: its user's and its item's features."""
        self.add_row(user, self.user_specs)
        self.add_row(item, self.item_specs)

    def add_row(self, row: Mapping[str, Any], specs: Sequence[tuple[str, Any, str]]) -> None:
        for name, default, kind in specs:
            v = row.get(name, default)
            if kind == "number":
                self.numbers[name].add(v)
            elif kind == "values":
                self.counts[name].update(_as_list(v))
            elif kind == "map" and isinstance(v, dict):
                self.maps[name].update({k: int(c) for k, c in v.items()})

    def vocabulary(self, name: str, cap: int = MAX_VOCABULARY) -> tuple[str, ...]:
        counts = self.counts[name]
        return tuple(v for v, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:cap])

    def map_vocabulary(self, name: str, cap: int = MAX_VOCABULARY) -> tuple[str, ...]:
        counts = self.maps[name]
        return tuple(v for v, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:cap])


def plan_inputs(
    feature_set: FeatureSet, users: Sequence[Mapping[str, Any]], items: Sequence[Mapping[str, Any]]
) -> tuple[Transform, ...]:
    """The inputs recmesh's model family reads, learned from training rows
    (`users[i]`, `items[i]`: the features of row i): every declared feature
    turned into columns by its type, vocabularies from the rows."""
    stats = InputStats(feature_set)
    for u in users:
        stats.add_row(u, stats.user_specs)
    for it in items:
        stats.add_row(it, stats.item_specs)
    return plan_from(stats)


def plan_from(stats: InputStats) -> tuple[Transform, ...]:
    """`plan_inputs` from the statistics of the rows (InputStats)."""
    feature_set = stats.feature_set
    roles = feature_set.roles
    out: list[Transform] = []
    item_attr = stats.item_attr
    attr_vocab: tuple[str, ...] = ()
    if item_attr is not None:
        attr_vocab = stats.vocabulary(item_attr)
    for f in feature_set.features:
        prefix = f"{f.entity[0]}_{f.name}"
        if f.kind == "realtime":
            out += _realtime_inputs(feature_set, f, stats, prefix, item_attr, attr_vocab)
            continue
        if f.dtype in ("int", "float"):
            kind = "log1p" if stats.numbers[f.name].skewed() else "value"
            out.append(Transform(kind, f.name, f.entity, prefix, default=f.default))
        elif f.entity == "item" and f.name == item_attr:
            out.append(Transform("one_hot", f.name, "item", prefix, vocabulary=attr_vocab, default=f.default,
                                 role="item_attr"))  # fmt: skip
        elif f.entity == "user" and f.name == roles.interests and roles.category is not None:
            out.append(
                Transform("match", f.name, "user", f"{prefix}_match", of=roles.category, default=f.default,
                          of_default=feature_set.by_name[roles.category].default)
            )  # fmt: skip
        else:
            vocab = stats.vocabulary(f.name, 16 if f.entity == "user" else MAX_VOCABULARY)
            out.append(Transform("one_hot", f.name, f.entity, prefix, vocabulary=vocab, default=f.default))
    out.append(
        Transform("hash_bucket", "item_id", "item", "i_id_bucket", buckets=ITEM_BUCKETS, role="item_id")
    )
    return tuple(out)


def _realtime_inputs(
    feature_set: FeatureSet, f: FeatureDef, stats: InputStats, prefix: str, item_attr: str | None,
    attr_vocab: tuple[str, ...],
) -> list[Transform]:  # fmt: skip
    """A real-time feature's inputs, by its aggregate (`stats`: the training rows')."""
    out: list[Transform] = []
    if f.aggregate == "count":
        out.append(Transform("log1p", f.name, f.entity, prefix, default=f.default))
    elif f.aggregate in ("sum", "mean"):
        kind = "log1p" if stats.numbers[f.name].skewed() else "value"
        out.append(Transform(kind, f.name, f.entity, prefix, default=f.default))
    elif f.aggregate == "last_n":
        of = "item_id" if f.entity == "user" else "user_id"
        out.append(Transform("contains", f.name, f.entity, f"{prefix}_has", of=of, default=f.default))
        if f.entity == "user":  # the user's recent items, for the family's history embedding
            length = min(f.n, MAX_HISTORY)
            out.append(Transform("id_sequence", f.name, "user", f"{prefix}_ids", buckets=ITEM_BUCKETS,
                                 length=length, default=f.default, role="history"))  # fmt: skip
    elif f.aggregate == "count_by" and f.by is not None:
        other_default = feature_set.by_name[f.by].default
        out.append(
            Transform("share", f.name, f.entity, f"{prefix}_share", of=f.by, default=f.default,
                      of_default=other_default)
        )  # fmt: skip
        if f.entity == "user" and f.by == item_attr and f.name == (feature_set.roles.affinity or f.name):
            vocab = attr_vocab or stats.map_vocabulary(f.name)
            out.append(Transform("distribution", f.name, "user", f"{prefix}_dist", vocabulary=vocab,
                                 default=f.default, role="intent"))  # fmt: skip
    return out


def transforms_from_card(raw: Sequence[Mapping[str, Any]]) -> tuple[Transform, ...]:
    return tuple(Transform.from_json(t) for t in raw)


def check_against(transforms: Sequence[Transform], feature_set: FeatureSet) -> list[str]:
    """What in a model's declared inputs the feature set cannot serve (empty: all good)."""
    problems: list[str] = []
    for n, t in enumerate(transforms):
        where = f"inputs[{n}] ({t.name or t.kind})"
        if t.feature not in IDS:
            f = feature_set.by_name.get(t.feature)
            if f is None:
                problems.append(f"{where}: feature {t.feature!r} is not declared in the repository")
                continue
            problems.extend(_feature_problems(t, f, where))
        elif t.kind != "hash_bucket":
            problems.append(f"{where}: {t.kind} cannot read {t.feature}")
        problems.extend(_shape_problems(t, feature_set, where))
    return problems


def _feature_problems(t: Transform, f: FeatureDef, where: str) -> list[str]:
    """Whether the declared feature `f` that `t` reads has the entity and type `t` needs."""
    problems = []
    if f.entity != t.entity:
        problems.append(f"{where}: {t.feature!r} is a {f.entity} feature, not a {t.entity} feature")
    numeric = f.dtype in ("int", "float")
    if t.kind in ("value", "log1p") and not numeric:
        problems.append(f"{where}: {t.kind} needs a number; {t.feature!r} is {f.dtype}")
    if t.kind in ("share", "distribution") and f.dtype != "counts":
        problems.append(f"{where}: {t.kind} needs a count_by feature; {t.feature!r} is {f.dtype}")
    if t.kind in ("contains", "id_sequence") and f.dtype != "strings":
        problems.append(f"{where}: {t.kind} needs a list feature; {t.feature!r} is {f.dtype}")
    if t.kind == "one_hot" and f.dtype not in ("str", "strings"):
        problems.append(f"{where}: one_hot needs a categorical feature; {t.feature!r} is {f.dtype}")
    return problems


def _shape_problems(t: Transform, feature_set: FeatureSet, where: str) -> list[str]:
    """Whether `t`'s own settings (`of`, buckets, length, vocabulary) are complete."""
    problems = []
    if t.kind in ("share", "match") and t.of not in feature_set.by_name:
        problems.append(f"{where}: `of` {t.of!r} is not a declared feature")
    if t.kind in ("hash_bucket", "id_sequence") and t.buckets <= 0:
        problems.append(f"{where}: {t.kind} needs buckets > 0")
    if t.kind == "id_sequence" and t.length <= 0:
        problems.append(f"{where}: id_sequence needs length > 0")
    if t.kind in ("one_hot", "distribution") and not t.vocabulary:
        problems.append(f"{where}: {t.kind} needs a vocabulary")
    return problems
