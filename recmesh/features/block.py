"""The candidates' item features as one packed block: the tensor form of a look-up.

A ranker asks the feature service for its candidates' features as an
`ItemBlock` (`GetFeaturesRequest.item_block`) and forwards it to inference as
it is; inference reads it with `numpy.frombuffer` and builds the model's input
from arrays (`Vectorizer.matrix_from_block`), with no per-feature message
built, parsed or re-encoded on the way. The per-feature message form
(`FeatureTable`, recmesh/features/wire.py) stays for `recmesh features get`,
`features compare`, the served-feature log and any caller that wants sources
and ages.

The layout (`ItemLayout`) is fixed by the feature set: every item feature in
declaration order, as

- a packed column of `values` (float64, row-major): numbers as they are, and a
  categorical feature's code into its dictionary (the distinct values this
  block uses);
- a `BlockList` for a list feature (multi, last_n) or a map (count_by):
  offsets per row and codes into the dictionary, and a map's counts.

Its name, "<feature_version>/items.v1", is carried by every block, and a
reader built for another feature set refuses it. Numbers travel as float64,
the values the message form carries, so both forms give bit-identical model
input (tests/unit/recmesh/features/test_block.py holds them to it).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from recmesh.errors import FailedPrecondition, InvalidArgument
from recmesh.features.repository import FeatureSet
from recmesh.v1 import features_pb2 as pb

ENCODING = "items.v1"
F8 = np.dtype("<f8")
I4 = np.dtype("<i4")


def layout_name(feature_version: str) -> str:
    return f"{feature_version}/{ENCODING}"


def as_list(v: Any) -> list[str]:
    """A list feature's values as strings; a lone value is a list of one, None and "" none."""
    if isinstance(v, list | tuple):
        return [str(x) for x in v]
    return [] if v is None or v == "" else [str(v)]


@dataclass(frozen=True)
class ItemLayout:
    """Where each item feature of a feature set goes in a block."""

    feature_version: str
    packed: tuple[str, ...]  # columns of `values`, in order
    coded: frozenset[str]  # of `packed`: categorical (their codes)
    lists: tuple[str, ...]  # list features (multi, last_n)
    maps: tuple[str, ...]  # count_by features

    @property
    def name(self) -> str:
        return layout_name(self.feature_version)

    @classmethod
    def of(cls, feature_set: FeatureSet) -> ItemLayout:
        packed, coded, lists, maps = [], [], [], []
        for f in feature_set.features_of("item"):
            if f.dtype in ("int", "float"):
                packed.append(f.name)
            elif f.dtype == "str":
                packed.append(f.name)
                coded.append(f.name)
            elif f.dtype == "strings":
                lists.append(f.name)
            else:
                maps.append(f.name)
        return cls(feature_set.version, tuple(packed), frozenset(coded), tuple(lists), tuple(maps))

    def encode(
        self,
        entity_ids: Sequence[str],
        columns: Mapping[str, Sequence[Any]],
        block: pb.ItemBlock | None = None,
    ) -> pb.ItemBlock:
        """The block of `columns` (feature -> one value per entity, every item
        feature of the layout), written into `block` (e.g. a response's own field)."""
        if block is None:
            block = pb.ItemBlock()
        n = len(entity_ids)
        block.layout = self.name
        block.entity_ids.extend(entity_ids)
        block.columns.extend(self.packed)
        values = np.empty((n, len(self.packed)), dtype=F8)
        for j, name in enumerate(self.packed):
            col = columns[name]
            if name in self.coded:
                dictionary, codes = _codes(col)
                block.dictionaries.add(column=name, values=dictionary)
                values[:, j] = codes
            else:
                values[:, j] = col
        block.values = values.tobytes()
        for name in self.lists:
            _add_list(block, name, columns[name], counted=False)
        for name in self.maps:
            _add_list(block, name, columns[name], counted=True)
        return block


def _codes(values: Sequence[Any]) -> tuple[list[str], list[int]]:
    """A categorical column as (its distinct values, each row's index among them)."""
    index: dict[str, int] = {}
    codes = [index.setdefault(str(v), len(index)) for v in values]
    return list(index), codes


def _add_list(block: pb.ItemBlock, name: str, values: Sequence[Any], counted: bool) -> None:
    index: dict[str, int] = {}
    offsets = [0]
    codes: list[int] = []
    counts: list[float] = []
    for v in values:
        if counted:
            entries = v.items() if isinstance(v, dict) else ()
            for key, c in entries:
                codes.append(index.setdefault(str(key), len(index)))
                counts.append(float(c))
        else:
            codes.extend(index.setdefault(x, len(index)) for x in as_list(v))
        offsets.append(len(codes))
    block.dictionaries.add(column=name, values=list(index))
    block.lists.add(
        column=name,
        offsets=np.asarray(offsets, dtype=I4).tobytes(),
        codes=np.asarray(codes, dtype=I4).tobytes(),
        counts=np.asarray(counts, dtype=F8).tobytes() if counted else b"",
    )


@dataclass(frozen=True)
class ListColumn:
    """A list or map feature of a block: row r's entries are codes[offsets[r]:offsets[r + 1]]."""

    offsets: npt.NDArray[np.int32]
    codes: npt.NDArray[np.int32]
    counts: npt.NDArray[np.float64] | None  # a map's counts, one per code
    dictionary: tuple[str, ...]

    @cached_property
    def rows(self) -> npt.NDArray[np.intp]:
        """The row of each entry."""
        return np.repeat(np.arange(len(self.offsets) - 1), np.diff(self.offsets))


