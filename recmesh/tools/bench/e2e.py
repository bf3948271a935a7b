"""`recmesh bench e2e`: recommendations end to end, per class, as offered load rises.

Against a running gateway (`--gateway http://host:port`) or a mesh it starts
itself exactly as `recmesh up` does (own ports, own state directory). Each
step offers a fixed arrival rate for a fixed time (open loop,
`recmesh.tools.bench.loadgen`) with a class mix (default 30% A, 20% B, 50% C) and
prints, per class, p50/p95/p99 of the answered requests, goodput (answered
within the class budget, per second) and the shed rate (429). The first step
is a low rate of class A alone: the unloaded latency. A PNG of latency and
goodput against offered load is written with matplotlib (a dev dependency).
With a mesh it starts itself, or `--up-pid` naming the `recmesh up` process of
a running one, each step also prints the CPU milliseconds per request of every
mesh process (`recmesh.tools.bench.proccpu`) and the rate two cores could sustain at
that cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from recmesh.errors import InvalidArgument
from recmesh.settings import STATE_DIR_DEFAULT
from recmesh.tools.bench import floor as floor_bench
from recmesh.tools.bench.common import emit, free_port
from recmesh.tools.bench.loadgen import StepResult
from recmesh.tools.bench.proccpu import CpuMeter, child_pids, named
from recmesh.tools.bench.profile import py_spy, recording, report
from recmesh.tools.bench.repeat import round_order, spread, spreads
from recmesh.tools.bench.sweep import parse_mix, parse_rates, sweep, table
from recmesh.vectors import RELOAD_CHECK_S, load_item_vectors

UP_PORTS = (
    "GATEWAY_HTTP_PORT", "GATEWAY_GRPC_PORT", "FEATURE_PORT", "INFERENCE_PORT", "RANKER_PORT",
    "GATEWAY_METRICS_PORT", "FEATURE_METRICS_PORT", "INFERENCE_METRICS_PORT", "RANKER_METRICS_PORT",
    "INGEST_METRICS_PORT", "ATTRIBUTION_METRICS_PORT", "RECMESH_REDIS_PORT", "RECMESH_KAFKA_PORT",
)  # fmt: skip


def _mesh_env(state_dir: Path, extra: Mapping[str, str]) -> tuple[dict[str, int], dict[str, str]]:
    ports = {name: free_port() for name in UP_PORTS}
    env = dict(os.environ, RECMESH_STATE_DIR=str(state_dir), **{k: str(v) for k, v in ports.items()})
    env.update(extra)
    default_models = (STATE_DIR_DEFAULT / "models").resolve()
    if "RECMESH_MODEL_DIR" not in env and (default_models / "ctr" / "CURRENT").exists():
        env["RECMESH_MODEL_DIR"] = str(default_models)  # reuse the model `recmesh up` trained
    return ports, env


def _declares_item_texts(env: Mapping[str, str]) -> bool:
    from recmesh.features.repository import configured_feature_set

    where = env.get("RECMESH_REPOSITORY")
    return configured_feature_set(Path(where) if where else None).decl.items.texts is not None


async def _background_done(
    proc: subprocess.Popen[bytes], model_dir: Path, log_dir: Path, deadline: float, texts: bool = True
) -> None:
    """Wait for `recmesh up`'s background item embedding (a fresh state dir has
    no item vectors) and for the ranker to load them: measuring while it runs
    would charge a busy core to the mesh and leave semantic recall off. A
    repository without item texts has nothing to embed: nothing to wait for."""
    if load_item_vectors(model_dir) is None:
        if not texts:
            return
        # progress on stderr: a --json caller's standard output stays its figures
        print(
            "waiting for the background item embedding (fresh state, ~30 s) ...", file=sys.stderr, flush=True
        )
        while load_item_vectors(model_dir) is None:
            if proc.poll() is not None:
                raise RuntimeError(f"recmesh up exited {proc.returncode}; see {log_dir / 'up.log'}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no item vectors in {model_dir}; see {log_dir / 'logs'}")
            await asyncio.sleep(1.0)
        await asyncio.sleep(RELOAD_CHECK_S + 2.0)  # the ranker looks every few seconds, then builds


@dataclass(frozen=True)
class StartedMesh:
    url: str  # the gateway's HTTP address
    pid: int  # of `recmesh up`
    ports: dict[str, int]  # UP_PORTS -> the port each listens on

    def addr(self, port: str) -> str:
        return f"127.0.0.1:{self.ports[port]}"


@contextlib.asynccontextmanager
async def started_mesh(
    log_dir: Path,
    ready_timeout_s: float = 180.0,
    env: Mapping[str, str] | None = None,
    demo_events: int = 3000,
    tree: Path | None = None,
) -> AsyncIterator[StartedMesh]:
    """`recmesh up` on free ports, with `env` on top of this process's
    environment (a repository, a model directory); SIGINT on exit. `tree`: a
    checkout of recmesh whose code the mesh runs (with this Python
    environment) instead of this one's, e.g. an earlier commit's worktree."""
    ports, env = _mesh_env(log_dir, env or {})
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    log = (log_dir / "up.log").open("ab")
    proc = subprocess.Popen(  # noqa: ASYNC220 (returns at once)
        [sys.executable, "-m", "recmesh.tools.cli.main", "up", "--demo-events", str(demo_events)],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tree,
    )  # fmt: skip
    url = f"http://127.0.0.1:{ports['GATEWAY_HTTP_PORT']}"
    try:
        deadline = time.monotonic() + ready_timeout_s
        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"recmesh up exited {proc.returncode}; see {log_dir / 'up.log'}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(f"{url}/readyz")).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"mesh not ready after {ready_timeout_s} s; see {log_dir / 'up.log'}")
                await asyncio.sleep(0.5)
        await asyncio.sleep(2.0)  # let the demo events land
        model_dir = Path(env.get("RECMESH_MODEL_DIR") or log_dir / "models")
        await _background_done(proc, model_dir, log_dir, deadline, _declares_item_texts(env))
        yield StartedMesh(url, proc.pid, ports)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            await asyncio.to_thread(proc.wait, 40)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


TITLE = "recmesh bench e2e: POST /v1/recommend (count 10), open loop; latency of 200s from scheduled arrival"


def plot(steps: list[StepResult], out: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[dev]'): no plot written"
    loaded = steps[1:]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    colours = {"A": "tab:blue", "B": "tab:orange", "C": "tab:green"}
    for slo_class in sorted({c for s in loaded for c in s.classes}):
        colour = colours.get(slo_class, "tab:grey")
        xs = [s.rate for s in loaded if slo_class in s.classes]
        for q, style in (("p50_ms", ":"), ("p95_ms", "--"), ("p99_ms", "-")):
            ys = [getattr(s.classes[slo_class], q) for s in loaded if slo_class in s.classes]
            ax1.plot(xs, ys, style, color=colour, marker="o", label=f"{slo_class} {q[:3]}")
        ax2.plot(xs, [s.classes[slo_class].goodput_rps for s in loaded if slo_class in s.classes],
                 color=colour, marker="o", label=f"{slo_class} goodput (in budget)")  # fmt: skip
        ax2.plot(xs, [s.classes[slo_class].shed / s.seconds for s in loaded if slo_class in s.classes],
                 ":", color=colour, marker="x", label=f"{slo_class} shed/s")  # fmt: skip
    ax1.axhline(300, color="grey", lw=0.8)
    ax1.set(xlabel="offered load (requests/s)", ylabel="latency (ms)", yscale="log",
            title="latency by class vs offered load")  # fmt: skip
    ax2.set(xlabel="offered load (requests/s)", ylabel="requests/s", title="goodput and shed by class")
    ax1.legend(fontsize=7, ncol=3)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return f"plot: {out}"


def baseline_table(mesh: list[StepResult], floor: list[StepResult]) -> str:
    """Per step, the mesh against the floor measured in the same run (the
    same calls with no work in them): class-A p50 and CPU per request, as
    ratios, which move less with the machine's speed than the figures do."""
    lines = [
        "baseline: `recmesh bench floor` in the same run (the same calls, no work); ratio = mesh / floor",
        f"{'offered/s':>9} {'floor A p50':>11} {'p50 ratio':>9} {'floor cpu ms':>12} {'cpu ratio':>9}",
    ]
    for m, f in zip(mesh, floor, strict=False):
        m_a, f_a = m.classes.get("A"), f.classes.get("A")
        m_cpu, f_cpu = sum(m.cpu_ms_per_request.values()), sum(f.cpu_ms_per_request.values())
        p50 = f"{m_a.p50_ms / f_a.p50_ms:>8.2f}x" if m_a and f_a and f_a.p50_ms > 0 else f"{'-':>9}"
        cpu = f"{m_cpu / f_cpu:>8.2f}x" if m_cpu > 0 and f_cpu > 0 else f"{'-':>9}"
        f_p50 = f"{f_a.p50_ms:>8.1f} ms" if f_a else f"{'-':>11}"
        lines.append(f"{m.rate:>9.0f} {f_p50} {p50} {f_cpu:>9.2f} ms {cpu}")
    return "\n".join(lines)


