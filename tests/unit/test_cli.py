"""The `recmesh` command line says what is wrong, where, and sends nothing half-way."""

from __future__ import annotations

from pathlib import Path

import pytest

from recmesh.cli import main

GOOD = '{"event_id": "e1", "user_id": "u1", "item_id": "i1", "behavior": "view", "event_time": 1767225600000}'


def test_a_bad_line_in_an_event_file_is_named_and_nothing_is_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No broker listens here: reaching the send at all would be the failure.
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "127.0.0.1:1")
    log = tmp_path / "events.jsonl"
    log.write_text(f"{GOOD}\n\n{{bad\n")
    assert main(["events", "send", "--file", str(log)]) == 2
    err = capsys.readouterr().err
    assert f"{log} line 3: not JSON" in err and "nothing was sent" in err


def test_health_says_why_it_failed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["health", "--http", "http://127.0.0.1:1/readyz", "--timeout", "0.5"]) == 1
    assert "http://127.0.0.1:1/readyz unreachable" in capsys.readouterr().err
    assert main(["health", "--grpc", "127.0.0.1:1", "--timeout", "0.3"]) == 1
    assert "127.0.0.1:1 is not SERVING" in capsys.readouterr().err
