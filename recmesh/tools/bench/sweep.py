"""The open-loop sweep both `recmesh bench e2e` and `recmesh bench floor` run:
a warm-up, a 20/s class-A step (the unloaded figures), then one step per
offered rate against a gateway URL; its arguments (`--rates`, `--mix`) and
its table, with the CPU line per step when a meter is given."""

from __future__ import annotations

import asyncio
import math
from urllib.parse import urlsplit

from recmesh.errors import InvalidArgument
from recmesh.tools.bench.loadgen import LoadSpec, Outcome, StepResult, offer, summarise
from recmesh.tools.bench.proccpu import CpuMeter


def parse_rates(text: str) -> list[float]:
    """`20,50,100` -> offered rates (bad text: InvalidArgument)."""
    try:
        rates = [float(r) for r in text.split(",")]
    except ValueError:
        raise InvalidArgument(f"'{text}' is not a comma-separated list of rates") from None
    if not all(0 < r < math.inf for r in rates):
        raise InvalidArgument(f"'{text}': every rate must be a finite number > 0")
    return rates


def parse_mix(text: str) -> dict[str, float]:
    """`A:0.3,B:0.2,C:0.5` -> shares that sum to 1 (bad text: InvalidArgument)."""
    mix = {}
    for part in text.split(","):
        raw_name, _, share = part.partition(":")
        name = raw_name.strip().upper()
        try:
            value = float(share)
        except ValueError:
            raise InvalidArgument(f"'{part}' is not CLASS:SHARE (e.g. A:0.3,B:0.2,C:0.5)") from None
        if name in mix:
            raise InvalidArgument(f"'{text}': class {name} is given twice")
        mix[name] = value
    if not all(mix) or not all(0 <= v < math.inf for v in mix.values()) or sum(mix.values()) <= 0:
        raise InvalidArgument(f"'{text}': each class needs a name and a finite share >= 0, not all 0")
    total = sum(mix.values())
    return {k: v / total for k, v in mix.items()}


async def sweep(
    url: str,
    rates: list[float],
    seconds: float,
    mix: dict[str, float],
    api_key: str | None,
    meter: CpuMeter | None = None,
) -> list[StepResult]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    keys = {c: api_key if c == "A" else None for c in ("A", "B", "C")}
    # Warm-up (connections, caches, the controller's first window), not reported.
    await offer(host, port, LoadSpec(rate=50, seconds=2.0, mix=mix, api_keys=keys))

    async def step_of(spec: LoadSpec) -> StepResult:
        if meter is not None:
            meter.start()
        outcomes: list[Outcome]
        outcomes, lag = await offer(host, port, spec)
        step = summarise(outcomes, spec.rate, spec.seconds)
        step.client_lag_ms = lag
        if meter is not None:
            # Per recommendation answered: under overload the shed requests'
            # CPU is a cost of the ones served, and the ceiling is in answers/s.
            answered = sum(1 for o in outcomes if o.status == 200)
            step.cpu_ms_per_request = meter.per_request(answered) if answered else {}
        return step

    steps = [
        await step_of(LoadSpec(rate=20, seconds=min(seconds, 5.0), mix={"A": 1.0}, api_keys=keys, seed=0))
    ]
    for i, rate in enumerate(rates):
        steps.append(await step_of(LoadSpec(rate=rate, seconds=seconds, mix=mix, api_keys=keys, seed=i + 1)))
        await asyncio.sleep(1.0)  # let queues drain between steps
    return steps


def cpu_line(step: StepResult, cores: int = 2) -> str:
    """`cpu ms/request: gateway 0.74 ranker 2.96 ... all 7.8 (2-core ceiling ~256/s)`."""
    cpu = step.cpu_ms_per_request
    total = sum(cpu.values())
    if not cpu or total <= 0:
        return ""
    ranked = sorted(cpu.items(), key=lambda kv: -kv[1])
    parts = " ".join(f"{name} {ms:.2f}" for name, ms in ranked if ms >= 0.01)
    ceiling = cores * 1000 / total
    return f"{'':>9} {'cpu':>5} ms/request: {parts}; all {total:.2f} ({cores}-core ceiling ~{ceiling:.0f}/s)"


def table(steps: list[StepResult], title: str) -> str:
    lines = [
        title,
        f"{'offered/s':>9} {'class':>5} {'sent':>6} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} "
        f"{'goodput/s':>9} {'good %':>7} {'shed %':>7} {'err %':>6} {'degr %':>7} {'lag ms':>7}",
    ]
    for step in steps:
        for c in step.classes.values():
            lines.append(
                f"{step.rate:>9.0f} {c.slo_class:>5} {c.offered:>6} {c.p50_ms:>8.1f} {c.p95_ms:>8.1f} "
                f"{c.p99_ms:>8.1f} {c.goodput_rps:>9.1f} {100 * c.goodput_ratio:>7.1f} "
                f"{100 * c.shed_rate:>7.1f} {100 * c.errors / c.offered:>6.1f} "
                f"{100 * c.degraded / max(1, c.ok):>7.1f} {step.client_lag_ms:>7.1f}"
            )
        lines.append(f"{'':>9} {'all':>5} answered {step.total_ok_rps:.1f}/s")
        if step.cpu_ms_per_request:
            lines.append(cpu_line(step))
    return "\n".join(lines)
