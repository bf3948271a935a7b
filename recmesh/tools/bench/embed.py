"""`recmesh bench embed`: CPU sentence-embedding throughput at batch 1 vs batch N.

Texts are the demo catalog's item texts (realistic lengths). Batch 1 is the
baseline, measured in the same run; the ratio says what batching buys.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from recmesh.embedding.encoder import TextEncoder
from recmesh.modeldir import EMBEDDER_DIR
from recmesh.stats import percentile
from recmesh.tools.bench.common import emit
from recmesh.tools.embedding.export import export


def _texts(n: int) -> list[str]:
    from recmesh.tools.demo.generate import make_catalog
    from recmesh.tools.demo.texts import embedding_text, item_texts

    texts = [embedding_text(t, d) for t, d in item_texts(make_catalog()).values()]
    return [texts[i % len(texts)] for i in range(n)]


def measure(encoder: TextEncoder, texts: list[str], batch: int, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    done = tokens = 0
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()
    while time.perf_counter() < deadline and done < 100_000:
        chunk = [texts[(done + i) % len(texts)] for i in range(batch)]
        t0 = time.perf_counter()
        encoded = encoder.tokenize(chunk)
        encoder.run(encoded)
        latencies.append(time.perf_counter() - t0)
        done += batch
        tokens += encoded.tokens
    elapsed = time.perf_counter() - started
    return {
        "batch": batch,
        "texts_per_s": round(done / elapsed, 1),
        "tokens_per_s": round(tokens / elapsed, 1),
        "batch_p50_ms": round(percentile(latencies, 50) * 1000, 2),
        "batch_p99_ms": round(percentile(latencies, 99) * 1000, 2),
    }


def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="recmesh-bench-embed-") as tmp:
        model_dir = Path(args.model_dir) if args.model_dir else Path(tmp)
        if not (model_dir / EMBEDDER_DIR).exists():
            export(model_dir)
        encoder = TextEncoder.from_model_dir(model_dir, args.threads)
        texts = _texts(512)
        encoder.encode(texts[:8])  # warm-up: first run allocates arenas
        one = measure(encoder, texts, 1, args.seconds)
        many = measure(encoder, texts, args.batch, args.seconds)
    figures = {
        "model": encoder.model,
        "threads": args.threads,
        "batch_1": one,
        f"batch_{args.batch}": many,
        "batching_speedup": round(many["texts_per_s"] / one["texts_per_s"], 2),
    }
    table = "\n".join(
        [
            f"all-MiniLM-L6-v2 on CPU (ONNX Runtime, {args.threads} intra-op thread(s)), demo item texts",
            f"{'batch':>6} {'texts/s':>9} {'tokens/s':>10} {'p50 ms':>8} {'p99 ms':>8}",
            *(
                f"{r['batch']:>6} {r['texts_per_s']:>9} {r['tokens_per_s']:>10} "
                f"{r['batch_p50_ms']:>8} {r['batch_p99_ms']:>8}"
                for r in (one, many)
            ),
            f"batch {args.batch} vs batch 1: x{figures['batching_speedup']} texts/s",
        ]
    )
    emit(figures, args.json, table)
    return 0
