"""`recmesh bench tls`: what mutual TLS costs, on against off, in the same run.

Starts the mesh as `recmesh up` does (own ports and state directory, one
model directory for all rounds) alternately with its default (mutual TLS
and the peer check on every internal hop) and with RECMESH_TLS=off, `--rounds`
times each (on, off, on, off, ...: drift of the machine falls on both), and
runs the e2e sweep against each (`recmesh.tools.bench.sweep.sweep`: a 20/s class-A
step, the unloaded figures, then the `--rates` steps). Prints per mode the
median over rounds of the unloaded class-A p50 and of the mesh's CPU
milliseconds per recommendation at each rate, and the ratios on / off.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from recmesh.settings import STATE_DIR_DEFAULT
from recmesh.tools.bench.common import emit
from recmesh.tools.bench.e2e import started_mesh
from recmesh.tools.bench.loadgen import StepResult
from recmesh.tools.bench.proccpu import CpuMeter
from recmesh.tools.bench.sweep import parse_mix, parse_rates, sweep

MODES = ("on", "off")


async def run(args: Any) -> dict[str, list[list[StepResult]]]:
    rates, mix = parse_rates(args.rates), parse_mix(args.mix)
    runs: dict[str, list[list[StepResult]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="recmesh-bench-tls-") as tmp:
        default_models = (STATE_DIR_DEFAULT / "models").resolve()
        model_dir = Path(os.environ.get("RECMESH_MODEL_DIR") or "")
        if not model_dir.parts:
            model_dir = (
                default_models if (default_models / "ctr" / "CURRENT").exists() else Path(tmp) / "models"
            )
        for round_ in range(args.rounds):
            for mode in MODES:
                state = Path(tmp) / f"{round_}-{mode}"
                state.mkdir()
                print(f"round {round_ + 1}/{args.rounds}: mTLS {mode} ...", flush=True)
                env = {"RECMESH_MODEL_DIR": str(model_dir), "RECMESH_TLS": mode}
                async with started_mesh(state, ready_timeout_s=240.0, env=env) as mesh:
                    steps = await sweep(mesh.url, rates, args.seconds, mix, args.api_key, CpuMeter(mesh.pid))
                runs[mode].append(steps)
    return runs


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summary(runs: dict[str, list[list[StepResult]]]) -> dict[str, Any]:
    """Per mode: the unloaded class-A p50 and CPU ms per recommendation per step
    (medians over rounds); and their ratios on / off."""
    out: dict[str, Any] = {}
    for mode, rounds in runs.items():
        unloaded = [r[0].classes["A"].p50_ms for r in rounds if "A" in r[0].classes]
        steps = len(rounds[0]) if rounds else 0
        cpu = [_median([sum(r[i].cpu_ms_per_request.values()) for r in rounds]) for i in range(steps)]
        out[mode] = {"unloaded_a_p50_ms": _median(unloaded), "cpu_ms_per_request": cpu,
                     "rates": [s.rate for s in rounds[0]] if rounds else []}  # fmt: skip
    on, off = out["on"], out["off"]
    pairs = zip(on["cpu_ms_per_request"], off["cpu_ms_per_request"], strict=True)
    out["ratio"] = {
        "unloaded_a_p50": on["unloaded_a_p50_ms"] / off["unloaded_a_p50_ms"],
        "cpu_ms_per_request": [a / b if b > 0 else float("nan") for a, b in pairs],
    }
    return out


def table(s: dict[str, Any], rounds: int) -> str:
    rates = s["on"]["rates"]
    lines = [
        f"recmesh bench tls: mutual TLS on vs off, same run, alternated, {rounds} round(s) each (medians)",
        f"{'':>12} {'unloaded A p50':>15} " + " ".join(f"{f'cpu ms @{r:.0f}/s':>14}" for r in rates),
    ]
    for mode in MODES:
        cpu = " ".join(f"{c:>14.2f}" for c in s[mode]["cpu_ms_per_request"])
        lines.append(f"{'mTLS ' + mode:>12} {s[mode]['unloaded_a_p50_ms']:>12.2f} ms {cpu}")
    ratio = s["ratio"]
    cpu = " ".join(f"{c:>13.2f}x" for c in ratio["cpu_ms_per_request"])
    lines.append(f"{'on / off':>12} {ratio['unloaded_a_p50']:>14.2f}x {cpu}")
    lines.append("(the first CPU column is the 20/s class-A step; CPU is every mesh process per answer)")
    return "\n".join(lines)


def main(args: Any) -> int:
    runs = asyncio.run(run(args))
    s = summary(runs)
    figures = {
        "summary": s,
        "runs": {m: [[asdict(step) for step in r] for r in rs] for m, rs in runs.items()},
    }
    emit(figures, args.json, table(s, args.rounds))
    return 0
