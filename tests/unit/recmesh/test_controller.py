"""The feedback controller on simulated latency traces (plain values, no I/O)."""

from __future__ import annotations

import random

import pytest

from recmesh.admission import AdmissionConfig, AdmissionGate
from recmesh.controller import ControllerLoop, LatencyTargetController, WindowStats, p95, reward


def test_reward_is_the_design_notes_formula() -> None:
    assert reward(0) == 1.0
    assert reward(50) == 0.75
    assert reward(200) == 0.0
    assert reward(900) == 0.0, "clipped"
    assert reward(150, target_ms=300) == 0.5


def test_p95_nearest_rank() -> None:
    assert p95([]) is None
    assert p95([float(i) for i in range(1, 101)]) == 95.0
    assert p95([7.0]) == 7.0


def test_each_step_follows_the_reward_on_a_recorded_trace() -> None:
    ctl = LatencyTargetController(knob_ms=100.0, target_p95_ms=200.0)
    trace = [  # (p95 ms, class-A samples, shed) -> direction of the knob
        ((40.0, 500, 0), "same"),  # at its default, nothing shed: stays
        ((250.0, 500, 30), "down"),  # over target: cut
        ((210.0, 500, 30), "down"),
        ((180.0, 500, 30), "same"),  # reward 0.1 < 0.25: hold
        ((90.0, 500, 30), "up"),  # headroom while shedding: admit more
        ((90.0, 5, 30), "same"),  # too few samples to judge
        ((None, 0, 0), "same"),
    ]
    for (p, n, shed), direction in trace:
        before = ctl.knob_ms
        after = ctl.update(WindowStats(p, n, shed))
        assert {"down": after < before, "up": after > before, "same": after == before}[direction], (
            p,
            n,
            shed,
        )


def test_knob_stays_within_bounds() -> None:
    ctl = LatencyTargetController(knob_ms=100.0, lo_ms=20.0, hi_ms=150.0)
    for _ in range(50):
        ctl.update(WindowStats(999.0, 100, 10))
    assert ctl.knob_ms == 20.0
    for _ in range(50):
        ctl.update(WindowStats(1.0, 100, 10))
    assert ctl.knob_ms == 150.0


def simulate(
    loads: list[float], capacity: float, base_ms: float, ctl: LatencyTargetController, seed: int = 1
) -> list[tuple[float, float, int]]:
    """A plant for the controller: under the capacity class A's p95 grows with
    utilisation; over it the concurrency limit holds latency near the limit's
    latency target (tails 40% above it), sheds the excess, and the tighter the
    target the more it sheds. Returns (p95, knob, shed) per window."""
    rng = random.Random(seed)
    out = []
    for load in loads:
        if load <= capacity:
            p, shed = base_ms * (1 + 3 * (load / capacity) ** 4), 0
        else:
            p = 1.4 * ctl.knob_ms + base_ms
            shed = int(load - capacity * min(1.0, ctl.knob_ms / 100))
        p *= rng.uniform(0.9, 1.1)
        knob = ctl.update(WindowStats(p, 200, max(shed, 0)))
        out.append((p, knob, shed))
    return out


def test_holds_class_a_p95_under_target_through_a_load_spike_and_relaxes_after() -> None:
    ctl = LatencyTargetController(knob_ms=300.0, target_p95_ms=200.0, lo_ms=10.0, hi_ms=1000.0)
    loads = [500.0] * 10 + [2000.0] * 30 + [400.0] * 20
    run = simulate(loads, capacity=1000.0, base_ms=20.0, ctl=ctl)
    spike = run[10:40]
    assert spike[0][0] > 200, "the spike first pushes p95 over target"
    settled = spike[5:]
    assert max(p for p, _, _ in settled) <= 200 * 1.1, "held within 10% of target after 5 windows"
    assert sum(p <= 200 for p, _, _ in settled) / len(settled) >= 0.8
    assert all(s > 0 for _, _, s in spike), "class C / B shed while it holds"
    after = run[40:]
    assert after[-1][1] == pytest.approx(300.0, rel=0.05), "back to its default once the spike is over"


def test_more_variable_traces_never_leave_the_knob_stuck_at_the_floor() -> None:
    rng = random.Random(7)
    loads = [rng.choice([300.0, 900.0, 1500.0, 2500.0]) for _ in range(200)]
    ctl = LatencyTargetController(knob_ms=150.0)
    run = simulate(loads, capacity=1000.0, base_ms=15.0, ctl=ctl, seed=3)
    over = [p for (p, _, _), load in zip(run, loads, strict=True) if load > 1000.0]
    assert sum(p > 200 * 1.1 for p in over) / len(over) < 0.2
    assert min(k for _, k, _ in run) > ctl.lo_ms


def test_loop_step_moves_the_gate_latency_target() -> None:
    gate = AdmissionGate(AdmissionConfig(latency_target_ms=100.0), service="test")
    loop = ControllerLoop(gate, LatencyTargetController(100.0), window_s=1.0)
    for _ in range(100):
        gate.window.add_latency("A", 400.0)
    gate.window.add_shed("C")
    assert loop.step() == pytest.approx(70.0)
    assert gate.limiter.target_ms == pytest.approx(70.0)
    assert gate.window.latencies_ms == {}, "each window starts empty"
