"""Reading tabular files a team brings: catalogs (users, items) and event logs.

CSV or TSV (a header row; a tab-separated file is detected from its first
line), Parquet (pyarrow installed) or JSON lines. Offline features are typed by
the repository (categorical, numeric, integer, multi); a bad value is an error
naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from recmesh.errors import InvalidArgument
from recmesh.features.repository import Entity, FeatureDef, FeatureSet, FeatureValue

Row = dict[str, Any]


def file_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return "parquet"
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    return "csv"


def read_rows(path: Path, delimiter: str | None = None) -> Iterator[tuple[int, Row]]:
    """(line number, row) for every record of a CSV/TSV, Parquet or JSON-lines file.

    Line numbers count the header as line 1 in text files and are record
    numbers (from 1) in Parquet."""
    if not path.exists():
        raise InvalidArgument(f"{path}: no such file")
    fmt = file_format(path)
    if fmt == "parquet":
        try:
            import pyarrow.parquet as pq  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            raise InvalidArgument(
                f"{path}: reading Parquet needs pyarrow installed (pip install pyarrow)"
            ) from None
        table = pq.ParquetFile(path)
        n = 0
        for batch in table.iter_batches(batch_size=10_000):
            for row in batch.to_pylist():
                n += 1
                yield n, row
        return
    if fmt == "jsonl":
        with path.open("rb") as fh:
            for n, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    row = orjson.loads(line)
                except orjson.JSONDecodeError as err:
                    raise InvalidArgument(f"{path}:{n}: not JSON: {err}") from None
                if not isinstance(row, dict):
                    raise InvalidArgument(f"{path}:{n}: a line must hold a JSON object")
                yield n, row
        return
    with path.open(newline="", encoding="utf-8", errors="replace") as fh:
        first = fh.readline()
        fh.seek(0)
        sep = delimiter or ("\t" if "\t" in first else ",")
        reader = csv.DictReader(fh, delimiter=sep)
        for row in reader:
            if None in row:  # more fields than the header names
                raise InvalidArgument(
                    f"{path}:{reader.line_num}: {len(row) - 1 + len(row[None])} fields, the header has "
                    f"{len(reader.fieldnames or [])}"
                )
            yield reader.line_num, row


def columns_of(path: Path, delimiter: str | None = None) -> list[str]:
    for _, row in read_rows(path, delimiter):
        return list(row)
    return []


def parse_value(f: FeatureDef, raw: Any) -> FeatureValue:
    """A cell as the feature's type; empty, absent or one of the feature's
    declared `missing` markers is the default. Raises ValueError."""
    if raw is None or (isinstance(raw, str) and (raw.strip() == "" or raw.strip() in f.missing)):
        return list(f.default) if isinstance(f.default, list) else f.default
    if f.dtype == "int":
        if isinstance(raw, str):
            raw = raw.strip()
            return int(raw) if raw.lstrip("-").isdigit() else _int_from_float(float(raw))
        return _int_from_float(float(raw))
    if f.dtype == "float":
        value = float(raw)
        if not math.isfinite(value):
            raise ValueError(f"{raw!r} is not a finite number")
        return value
    if f.dtype == "strings":
        parts = raw.split(f.separator) if isinstance(raw, str) else list(raw)
        return [str(p).strip() for p in parts if str(p).strip()]
    return str(raw).strip()


def _int_from_float(value: float) -> int:
    if not math.isfinite(value) or value != int(value):
        raise ValueError(f"{value!r} is not a whole number")
    return int(value)


@dataclass
class Fallbacks:
    """Cells of `invalid = "default"` columns that could not be read and took the default."""

    count: int = 0
    first: list[str] = field(default_factory=list)

    def note(self, where: str) -> None:
        self.count += 1
        if len(self.first) < 5:
            self.first.append(where)


def read_entities(
    feature_set: FeatureSet, entity: Entity, path: Path | None = None, fallbacks: Fallbacks | None = None
) -> Iterator[tuple[str, dict[str, FeatureValue]]]:
    """(id, offline features) for each row of the entity's file (the
    repository's `source`, or `path`), columns mapped and typed by the
    repository. A cell that cannot be read stops the read with an error naming
    file, line and column, unless its feature declares `invalid = "default"`:
    then it takes the default and is noted in `fallbacks`."""
    source = path or feature_set.entity_source(entity)
    if source is None:
        raise InvalidArgument(f"the repository declares no source for {entity}s; give the file")
    defs = feature_set.features_of(entity, "offline")
    id_col = feature_set.entity_id_column(entity)
    header_checked = False
    for n, row in read_rows(source, feature_set.entity_delimiter(entity)):
        if not header_checked:
            wanted = [id_col, *(f.column for f in defs)]
            missing = [c for c in wanted if c not in row]
            if missing:
                raise InvalidArgument(
                    f"{source}: no column {', '.join(map(repr, missing))} (its columns: "
                    f"{', '.join(map(str, row))}); the repository maps {entity}s from {wanted}"
                )
            header_checked = True
        raw_id = row.get(id_col)
        entity_id = "" if raw_id is None else str(raw_id).strip()
        if not entity_id:
            raise InvalidArgument(f"{source}:{n}: missing {id_col}")
        out: dict[str, FeatureValue] = {}
        for f in defs:
            try:
                out[f.name] = parse_value(f, row.get(f.column))
            except (ValueError, TypeError) as err:
                where = f"{source}:{n}: column {f.column!r} ({f.offline_type}): {err}"
                if not f.invalid_default:
                    raise InvalidArgument(
                        where + ' (declare invalid = "default" to take the default)'
                    ) from None
                out[f.name] = list(f.default) if isinstance(f.default, list) else f.default
                if fallbacks is not None:
                    fallbacks.note(where)
        yield entity_id, out


def write_csv(
    feature_set: FeatureSet, directory: Path, entity: Entity, rows: list[tuple[str, dict[str, Any]]]
) -> Path:
    """A catalog file the repository reads back (the demo writer)."""
    defs = feature_set.features_of(entity, "offline")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{entity}s.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow([feature_set.entity_id_column(entity), *(f.column for f in defs)])
        for eid, feats in rows:
            writer.writerow(
                [eid, *(f.separator.join(v) if isinstance(v := feats[f.name], list) else v for f in defs)]
            )
    return path


def read_texts(feature_set: FeatureSet, path: Path | None = None) -> dict[str, str]:
    """item id -> the text embedded for it: the repository's `items.texts`
    columns joined with '. ' (empty parts left out)."""
    decl = feature_set.decl.items.texts
    if decl is None:
        raise InvalidArgument("the repository declares no item texts ([items] texts = {columns = [...]})")
    source = path or (
        (feature_set.path.parent / decl.source).resolve()
        if decl.source and feature_set.path
        else feature_set.entity_source("item")
    )
    if source is None:
        raise InvalidArgument("the repository declares no source for item texts")
    id_col = feature_set.entity_id_column("item")
    out: dict[str, str] = {}
    for n, row in read_rows(source, feature_set.entity_delimiter("item")):
        missing = [c for c in (id_col, *decl.columns) if c not in row]
        if missing:
            raise InvalidArgument(f"{source}:{n}: no column {', '.join(map(repr, missing))}")
        parts = [str(row[c]).strip() for c in decl.columns if row.get(c) not in (None, "")]
        if parts:
            out[str(row[id_col]).strip()] = ". ".join(parts)
    return out


def read_catalog(
    feature_set: FeatureSet, users: str | None, items: str | None
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The offline tables the replay joins: the repository's sources, or the given files."""

    def table(entity: Entity, path: str | None) -> dict[str, dict[str, Any]]:
        source = Path(path) if path else feature_set.entity_source(entity)
        return dict(read_entities(feature_set, entity, source)) if source is not None else {}

    return table("user", users), table("item", items)
