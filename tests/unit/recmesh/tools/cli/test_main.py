"""The `recmesh` command line says what is wrong, where, and sends nothing half-way."""

from __future__ import annotations

from pathlib import Path

import pytest

from recmesh.tools.cli.main import main

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


@pytest.mark.parametrize("command", [["init"], ["catalog", "load"]])
def test_the_demo_catalog_loads_only_when_asked(
    command: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing listens here: the refusal must come before any connection.
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "127.0.0.1:1")
    monkeypatch.delenv("RECMESH_REPOSITORY", raising=False)
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "is the demo repository" in err and "--demo" in err


def test_a_bad_repository_file_is_named_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "recmesh.toml"
    repo.write_text(
        '[repository]\nname = "x"\n\n[events]\nbehaviors = ["view"]\n\n'
        '[realtime.v]\nentity = "user"\naggregate = "count"\nwindow = "soon"\n'
    )
    monkeypatch.setenv("RECMESH_REPOSITORY", str(repo))
    assert main(["repository", "show"]) == 2
    err = capsys.readouterr().err
    assert f"{repo}:" in err and "realtime.v" in err and "window: 'soon' is not a duration" in err


def test_train_on_a_repository_without_events_says_what_to_give(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "recmesh.toml"
    repo.write_text('[repository]\nname = "team"\n\n[events]\nbehaviors = ["view"]\n')
    monkeypatch.setenv("RECMESH_REPOSITORY", str(repo))
    assert main(["train", "--model-dir", str(tmp_path / "models")]) == 2
    assert "give your event log with --events LOG" in capsys.readouterr().err


def test_a_command_without_the_mesh_certificates_says_where_they_are(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """TLS is on by default: `features get` beside `recmesh up` without its cli.env sourced."""
    from recmesh.security import reset_process_tls

    monkeypatch.setenv("RECMESH_TLS", "on")
    for variable in ("RECMESH_TLS_CA", "RECMESH_TLS_CERT", "RECMESH_TLS_KEY"):
        monkeypatch.delenv(variable, raising=False)
    reset_process_tls()
    try:
        assert main(["features", "get", "--user", "u1", "--item", "i1"]) == 2
    finally:
        reset_process_tls()
    err = capsys.readouterr().err
    assert "RECMESH_TLS_CA" in err and "secrets/cli.env" in err and "Traceback" not in err
