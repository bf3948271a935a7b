"""Admission policy with plain values, and the gate's queueing on one event loop."""

from __future__ import annotations

import asyncio

import pytest

from recmesh.admission import AdmissionConfig, AdmissionGate, AimdLimit, Verdict, class_ceiling, decide
from recmesh.errors import ResourceExhausted

CONFIG = AdmissionConfig(
    shares={"A": 1.0, "B": 0.8, "C": 0.5}, queue_caps={"A": 2, "B": 1, "C": 0}, floors={}
)
EMPTY: dict[str, int] = {}


def test_aimd_backs_off_on_slow_samples_and_grows_when_used() -> None:
    limit = AimdLimit(initial=20, lo=4, hi=30, target_ms=100, backoff=0.5)
    assert limit.on_sample(150, in_flight=10) == 10
    assert limit.on_sample(10, in_flight=2) == 10, "no growth while the limit is mostly unused"
    assert limit.on_sample(10, in_flight=5) == 11
    assert limit.on_sample(10, in_flight=5, dropped=True) == 5.5
    for _ in range(10):
        limit.on_sample(500, in_flight=1)
    assert limit.limit == 4, "never under the floor"
    for _ in range(100):
        limit.on_sample(1, in_flight=100)
    assert limit.limit == 30, "never over the ceiling"


def test_aimd_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        AimdLimit(initial=2, lo=4, hi=30, target_ms=100)
    with pytest.raises(ValueError):
        AimdLimit(initial=10, lo=4, hi=30, target_ms=100, backoff=1.0)


def test_classes_are_shed_in_order_c_then_b_and_a_keeps_the_whole_limit() -> None:
    limit = 10
    assert class_ceiling(limit, "C", CONFIG.shares) == 5
    assert class_ceiling(limit, "B", CONFIG.shares) == 8
    assert class_ceiling(limit, "A", CONFIG.shares) == 10
    verdicts = {n: tuple(decide(c, n, limit, EMPTY, CONFIG) for c in ("A", "B", "C")) for n in (4, 5, 8, 10)}
    assert verdicts[4] == (Verdict.ADMIT, Verdict.ADMIT, Verdict.ADMIT)
    assert verdicts[5] == (Verdict.ADMIT, Verdict.ADMIT, Verdict.SHED), "C first"
    assert verdicts[8] == (Verdict.ADMIT, Verdict.QUEUE, Verdict.SHED), "then B (into its queue)"
    assert verdicts[10] == (Verdict.QUEUE, Verdict.QUEUE, Verdict.SHED)


def test_a_floor_keeps_slots_for_a_when_the_limit_is_small() -> None:
    config = AdmissionConfig(shares={"A": 1.0, "B": 0.8, "C": 0.5}, floors={"A": 16})
    assert class_ceiling(4, "A", config.shares, config.floors) == 16
    assert decide("A", 10, 4, EMPTY, config) is Verdict.ADMIT
    assert decide("C", 2, 4, EMPTY, config) is Verdict.SHED, "the floor is A's alone"


def test_queues_are_bounded_and_nobody_overtakes_a_more_important_waiter() -> None:
    assert decide("B", 9, 10, {"B": 1}, CONFIG) is Verdict.SHED, "B's queue of 1 is full"
    assert decide("A", 10, 10, {"A": 2}, CONFIG) is Verdict.SHED
    assert decide("B", 0, 10, {"A": 1}, CONFIG) is Verdict.QUEUE, "A waits: B may not jump ahead"
    assert decide("A", 0, 10, {"B": 1}, CONFIG) is Verdict.ADMIT, "A does not wait behind B"
    assert decide("X", 0, 10, EMPTY, CONFIG) is Verdict.ADMIT, "an unknown class gets the smallest share"
    assert decide("X", 5, 10, EMPTY, CONFIG) is Verdict.SHED


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_gate_sheds_with_retry_after_and_hands_freed_slots_to_a_first() -> None:
    config = AdmissionConfig(initial_limit=2, min_limit=2, max_limit=2, shares={"A": 1.0, "B": 1.0, "C": 0.5},
                             queue_caps={"A": 1, "B": 1, "C": 0}, retry_after_s=3, floors={})  # fmt: skip
    gate = AdmissionGate(config, service="test", clock=Clock())
    release = asyncio.Event()
    order: list[str] = []

    async def hold(slo: str) -> None:
        async with gate.slot(slo, budget_s=10.0):
            order.append(slo)
            await release.wait()

    holders = [asyncio.create_task(hold("A")), asyncio.create_task(hold("A"))]
    await asyncio.sleep(0)
    assert gate.in_flight == 2
    with pytest.raises(ResourceExhausted) as shed:
        async with gate.slot("C", budget_s=10.0):
            pass
    assert shed.value.retry_after_s == 3 and shed.value.http_status == 429
    waiting_b = asyncio.create_task(hold("B"))
    await asyncio.sleep(0)
    waiting_a = asyncio.create_task(hold("A"))
    await asyncio.sleep(0)
    assert gate.window.shed == {"C": 1}
    release.set()
    await asyncio.gather(*holders, waiting_a, waiting_b)
    assert order == ["A", "A", "A", "B"], "the freed slot went to A although B waited longer"
    assert gate.in_flight == 0
    assert sorted(gate.take_window().latencies_ms) == ["A", "B"]