# A class-A answer is full when it came within the class budget with no degraded entry;
# a rate is within full-answer capacity when at least this share of them was.
FULL_SHARE = 0.95
SERVICES = ("gateway", "ranker", "feature", "inference", "feature_ingest", "attribution")


def full_answer_capacity(steps: list[StepResult], slo_class: str = "A") -> float:
    """The highest offered rate of the loaded steps (in the order offered) up to
    which `slo_class` got full answers (0: not even at the first rate)."""
    capacity = 0.0
    for step in steps[1:]:  # the first step is the unloaded one
        c = step.classes.get(slo_class)
        if c is None or c.offered == 0:
            continue
        if (c.within_budget - c.degraded) / c.offered < FULL_SHARE:
            break
        capacity = step.rate
    return capacity


def ratios(mesh: list[StepResult], floor: list[StepResult]) -> dict[str, float]:
    """One round's mesh/floor ratios: unloaded class-A p50, CPU per answer at each
    rate, and full-answer capacity (NaN where a side has no figure)."""
    nan = float("nan")
    out: dict[str, float] = {}
    m_a, f_a = mesh[0].classes.get("A"), floor[0].classes.get("A")
    out["unloaded_p50"] = m_a.p50_ms / f_a.p50_ms if m_a and f_a and f_a.p50_ms > 0 else nan
    for m, f in zip(mesh[1:], floor[1:], strict=False):
        m_cpu, f_cpu = sum(m.cpu_ms_per_request.values()), sum(f.cpu_ms_per_request.values())
        out[f"cpu@{m.rate:g}"] = m_cpu / f_cpu if m_cpu > 0 and f_cpu > 0 else nan
    cap_m, cap_f = full_answer_capacity(mesh), full_answer_capacity(floor)
    out["capacity_mesh"], out["capacity_floor"] = cap_m, cap_f
    out["capacity"] = cap_m / cap_f if cap_f > 0 else nan
    return out


