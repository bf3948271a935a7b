"""The catalog's files, for the tools: load them into Redis as the repository
maps them (`catalog load`, `init`, `recmesh up`), with progress on long files."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from recmesh.features.repository import Entity, FeatureSet


def progress_bar(
    say: Callable[[str], None], label: str, total: int | None, unit: str = ""
) -> Callable[[int], None]:
    """A progress line at every tenth of `total` (or every 100,000 without one),
    with the rate so far and, given a total, the time left at that rate."""
    shown = [-1]
    started = time.perf_counter()
    per = f" {unit}" if unit else ""

    def rate(done: int) -> tuple[str, float]:
        per_s = done / max(1e-9, time.perf_counter() - started)
        return f"{per_s:,.0f}{per}/s", per_s

    def update(done: int) -> None:
        if total:
            tenth = min(10, done * 10 // total)
            if tenth != shown[0]:
                shown[0] = tenth
                speed, per_s = rate(done)
                left = f", ~{(total - done) / per_s:,.0f} s left" if 0 < done < total and per_s else ""
                say(f"  {label} [{'#' * tenth}{'.' * (10 - tenth)}] {done:,}/{total:,}{per} ({speed}{left})")
        elif done // 100_000 != shown[0]:
            shown[0] = done // 100_000
            say(f"  {label} {done:,}{per} ({rate(done)[0]})")

    return update


def count_records(path: Path) -> int | None:
    """Records in a file without parsing them (None when it cannot tell cheaply)."""
    if path.suffix.lower() == ".parquet":
        try:
            import pyarrow.parquet as pq  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            return None
        return int(pq.ParquetFile(path).metadata.num_rows)
    with path.open("rb") as fh:
        lines = sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    header = 0 if path.suffix.lower() in (".jsonl", ".ndjson", ".json") else 1
    return max(0, lines - header)


async def load_catalog_files(
    feature_set: FeatureSet,
    redis_url: str,
    users: Path | None,
    items: Path | None,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Users and items into Redis, as the repository maps them (what `catalog load` and `init` do)."""
    from recmesh.features.tabular import Fallbacks, read_entities
    from recmesh.redis_client import connect
    from services.feature.catalog import load_catalog

    sources: dict[Entity, Path | None] = {
        "user": users or feature_set.entity_source("user"),
        "item": items or feature_set.entity_source("item"),
    }
    totals = {e: (count_records(p) if p is not None and p.exists() else None) for e, p in sources.items()}
    bars = {e: progress_bar(say, f"{e}s", totals[e]) for e in sources}

    fallbacks = Fallbacks()

    def rows(entity: Entity) -> Iterator[tuple[str, dict[str, Any]]]:
        path = sources[entity]
        if path is None:
            say(f"  no {entity}s source declared: none loaded")
            return iter(())
        return read_entities(feature_set, entity, path, fallbacks)

    client = connect(redis_url, 4)
    try:
        figures = await load_catalog(
            client, feature_set, rows("user"), rows("item"), progress=lambda e, n: bars[e](n)
        )
    finally:
        await client.aclose()
    if fallbacks.count:
        say(f'  {fallbacks.count} cells could not be read and took their default (invalid = "default"):')
        for where in fallbacks.first:
            say(f"    {where}")
    return {
        **figures.to_json(), "cells_defaulted": fallbacks.count,
        "users_source": str(sources["user"]), "items_source": str(sources["item"]),
    }  # fmt: skip