async def test_a_queued_request_gives_up_after_its_share_of_the_budget() -> None:
    config = AdmissionConfig(
        initial_limit=1, min_limit=1, max_limit=1, queue_caps={"A": 4}, queue_wait_fraction=0.5, floors={}
    )
    gate = AdmissionGate(config, service="test")
    release = asyncio.Event()

    async def hold() -> None:
        async with gate.slot("A", budget_s=10.0):
            await release.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    with pytest.raises(ResourceExhausted, match="queue_timeout"):
        async with gate.slot("A", budget_s=0.02):
            pass
    release.set()
    await holder
    assert gate.in_flight == 0 and gate._queued() == {"A": 0, "B": 0, "C": 0}


async def test_a_closed_loop_past_the_limit_waits_its_turn_with_the_default_queues() -> None:
    """Eight times as many clients as slots, each sending again as soon as it is answered
    (wrk -c32 against a limit of 4): with the default queues every request waits and is
    served, none is refused."""
    config = AdmissionConfig(initial_limit=4, min_limit=4, max_limit=4, floors={})
    gate = AdmissionGate(config, service="test")
    served, refused = 0, 0

    async def client(requests: int) -> None:
        nonlocal served, refused
        for _ in range(requests):
            try:
                async with gate.slot("B", budget_s=0.85):
                    await asyncio.sleep(0.002)
                served += 1
            except ResourceExhausted:
                refused += 1

    await asyncio.gather(*(client(5) for _ in range(32)))
    assert (served, refused) == (160, 0)
    assert gate.in_flight == 0 and gate._queued() == {"A": 0, "B": 0, "C": 0}


def test_a_lagging_event_loop_sheds_c_then_b_never_a() -> None:
    config = AdmissionConfig(loop_lag_limit_ms=20.0)
    verdicts = {
        lag: tuple(decide(c, 0, 100, EMPTY, config, loop_lag_ms=lag) for c in ("A", "B", "C"))
        for lag in (10.0, 30.0, 50.0, 500.0)
    }
    assert verdicts[10.0] == (Verdict.ADMIT,) * 3
    assert verdicts[30.0] == (Verdict.ADMIT, Verdict.ADMIT, Verdict.SHED)
    assert verdicts[50.0] == (Verdict.ADMIT, Verdict.SHED, Verdict.SHED)
    assert verdicts[500.0][0] is Verdict.ADMIT
    off = AdmissionConfig(loop_lag_limit_ms=0.0)
    assert decide("C", 0, 100, EMPTY, off, loop_lag_ms=500.0) is Verdict.ADMIT


async def test_gate_smooths_lag_and_names_the_reason() -> None:
    gate = AdmissionGate(AdmissionConfig(loop_lag_limit_ms=20.0), service="test")
    gate.record_loop_lag(200.0)
    assert 20.0 < gate.loop_lag_ms < 200.0, "smoothed, not the raw sample"
    assert gate.would_shed("C") and not gate.would_shed("A")
    assert "loop_lag" in str(gate.refuse("C"))
    for _ in range(30):
        gate.record_loop_lag(0.0)
    assert not gate.would_shed("C")


async def test_lag_watcher_wakes_often_only_while_the_gate_sees_traffic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate = AdmissionGate(AdmissionConfig(), service="test")
    samples: list[float] = []
    monkeypatch.setattr(gate, "record_loop_lag", samples.append)

    async def wakeups(in_flight: int = 0, asking: bool = False) -> int:
        gate.in_flight = in_flight
        samples.clear()
        watcher = asyncio.create_task(gate.watch_loop_lag(interval_s=0.005, idle_interval_s=0.05))
        for _ in range(50):  # 0.25 s
            if asking:
                gate.would_shed("C")  # a request the gate was asked about (shed ones too)
            await asyncio.sleep(0.005)
        watcher.cancel()
        return len(samples)

    idle = await wakeups()
    assert idle <= 6, f"{idle} samples idle: the idle interval is 50 ms"
    assert await wakeups(in_flight=1) >= 2 * idle + 6, "requests in flight: every 5 ms"
    assert await wakeups(asking=True) >= 2 * idle + 6, "nothing in flight, but requests arriving"


async def test_the_window_counts_the_wait_for_a_slot_and_the_limit_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    config = AdmissionConfig(initial_limit=1, min_limit=1, max_limit=1, queue_caps={"A": 1}, floors={})
    gate = AdmissionGate(config, service="test", clock=clock)
    service_ms: list[float] = []
    real = gate.limiter.on_sample

    def on_sample(latency_ms: float, in_flight: int, dropped: bool = False) -> float:
        service_ms.append(latency_ms)
        return real(latency_ms, in_flight, dropped)

    monkeypatch.setattr(gate.limiter, "on_sample", on_sample)
    first_done, second_done, second_in = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def hold(done: asyncio.Event, entered: asyncio.Event | None = None) -> None:
        async with gate.slot("A", budget_s=10.0):
            if entered is not None:
                entered.set()
            await done.wait()

    first = asyncio.create_task(hold(first_done))
    await asyncio.sleep(0)
    second = asyncio.create_task(hold(second_done, second_in))  # queued behind the first
    await asyncio.sleep(0)
    clock.now = 0.050
    first_done.set()
    await second_in.wait()
    clock.now = 0.080
    second_done.set()
    await asyncio.gather(first, second)
    assert sorted(gate.take_window().latencies_ms["A"]) == pytest.approx([50.0, 80.0]), "queued 50 ms, ran 30"
    assert sorted(service_ms) == pytest.approx([30.0, 50.0])