def ratio_table(rounds: list[dict[str, float]], rates: list[float]) -> str:
    """Each ratio's median and range over the rounds, with the issue-18 target."""
    s = spreads(rounds)
    lines = [f"mesh / floor over {len(rounds)} alternating round(s) (median, range)"]
    lines.append(f"  unloaded class-A p50        {s['unloaded_p50'].text()}   target <= 1.5x")
    for rate in rates:
        if f"cpu@{rate:g}" in s:
            lines.append(f"  CPU per answer at {rate:>5g}/s   {s[f'cpu@{rate:g}'].text()}   target <= 1.5x")
    cap_m, cap_f = s["capacity_mesh"], s["capacity_floor"]
    lines.append(
        f"  class-A full-answer capacity {s['capacity'].text()} (mesh {cap_m.median:g}/s, floor "
        f"{cap_f.median:g}/s: the highest swept rate with >= {FULL_SHARE:.0%} full answers; a floor at the "
        f"top rate is a lower bound)   target >= 0.50x"
    )
    return "\n".join(lines)


def parse_against(text: str | None) -> dict[str, str]:
    """`--against VAR=VALUE[,VAR=VALUE]` as the second mesh's extra environment."""
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, eq, value = part.partition("=")
        if not eq or not name.strip():
            raise InvalidArgument(f"--against takes VAR=VALUE[,VAR=VALUE]; {part!r} is not VAR=VALUE")
        out[name.strip()] = value.strip()
    return out


