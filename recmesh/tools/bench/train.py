"""`recmesh bench train`: what `recmesh train` costs per event, and its peak memory, as the log grows.

For each size it writes the generated shop's purchase log (recmesh demo
write-shop: one purchase a row, about 30 per shopper, 2,000 products; the
shape of examples/shop/purchases.toml: 4 negatives per example), imports it as
a canonical log (kept in `--log-dir` and reused from there when given), and
runs `recmesh train --events LOG` in its own process with a fresh state
directory, sampling the memory of that process and its children every 0.1 s:
the sum of their proportional set sizes (a page shared by two of them, as a
forked child's inherited pages are, counts half in each), which for one
process is its resident memory. `--movielens LOG` adds MovieLens-100k's log
(with examples/movielens). `--engines` and `--jobs` train each log once per
configuration, `--repeat` runs them all again in the same order (alternated).
It prints, per run: events, training rows, wall time and time per event, peak
memory, holdout AUC.
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

from recmesh.errors import InvalidArgument
from recmesh.tools.bench.common import emit

SHOP_REPOSITORY = Path(__file__).resolve().parents[3] / "examples" / "shop" / "purchases.toml"
MOVIELENS_REPOSITORY = Path(__file__).resolve().parents[3] / "examples" / "movielens"
PURCHASES_PER_SHOPPER = 30  # about, in the generated shop over SHOP_DAYS
SHOP_DAYS = 180
SHOP_PRODUCTS = 2000


def _tree_memory(proc: psutil.Process) -> int:
    """The process's and its children's memory: their proportional set sizes
    summed where the system reports them (Linux), else their resident sizes."""
    total = 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            full = p.memory_full_info()
            total += getattr(full, "pss", full.rss)
    return total


def measure(
    repository: Path, log: Path, extra: list[str], say: Any, keep: Path | None = None
) -> dict[str, Any]:
    """`recmesh train --events log` in its own process: wall time, peak memory and the
    phase it was reached in (the last progress line before it), its figures; its
    progress lines, each with the seconds since the start, kept in `keep`."""
    with tempfile.TemporaryDirectory(prefix="recmesh-bench-train-") as tmp:
        env = {**os.environ, "RECMESH_REPOSITORY": str(repository), "RECMESH_STATE_DIR": f"{tmp}/state"}
        cmd = [sys.executable, "-m", "recmesh.tools.cli.main", "train", "--events", str(log),
               "--model-dir", f"{tmp}/models", "--json", *extra]  # fmt: skip
        started = time.perf_counter()
        child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        peak = [0]
        phase = ["start"]  # the newest progress line, and the one the peak was reached in
        at_peak = ["start"]
        errors: list[str] = []
        watched = psutil.Process(child.pid)

        def sample() -> None:
            while child.poll() is None:
                used = _tree_memory(watched)
                if used > peak[0]:
                    peak[0], at_peak[0] = used, phase[0]
                time.sleep(0.1)

        def follow() -> None:
            assert child.stderr is not None
            for line in child.stderr:
                errors.append(f"{time.perf_counter() - started:9.1f} s  {line}")
                if line.strip():
                    phase[0] = line.strip()[:120]

        threads = [threading.Thread(target=f, daemon=True) for f in (sample, follow)]
        for thread in threads:
            thread.start()
        out = child.stdout.read() if child.stdout is not None else ""
        child.wait()
        wall = time.perf_counter() - started
        for thread in threads:
            thread.join()
    if keep is not None:
        keep.write_text("".join(errors))
    if child.returncode != 0:
        raise RuntimeError(f"recmesh train failed ({child.returncode}): {''.join(errors)[-2000:]}")
    figures = json.loads(out.strip().splitlines()[-1])
    with log.open("rb") as fh:
        events = sum(1 for _ in fh)
    rows = int(figures.get("rows") or 0)
    say(
        f"  {log.name}: {events:,} events, {wall:,.1f} s, peak {peak[0] / 2**30:.2f} GiB during: {at_peak[0]}"
    )
    return {
        "log": str(log),
        "events": events,
        "rows": rows,
        "wall_s": round(wall, 1),
        "ms_per_event": round(wall * 1000 / max(1, events), 3),
        "peak_gib": round(peak[0] / 2**30, 3),
        "peak_during": at_peak[0],
        "auc_holdout": figures.get("auc_holdout"),
        "replay_s": figures.get("replay_seconds"),
        "rows_digest": figures.get("rows_digest"),
    }


def shop_log(events: int, workdir: Path, seed: int = 7, shoppers: int | None = None) -> Path:
    """The generated shop's purchase log of about `events` purchases, as a
    canonical log: by default one shopper per PURCHASES_PER_SHOPPER purchases
    over SHOP_DAYS days; with `shoppers`, that many over as many days as the
    purchases need (a log that grows in events, not in users)."""
    from recmesh.tools.demo.shop import write_shop

    data = workdir / log_name(events, shoppers)
    days = SHOP_DAYS
    if shoppers is None:
        shoppers = max(50, events // PURCHASES_PER_SHOPPER)
    else:
        days = shop_days(events, shoppers)
    write_shop(data / "data", shoppers, SHOP_PRODUCTS, days, seed)
    repository = data / "purchases.toml"
    repository.write_text(SHOP_REPOSITORY.read_text())
    log = data / "purchases.jsonl"
    env = {**os.environ, "RECMESH_REPOSITORY": str(repository)}
    subprocess.run([sys.executable, "-m", "recmesh.tools.cli.main", "events", "import",
                    str(data / "data" / "purchases.csv"), "--to", "log", "--out", str(log)],
                   env=env, check=True, capture_output=True)  # fmt: skip
    return log


def shop_days(events: int, shoppers: int) -> int:
    """The days over which `shoppers` make about `events` purchases in the
    generated shop: each starts within the first 60 % of the days and visits
    every VISIT_DAYS on average, 2 purchases a visit, never a product twice."""
    from recmesh.tools.demo.shop import VISIT_DAYS

    each = events / shoppers
    if not 2 <= each <= SHOP_PRODUCTS / 4:
        raise InvalidArgument(
            f"{events:,} purchases by {shoppers:,} shoppers: the generated shop makes 2 to "
            f"{SHOP_PRODUCTS // 4} purchases a shopper (one visit at least; never a product twice "
            f"of {SHOP_PRODUCTS:,})"
        )
    return max(1, round((each / 2 - 1) * VISIT_DAYS / 0.7))


def log_name(events: int, shoppers: int | None) -> str:
    return f"shop-{events}" if shoppers is None else f"shop-{events}-{shoppers}-shoppers"


def engine_args(engine: str) -> list[str]:
    """'single', or 'dask:N' (a local cluster of N workers) as `recmesh train` options."""
    if engine == "single":
        return ["--engine", "single"]
    name, _, workers = engine.partition(":")
    if name != "dask" or not workers.isdigit() or int(workers) < 1:
        raise ValueError(f"engine {engine!r}: want single or dask:N (N workers)")
    return ["--engine", "dask", "--workers", workers]


def run(
    sizes: list[int],
    movielens: Path | None,
    epochs: int,
    say: Any,
    engines: list[str] | None = None,
    jobs: list[int] | None = None,
    repeat: int = 1,
    log_dir: Path | None = None,
    shoppers: int | None = None,
) -> dict[str, Any]:
    """Each log trained once per engine and number of jobs, all of them one after
    another on each log, `repeat` times over."""
    rows: list[dict[str, Any]] = []
    configs = [(e, j) for e in engines or ["single"] for j in jobs or [1]]
    extra = ["--epochs", str(epochs)]

    def each_config(world: str, repository: Path, log: Path) -> None:
        for round_ in range(1, repeat + 1):
            for engine, n in configs:
                say(f"  engine {engine}, {n} job(s), round {round_} ...")
                argv = [*extra, *engine_args(engine), "--jobs", str(n)]
                name = f"train-{engine.replace(':', '')}-jobs{n}-round{round_}.log"
                keep = log.parent / name if log_dir is not None else None
                rows.append({"world": world, "engine": engine, "jobs": n, "round": round_,
                             **measure(repository, log, argv, say, keep)})  # fmt: skip

    with tempfile.TemporaryDirectory(prefix="recmesh-bench-logs-") as tmp:
        for size in sizes:
            kept = log_dir / log_name(size, shoppers) / "purchases.jsonl" if log_dir is not None else None
            if kept is not None and kept.exists():
                say(f"the shop log of about {size:,} purchases in {kept.parent}")
                log = kept
            else:
                say(f"generating a shop log of about {size:,} purchases ...")
                log = shop_log(size, log_dir or Path(tmp), shoppers=shoppers)
            each_config("shop purchases", log.parent / "purchases.toml", log)
            if log_dir is None:
                log.unlink()
    if movielens is not None:
        each_config("movielens-100k", MOVIELENS_REPOSITORY, movielens)
    return {"epochs": epochs, "rows": rows}


def table(f: dict[str, Any]) -> str:
    lines = [f"recmesh train, {f['epochs']} epochs (peak: proportional set size of the process and its "
             "children)",
             f"  {'world':<16} {'engine':<7} {'jobs':>4} {'round':>5} {'events':>10} {'rows':>11} "
             f"{'wall s':>8} {'ms/event':>9} {'replay s':>9} {'peak GiB':>9} {'AUC':>7}  "
             "rows digest"]  # fmt: skip
    for r in f["rows"]:
        lines.append(f"  {r['world']:<16} {r['engine']:<7} {r['jobs']:>4} {r['round']:>5} {r['events']:>10,} "
                     f"{r['rows']:>11,} {r['wall_s']:>8} {r['ms_per_event']:>9} {r['replay_s']!s:>9} "
                     f"{r['peak_gib']:>9} {r['auc_holdout']!s:>7}  {r['rows_digest']}")  # fmt: skip
    lines += [f"  peak of {r['world']} / {r['engine']} / {r['jobs']} job(s) / round {r['round']}: during "
              f"{r.get('peak_during')!r}" for r in f["rows"]]  # fmt: skip
    by_log: dict[str, set[str]] = {}
    for r in f["rows"]:
        by_log.setdefault(r["log"], set()).add(r["rows_digest"])
    if any(len(engines) > 1 for engines in [[r for r in f["rows"] if r["log"] == log] for log in by_log]):
        same = all(len(d) == 1 for d in by_log.values())
        lines.append(f"  rows across engines: {'bit-identical' if same else 'DIFFERENT'} on every log")
    return "\n".join(lines)


def main(args: Any) -> int:
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else print
    sizes = [int(s) for s in args.sizes]
    if any(j < 1 for j in args.jobs):
        raise InvalidArgument(f"--jobs {','.join(map(str, args.jobs))}: each at least 1")
    figures = run(sizes, Path(args.movielens) if args.movielens else None, args.epochs, say, args.engines,
                  args.jobs, args.repeat, Path(args.log_dir) if args.log_dir else None,
                  args.shoppers)  # fmt: skip
    emit(figures, args.json, table(figures))
    return 0
