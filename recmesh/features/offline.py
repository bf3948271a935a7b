"""Offline/static features: read from CSV (or Parquet, when pyarrow is
installed) and typed by the registry, for `recmesh features load-offline`.

A directory holds `users.csv` (user_id + user offline features) and
`items.csv` (item_id + item offline features). List values (`interest_tags`)
are ';'-separated in CSV.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from recmesh.errors import InvalidArgument
from recmesh.features.definitions import FeatureDef, FeatureValue, features_of


def _parse(f: FeatureDef, raw: Any) -> FeatureValue:
    if raw is None or raw == "":
        return f.default
    if f.dtype == "int":
        return int(raw)
    if f.dtype == "float":
        return float(raw)
    if f.dtype == "strings":
        return [s for s in (raw.split(";") if isinstance(raw, str) else list(raw)) if s]
    return str(raw)


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            raise InvalidArgument(f"{path}: reading Parquet needs pyarrow installed") from None
        yield from pq.read_table(path).to_pylist()
        return
    with path.open(newline="") as fh:
        yield from csv.DictReader(fh)


def _find(directory: Path, stem: str) -> Path:
    for suffix in (".parquet", ".csv"):
        candidate = directory / f"{stem}{suffix}"
        if candidate.exists():
            return candidate
    raise InvalidArgument(f"{directory}: no {stem}.csv or {stem}.parquet")


def read_entities(directory: Path, entity: str) -> Iterator[tuple[str, dict[str, FeatureValue]]]:
    defs = features_of(entity, "offline")  # type: ignore[arg-type]
    key = f"{entity}_id"
    path = _find(directory, f"{entity}s")
    for n, row in enumerate(_rows(path), start=2):
        if not row.get(key):
            raise InvalidArgument(f"{path}:{n}: missing {key}")
        try:
            yield str(row[key]), {f.name: _parse(f, row.get(f.name)) for f in defs}
        except ValueError as err:
            raise InvalidArgument(f"{path}:{n}: {err}") from None


def write_csv(directory: Path, entity: str, rows: list[tuple[str, dict[str, Any]]]) -> Path:
    defs = features_of(entity, "offline")  # type: ignore[arg-type]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{entity}s.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow([f"{entity}_id", *(f.name for f in defs)])
        for eid, feats in rows:
            writer.writerow(
                [eid, *(";".join(v) if isinstance(v := feats[f.name], list) else v for f in defs)]
            )
    return path