def against_tree(path: str | None) -> Path | None:
    """`--against-tree DIR`: a recmesh checkout (its `recmesh/` and `services/` packages)."""
    if not path:
        return None
    tree = Path(path).resolve()
    if not (tree / "recmesh" / "tools" / "up.py").is_file() or not (tree / "services").is_dir():
        raise InvalidArgument(
            f"--against-tree {path}: not a recmesh checkout (no recmesh/tools/up.py, services/)"
        )
    return tree


def against_table(mesh: list[list[StepResult]], other: list[list[StepResult]], label: str) -> str:
    """Per loaded rate, each process's CPU per answer in the mesh and in the one
    started with `--against` (median over the rounds), and the ratio of their
    totals per round (median and range): what the compared setting costs, by hop."""
    lines = [f"this mesh against one with {label}: CPU ms per answer by process (median over rounds)"]
    p50_m = [a.p50_ms for s in mesh if (a := s[0].classes.get("A"))]
    p50_o = [a.p50_ms for s in other if (a := s[0].classes.get("A"))]
    if p50_m and p50_o:
        per_round = [m / o for m, o in zip(p50_m, p50_o, strict=False) if o > 0]
        lines.append(
            f"  unloaded class-A p50 ms {spread(p50_m).median:7.2f} against {spread(p50_o).median:7.2f}"
            f"   ratio {spread(per_round).text()}"
        )
    for k in range(1, len(mesh[0])):
        steps_m = [sweep_[k] for sweep_ in mesh if len(sweep_) > k]
        steps_o = [sweep_[k] for sweep_ in other if len(sweep_) > k]
        names = sorted({n for s in steps_m + steps_o for n in s.cpu_ms_per_request})
        if not names:
            continue
        lines.append(f"  at {steps_m[0].rate:g}/s offered")
        for name in [*names, "all"]:

            def cpu(s: StepResult, n: str = name) -> float:
                d = s.cpu_ms_per_request
                return sum(d.values()) if n == "all" else d.get(n, 0.0)

            m = spread([cpu(s) for s in steps_m])
            o = spread([cpu(s) for s in steps_o])
            if m.median == o.median == 0:
                continue  # a process that used nothing measurable in either (one gone before a sweep)
            per_round = [cpu(a) / cpu(b) for a, b in zip(steps_m, steps_o, strict=False) if cpu(b) > 0]
            lines.append(
                f"    {name:<16} {m.median:7.2f} against {o.median:7.2f}   ratio {spread(per_round).text()}"
            )
    return "\n".join(lines)


@dataclass
class Compared:
    mesh: list[list[StepResult]]  # one sweep per round
    floor: list[list[StepResult]]  # empty without the baseline
    profile: str = ""
    against: list[list[StepResult]] | None = None  # the --against mesh's sweeps, one per round


@dataclass(frozen=True)
class _Target:
    """One thing a round sweeps: a mesh, the --against mesh or the floor."""

    url: str  # its gateway
    meter: Callable[[], CpuMeter | None]  # how its CPU is measured (a fresh meter per sweep)
    seconds: float  # per step
    mix: dict[str, float]
    api_key: str | None
    sweeps: list[list[StepResult]]  # where its sweeps go, one per round


