"""FetchWait: a consumer's broker-side wait, short while records come, long once idle."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from recmesh.consumer import IDLE_AFTER_S, FetchWait


def _started(wait_ms: int) -> Any:
    return SimpleNamespace(_fetcher=SimpleNamespace(_fetch_max_wait_ms=wait_ms))


def test_the_wait_stretches_after_a_quiet_second_and_shortens_with_the_next_records() -> None:
    consumer = _started(50)
    wait = FetchWait(cast(Any, consumer), 50, 250)
    t0 = 1000.0
    assert wait.observe(True, t0) == 50
    assert wait.observe(False, t0 + IDLE_AFTER_S / 2) == 50
    assert consumer._fetcher._fetch_max_wait_ms == 50
    assert wait.observe(False, t0 + IDLE_AFTER_S) == 250
    assert consumer._fetcher._fetch_max_wait_ms == 250
    assert wait.observe(False, t0 + 60) == 250
    assert wait.observe(True, t0 + 61) == 50
    assert consumer._fetcher._fetch_max_wait_ms == 50


def test_an_idle_wait_below_the_busy_one_never_shortens_it() -> None:
    consumer = _started(500)
    wait = FetchWait(cast(Any, consumer), 500, 100)
    assert wait.observe(False, wait._last_records + 10) == 500
    assert consumer._fetcher._fetch_max_wait_ms == 500


def test_a_consumer_not_started_keeps_its_configured_wait() -> None:
    wait = FetchWait(cast(Any, SimpleNamespace()), 50, 250)
    assert wait.observe(False, wait._last_records + 10) == 50