class BlockView:
    """A received block as arrays, checked: what `Vectorizer.matrix_from_block` reads."""

    def __init__(self, block: pb.ItemBlock, feature_version: str) -> None:
        expected = layout_name(feature_version)
        if block.layout != expected:
            raise FailedPrecondition(
                f"item block layout {block.layout!r} is not this model's ({expected!r}): the features "
                "come from another feature-set version"
            )
        self.entity_ids = list(block.entity_ids)
        n = self.rows = len(self.entity_ids)
        width = len(block.columns)
        if len(block.values) != n * width * F8.itemsize:
            raise InvalidArgument(
                f"item block values hold {len(block.values)} bytes; {n} rows x {width} columns of "
                f"float64 need {n * width * F8.itemsize}"
            )
        self.values = np.frombuffer(block.values, dtype=F8).reshape(n, width)
        self._packed = {name: j for j, name in enumerate(block.columns)}
        self.dictionaries = {d.column: tuple(d.values) for d in block.dictionaries}
        self.lists: dict[str, ListColumn] = {}
        for lst in block.lists:
            self.lists[lst.column] = _list_column(lst, n, self.dictionaries.get(lst.column, ()))
        for name, j in self._packed.items():
            if name in self.dictionaries:
                codes = self.values[:, j]
                whole = bool((codes == np.floor(codes)).all())  # NaN is not whole either
                if n and (not whole or codes.min() < 0 or codes.max() >= len(self.dictionaries[name])):
                    raise InvalidArgument(f"item block column {name!r} has codes outside its dictionary")

    def number(self, name: str) -> npt.NDArray[np.float64] | None:
        """A numeric column (None: not in the block)."""
        j = self._packed.get(name)
        return None if j is None or name in self.dictionaries else self.values[:, j]

    def coded(self, name: str) -> tuple[npt.NDArray[np.intp], tuple[str, ...]] | None:
        """A categorical column: each row's code, and the values they stand for."""
        j = self._packed.get(name)
        if j is None or name not in self.dictionaries:
            return None
        return self.values[:, j].astype(np.intp), self.dictionaries[name]

    def column(self, name: str) -> list[Any] | None:
        """One feature's values per row, as the message form gives them (None: not in the block)."""
        lst = self.lists.get(name)
        if lst is not None:
            d, off, codes = lst.dictionary, lst.offsets.tolist(), lst.codes.tolist()
            if lst.counts is None:
                return [[d[c] for c in codes[a:b]] for a, b in itertools.pairwise(off)]
            counts = lst.counts.tolist()
            return [
                {d[c]: _count(x) for c, x in zip(codes[a:b], counts[a:b], strict=True)}
                for a, b in itertools.pairwise(off)
            ]
        got = self.coded(name)
        if got is not None:
            d = got[1]
            return [d[c] for c in got[0].tolist()]
        x = self.number(name)
        return None if x is None else x.tolist()

    def first(self, name: str) -> list[str] | None:
        """A categorical or list column's first value per row ("" for none)."""
        got = self.coded(name)
        if got is not None:
            d = got[1]
            return [d[c] for c in got[0].tolist()]
        lst = self.lists.get(name)
        if lst is None or lst.counts is not None:
            return None
        d, codes = lst.dictionary, lst.codes.tolist()
        return [d[codes[a]] if b > a else "" for a, b in itertools.pairwise(lst.offsets.tolist())]

    def names(self) -> Iterator[str]:
        yield from self._packed
        yield from self.lists


def _count(x: float) -> int | float:
    return int(x) if x.is_integer() else x


def _list_column(lst: pb.BlockList, rows: int, dictionary: tuple[str, ...]) -> ListColumn:
    name = lst.column
    if len(lst.offsets) != (rows + 1) * I4.itemsize:
        raise InvalidArgument(
            f"item block list {name!r}: offsets hold {len(lst.offsets)} bytes, not {rows + 1} int32"
        )
    offsets = np.frombuffer(lst.offsets, dtype=I4)
    codes = np.frombuffer(lst.codes, dtype=I4) if lst.codes else np.zeros(0, dtype=I4)
    if offsets[0] != 0 or offsets[-1] != len(codes) or (np.diff(offsets) < 0).any():
        raise InvalidArgument(
            f"item block list {name!r}: offsets do not run from 0 to its {len(codes)} codes"
        )
    if len(codes) and (codes.min() < 0 or codes.max() >= len(dictionary)):
        raise InvalidArgument(f"item block list {name!r} has codes outside its dictionary")
    counts = None
    if lst.counts:
        counts = np.frombuffer(lst.counts, dtype=F8)
        if len(counts) != len(codes):
            raise InvalidArgument(f"item block list {name!r}: {len(counts)} counts for {len(codes)} codes")
    return ListColumn(offsets, codes, counts, dictionary)


def first_values(block: pb.ItemBlock, name: str) -> list[str] | None:
    """A categorical or list column's first value per row ("" for none), e.g. the
    ranker's diversity cap; None when the block has no such column. The block is
    read as it says it was laid out (InvalidArgument when it is malformed)."""
    return BlockView(block, block.layout.removesuffix(f"/{ENCODING}")).first(name)