async def run(args: Any) -> Compared:
    """The mesh's sweep, and with the baseline the floor's (with `--against`, a
    second mesh's too), `args.repeat` times in alternating order; all are started
    once. With `args.profile`, py-spy records the mesh's services throughout."""
    rates, mix = parse_rates(args.rates), parse_mix(args.mix)
    if args.profile:
        py_spy()  # missing: said before a mesh starts
    against = parse_against(args.against)
    tree = against_tree(args.against_tree)
    if (against or tree) and args.gateway:
        raise InvalidArgument("--against and --against-tree start both meshes: leave out --gateway")
    out = Compared([], [], against=[] if against or tree else None)
    async with contextlib.AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="recmesh-bench-e2e-")))
        for sub in ("mesh", "floor", "against"):
            (tmp / sub).mkdir()
        up_pid: int | None = args.up_pid
        url = args.gateway
        if not url:
            mesh = await stack.enter_async_context(started_mesh(tmp / "mesh"))
            url, up_pid = mesh.url, mesh.pid
        targets = {"mesh": _Target(url, lambda: CpuMeter(up_pid) if up_pid else None, args.seconds, mix,
                                   args.api_key, out.mesh)}  # fmt: skip
        if out.against is not None:
            other = await stack.enter_async_context(started_mesh(tmp / "against", env=against, tree=tree))
            targets["against"] = _Target(other.url, lambda: CpuMeter(other.pid), args.seconds, mix,
                                         args.api_key, out.against)  # fmt: skip
        if args.baseline:
            floor_url, roles = await stack.enter_async_context(floor_bench.started_skeleton(tmp / "floor"))
            targets["floor"] = _Target(floor_url, lambda: CpuMeter(names=roles), min(args.seconds, 5.0),
                                       {"A": 1.0}, None, out.floor)  # fmt: skip
        if args.profile:
            if up_pid is None:
                raise InvalidArgument("--profile with --gateway needs --up-pid (the processes to record)")
            pids = {n: p for n, p in named(child_pids(up_pid)).items() if n in SERVICES}
            await stack.enter_async_context(recording(pids, Path(args.profile)))
        for r in range(args.repeat):
            for which in round_order(list(targets), r):
                t = targets[which]
                t.sweeps.append(await sweep(t.url, rates, t.seconds, t.mix, t.api_key, t.meter()))
    if args.profile:
        out.profile = report(Path(args.profile))
    return out


def main(args: Any) -> int:
    compared = asyncio.run(run(args))
    steps = compared.mesh[0]
    figures: dict[str, Any] = {"steps": [asdict(s) for s in steps]}
    text = table(steps, TITLE) + "\n" + plot(steps, Path(args.plot))
    if compared.floor:
        figures["baseline"] = [asdict(s) for s in compared.floor[0]]
        rounds = [ratios(m, f) for m, f in zip(compared.mesh, compared.floor, strict=True)]
        figures["rounds"] = rounds
        figures["ratios"] = {k: v.as_dict() for k, v in spreads(rounds).items()}
        text += "\n" + baseline_table(steps, compared.floor[0])
        text += "\n" + ratio_table(rounds, parse_rates(args.rates))
        if args.profile:
            text += "\n  (py-spy sampled the mesh: the CPU figures include the sampling; measure without it)"
    if compared.against:
        label = " and ".join(
            filter(None, [args.against, args.against_tree and f"the code of {args.against_tree}"])
        )
        sweeps = [[asdict(s) for s in m] for m in compared.against]
        figures["against"] = {"env": parse_against(args.against), "tree": args.against_tree, "steps": sweeps}
        text += "\n" + against_table(compared.mesh, compared.against, label)
    if compared.profile:
        text += "\n" + compared.profile
    emit(figures, args.json, text)
    return 0
