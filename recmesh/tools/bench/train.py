"""`recmesh bench train`: what `recmesh train` costs per event, and its peak memory, as the log grows.

For each size it writes the generated shop's purchase log (recmesh demo
write-shop: one purchase a row, about 30 per shopper, 2,000 products; the
shape of examples/shop/purchases.toml: 4 negatives per example), imports it as
a canonical log, and runs `recmesh train --events LOG` in its own process with
a fresh state directory, sampling the resident memory of that process and its
children every 0.1 s. `--movielens LOG` adds MovieLens-100k's log (with
examples/movielens). It prints, per log: events, training rows, wall time and
time per event, peak memory, holdout AUC.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from recmesh.tools.bench.common import emit

SHOP_REPOSITORY = Path(__file__).resolve().parents[3] / "examples" / "shop" / "purchases.toml"
MOVIELENS_REPOSITORY = Path(__file__).resolve().parents[3] / "examples" / "movielens"
PURCHASES_PER_SHOPPER = 30  # about, in the generated shop


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def measure(repository: Path, log: Path, extra: list[str], say: Any) -> dict[str, Any]:
    """`recmesh train --events log` in its own process: wall time, peak RSS, its figures."""
    with tempfile.TemporaryDirectory(prefix="recmesh-bench-train-") as tmp:
        env = {**os.environ, "RECMESH_REPOSITORY": str(repository), "RECMESH_STATE_DIR": f"{tmp}/state"}
        cmd = [sys.executable, "-m", "recmesh.tools.cli.main", "train", "--events", str(log),
               "--model-dir", f"{tmp}/models", "--json", *extra]  # fmt: skip
        started = time.perf_counter()
        child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        peak = [0]
        watched = psutil.Process(child.pid)

        def sample() -> None:
            while child.poll() is None:
                peak[0] = max(peak[0], _tree_rss(watched))
                time.sleep(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        out, err = child.communicate()
        wall = time.perf_counter() - started
        sampler.join()
    if child.returncode != 0:
        raise RuntimeError(f"recmesh train failed ({child.returncode}): {err[-2000:]}")
    figures = json.loads(out.strip().splitlines()[-1])
    with log.open("rb") as fh:
        events = sum(1 for _ in fh)
    rows = int(figures.get("rows") or 0)
    say(f"  {log.name}: {events:,} events, {wall:,.1f} s, peak {peak[0] / 2**30:.2f} GiB")
    return {
        "log": str(log),
        "events": events,
        "rows": rows,
        "wall_s": round(wall, 1),
        "ms_per_event": round(wall * 1000 / max(1, events), 3),
        "peak_rss_gib": round(peak[0] / 2**30, 3),
        "auc_holdout": figures.get("auc_holdout"),
    }


def shop_log(events: int, workdir: Path, seed: int = 7) -> Path:
    """The generated shop's purchase log of about `events` purchases, as a canonical log."""
    from recmesh.tools.demo.shop import write_shop

    data = workdir / f"shop-{events}"
    shoppers = max(50, events // PURCHASES_PER_SHOPPER)
    write_shop(data / "data", shoppers, 2000, 180, seed)
    repository = data / "purchases.toml"
    repository.write_text(SHOP_REPOSITORY.read_text())
    log = data / "purchases.jsonl"
    env = {**os.environ, "RECMESH_REPOSITORY": str(repository)}
    subprocess.run([sys.executable, "-m", "recmesh.tools.cli.main", "events", "import",
                    str(data / "data" / "purchases.csv"), "--to", "log", "--out", str(log)],
                   env=env, check=True, capture_output=True)  # fmt: skip
    return log


def run(sizes: list[int], movielens: Path | None, epochs: int, say: Any) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    extra = ["--epochs", str(epochs)]
    with tempfile.TemporaryDirectory(prefix="recmesh-bench-logs-") as tmp:
        for size in sizes:
            say(f"generating a shop log of about {size:,} purchases ...")
            log = shop_log(size, Path(tmp))
            figures = measure(log.parent / "purchases.toml", log, extra, say)
            rows.append({"world": "shop purchases", **figures})
            log.unlink()
    if movielens is not None:
        rows.append({"world": "movielens-100k", **measure(MOVIELENS_REPOSITORY, movielens, extra, say)})
    return {"epochs": epochs, "rows": rows}


def table(f: dict[str, Any]) -> str:
    lines = [f"recmesh train, {f['epochs']} epochs (peak: resident memory of the process and its children)",
             f"  {'world':<16} {'events':>10} {'rows':>11} {'wall s':>8} {'ms/event':>9} {'peak GiB':>9} "
             f"{'AUC':>7}"]  # fmt: skip
    for r in f["rows"]:
        lines.append(f"  {r['world']:<16} {r['events']:>10,} {r['rows']:>11,} {r['wall_s']:>8} "
                     f"{r['ms_per_event']:>9} {r['peak_rss_gib']:>9} {r['auc_holdout']!s:>7}")  # fmt: skip
    return "\n".join(lines)


def main(args: Any) -> int:
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else print
    sizes = [int(s) for s in args.sizes]
    figures = run(sizes, Path(args.movielens) if args.movielens else None, args.epochs, say)
    emit(figures, args.json, table(figures))
    return 0
