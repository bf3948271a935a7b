from __future__ import annotations

import asyncio

import pytest

from recmesh import eventloop


def test_the_loop_is_asyncio_unless_uvloop_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RECMESH_EVENT_LOOP", raising=False)
    assert eventloop.loop_kind() == "asyncio"
    monkeypatch.setenv("RECMESH_EVENT_LOOP", "uvloop")
    assert eventloop.loop_kind() == "uvloop"  # a runtime dependency
    monkeypatch.setenv("RECMESH_EVENT_LOOP", "trio")
    with pytest.raises(ValueError, match="RECMESH_EVENT_LOOP"):
        eventloop.loop_kind()


@pytest.mark.parametrize("kind", eventloop.CHOICES)
def test_run_runs_the_coroutine_on_the_chosen_loop(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    monkeypatch.setenv("RECMESH_EVENT_LOOP", kind)

    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert eventloop.run(which()).startswith(kind)
