"""`recmesh bench recall`: what a learnt source's look-up costs in the ranker, and its memory.

Times `top` (50 seeds, 200 items, the seeds excluded: what a learnt recall
source does per request in services/ranker/learnt.py) for each source of the
current recall version under MODEL_DIR when there is one, and for random
sources of `--items` items: a neighbour table of `--neighbours` entries per row
(item-kNN and EASE serve this way) and a sequence model of 64 dimensions. Each
figure is the median of `--repeat` blocks of `--lookups` look-ups, the kinds
alternated block by block; the bytes are what the ranker holds per source.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from recmesh.retrieval import files, sequence
from recmesh.retrieval.sequence import SequenceModel
from recmesh.retrieval.table import NeighbourTable, RecallTable, recency_weights
from recmesh.stats import percentile
from recmesh.tools.bench.common import emit

SEEDS = 50
K = 200


def random_table(items: int, neighbours: int, seed: int = 0) -> NeighbourTable:
    rng = np.random.default_rng(seed)
    keep = min(neighbours, items - 1)
    indices = rng.integers(0, items, size=(items, keep)).astype(np.int32)
    weights = np.sort(rng.random((items, keep)).astype(np.float32), axis=1)[:, ::-1].copy()
    indptr = np.arange(items + 1, dtype=np.int64) * keep
    return NeighbourTable([str(i) for i in range(items)], indptr, indices.ravel(), weights.ravel())


def random_sequence_model(items: int, seed: int = 0) -> SequenceModel:
    rng = np.random.default_rng(seed)
    return SequenceModel(
        [str(i) for i in range(items)],
        rng.standard_normal((items, sequence.DIM)).astype(np.float32),
        rng.standard_normal((items, sequence.DIM)).astype(np.float32),
        np.zeros(items, np.float32),
        (0.8 ** np.arange(sequence.LENGTH)).astype(np.float32),
    )


def _time(sources: dict[str, RecallTable], lookups: int, repeat: int) -> dict[str, list[float]]:
    rng = np.random.default_rng(1)
    seeds = {name: [t.item_ids[int(i)] for i in rng.choice(len(t), min(SEEDS, len(t)), replace=False)]
             for name, t in sources.items()}  # fmt: skip
    weights = recency_weights(SEEDS, 0.8)
    blocks: dict[str, list[float]] = {name: [] for name in sources}
    for name, table in sources.items():  # warm up
        table.top(seeds[name], weights[: len(seeds[name])], K, frozenset(seeds[name]))
    for _ in range(repeat):
        for name, table in sources.items():
            s, w, ex = seeds[name], weights[: len(seeds[name])], frozenset(seeds[name])
            t0 = time.perf_counter()
            for _ in range(lookups):
                table.top(s, w, K, ex)
            blocks[name].append((time.perf_counter() - t0) / lookups * 1e6)
    return blocks


def run(model_dir: Path | None, items: int, neighbours: int, lookups: int, repeat: int) -> dict[str, Any]:
    sources: dict[str, RecallTable] = {}
    version = None
    if model_dir is not None:
        current = files.current_version(model_dir)
        if current is not None:
            card = files.read_card(model_dir, current)
            loaded = files.load_current(model_dir, str(card.get("feature_set_version")))
            if loaded is not None:
                version = loaded.version
                sources |= {f"{version}/{n}": t for n, t in loaded.tables.items()}
    sources[f"random table, {items:,} items x {neighbours}"] = random_table(items, neighbours)
    sources[f"random sequence model, {items:,} items x {sequence.DIM}-d"] = random_sequence_model(items)
    blocks = _time(sources, lookups, repeat)
    rows = [
        {"source": name, "items": len(t), "bytes": t.nbytes,
         "lookup_us_p50": round(percentile(blocks[name], 50), 1),
         "lookup_us_blocks": [round(b, 1) for b in blocks[name]]}
        for name, t in sources.items()
    ]  # fmt: skip
    return {"version": version, "seeds": SEEDS, "k": K, "rows": rows}


def table(f: dict[str, Any]) -> str:
    lines = [f"a learnt source's look-up ({f['seeds']} seeds, {f['k']} items, seeds excluded), one process",
             f"  {'source':<52} {'items':>9} {'MB':>8} {'µs p50':>8}"]  # fmt: skip
    for r in f["rows"]:
        lines.append(f"  {r['source']:<52} {r['items']:>9,} {r['bytes'] / 1e6:>8.1f} {r['lookup_us_p50']:>8}")
    return "\n".join(lines)


def main(args: Any) -> int:
    model_dir = Path(args.model_dir) if args.model_dir else None
    figures = run(model_dir, args.items, args.neighbours, args.lookups, args.repeat)
    emit(figures, args.json, table(figures))
    return 0
