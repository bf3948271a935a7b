"""The CLI finds the mesh `recmesh up` started: it reads up's cli.env, under
whatever the environment sets itself, and says so with --verbose."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from recmesh.localsecrets import LocalSecrets
from recmesh.tools.cli.clienv import CliEnvError, apply, load_cli_env, parse
from recmesh.tools.cli.main import main

MESH = {"REDIS_URL": "redis://127.0.0.1:6380/0", "FEATURE_ADDR": "127.0.0.1:50052"}


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process environment as it was before the test, whatever the loader set;
    no RECMESH_CLI_ENV (the suite's `off`), nor the mesh's variables."""
    saved = dict(os.environ)
    for name in ("RECMESH_CLI_ENV", "RECMESH_STATE_DIR", *MESH, "REDIS_USERNAME", "REDIS_PASSWORD",
                 "REDIS_PASSWORD_FILE", "KAFKA_BOOTSTRAP"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    yield
    os.environ.clear()
    os.environ.update(saved)


def _state(tmp_path: Path, text: str) -> Path:
    """A state directory whose secrets/cli.env holds `text`; RECMESH_STATE_DIR names it."""
    state = tmp_path / "state"
    (state / "secrets").mkdir(parents=True)
    (state / "secrets" / "cli.env").write_text(text)
    os.environ["RECMESH_STATE_DIR"] = str(state)
    return state / "secrets" / "cli.env"


def test_what_up_writes_reads_back_value_for_value(tmp_path: Path) -> None:
    values = {"A": "plain", "B": "two words", "C": 'it\'s $HOME `x` "q"', "D": "", "E": "a=b#c"}
    path = LocalSecrets(tmp_path).write_cli_env(values)
    assert parse(path.read_text(), path) == values


def test_comments_blank_lines_and_export_are_allowed(tmp_path: Path) -> None:
    text = "# the mesh\n\nexport A=1\n  B='x y'  # trailing comment\nA=2\n"
    assert parse(text, tmp_path / "cli.env") == {"A": "2", "B": "x y"}  # the last A, as a shell would


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("just words", "line 2: not NAME=value"),
        ("A B=1", "line 2: not NAME=value"),
        ("=1", "line 2: not NAME=value"),
        ("A='open", "line 2: A: No closing quotation"),
        ("A=two words", "line 2: A: the value is more than one word (quote it)"),
    ],
)
def test_a_malformed_line_is_an_error_naming_the_file_and_line(tmp_path: Path, line: str, says: str) -> None:
    path = tmp_path / "cli.env"
    with pytest.raises(CliEnvError) as err:
        parse(f"OK=1\n{line}\n", path)
    assert str(err.value) == f"{path} {says}"


def test_explicit_variables_win_one_by_one() -> None:
    environ = {"REDIS_URL": "redis://mine:6379/0", "redis_username": "me", "REDIS_PASSWORD_FILE": "/pw"}
    values = {"REDIS_URL": "redis://up:6380/0", "FEATURE_ADDR": "up:50052", "REDIS_USERNAME": "cli",
              "REDIS_PASSWORD": "up's"}  # fmt: skip
    applied, kept = apply(values, environ)
    assert applied == ["FEATURE_ADDR"]
    # Case-insensitive, as the settings read names; a password file set keeps the
    # file's password out (a password would win over it).
    assert kept == ["REDIS_URL", "REDIS_USERNAME", "REDIS_PASSWORD"]
    assert environ == {"REDIS_URL": "redis://mine:6379/0", "redis_username": "me",
                       "REDIS_PASSWORD_FILE": "/pw", "FEATURE_ADDR": "up:50052"}  # fmt: skip


@pytest.mark.usefixtures("environ")
def test_the_state_directory_file_is_applied_under_the_environment(tmp_path: Path) -> None:
    path = _state(tmp_path, "".join(f"{k}={v}\n" for k, v in MESH.items()))
    os.environ["REDIS_URL"] = "redis://mine:6379/0"
    loaded = load_cli_env()
    assert (loaded.path, loaded.found) == (path, True)
    assert (loaded.applied, loaded.kept) == (["FEATURE_ADDR"], ["REDIS_URL"])
    assert os.environ["FEATURE_ADDR"] == MESH["FEATURE_ADDR"]
    assert os.environ["REDIS_URL"] == "redis://mine:6379/0"
    kept = "kept from the environment: REDIS_URL"
    assert loaded.describe() == f"mesh settings from {path}: set FEATURE_ADDR; {kept}"


@pytest.mark.usefixtures("environ")
def test_the_default_state_directory_is_up_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`.recmesh` in the current directory, as `recmesh up` resolves it."""
    (tmp_path / ".recmesh" / "secrets").mkdir(parents=True)
    (tmp_path / ".recmesh" / "secrets" / "cli.env").write_text("FEATURE_ADDR=127.0.0.1:1\n")
    monkeypatch.chdir(tmp_path)
    loaded = load_cli_env()
    assert loaded.path == tmp_path.resolve() / ".recmesh" / "secrets" / "cli.env" and loaded.found
    assert os.environ["FEATURE_ADDR"] == "127.0.0.1:1"


@pytest.mark.usefixtures("environ")
def test_no_file_applies_nothing(tmp_path: Path) -> None:
    os.environ["RECMESH_STATE_DIR"] = str(tmp_path / "nothing-here")
    before = dict(os.environ)
    loaded = load_cli_env()
    assert not loaded.found and loaded.applied == [] and dict(os.environ) == before
    assert loaded.describe().startswith(f"no {tmp_path / 'nothing-here' / 'secrets' / 'cli.env'} ")


@pytest.mark.usefixtures("environ")
def test_recmesh_cli_env_names_another_file_or_turns_it_off(tmp_path: Path) -> None:
    _state(tmp_path, "FEATURE_ADDR=from-state:1\n")
    other = tmp_path / "other.env"
    other.write_text("FEATURE_ADDR=from-other:1\n")
    os.environ["RECMESH_CLI_ENV"] = "off"
    assert load_cli_env().path is None and "FEATURE_ADDR" not in os.environ
    os.environ["RECMESH_CLI_ENV"] = str(other)
    assert load_cli_env().applied == ["FEATURE_ADDR"] and os.environ["FEATURE_ADDR"] == "from-other:1"
    os.environ["RECMESH_CLI_ENV"] = str(tmp_path / "missing.env")
    with pytest.raises(CliEnvError, match=r"RECMESH_CLI_ENV=.*missing\.env: no such file"):
        load_cli_env()


@pytest.mark.usefixtures("environ")
def test_verbose_names_the_file_and_a_bad_one_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _state(tmp_path, "FEATURE_ADDR=127.0.0.1:1\n")
    assert main(["--verbose", "repository", "show"]) == 0
    assert f"recmesh: mesh settings from {path}: set FEATURE_ADDR\n" in capsys.readouterr().err
    path.write_text("FEATURE_ADDR=127.0.0.1:1\nnot an assignment\n")
    assert main(["repository", "show"]) == 2
    assert capsys.readouterr().err == f"recmesh: CliEnvError: {path} line 2: not NAME=value\n"


@pytest.mark.usefixtures("environ")
def test_commands_that_start_or_prepare_a_mesh_do_not_read_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up` would take the last run's REDIS_URL for an external Redis; `init` is for external
    ones. Nor do the processes they start (up's embed-items, a benchmark's `recmesh` runs)."""
    _state(tmp_path, "REDIS_URL=redis://127.0.0.1:1/0\nKAFKA_BOOTSTRAP=127.0.0.1:1\n")
    seen: dict[str, str | None] = {}

    async def run(settings: object, demo_events: int, fresh: bool = False) -> int:
        seen.update((name, os.environ.get(name)) for name in ("REDIS_URL", "RECMESH_CLI_ENV"))
        return 0

    monkeypatch.setattr("recmesh.tools.up.run", run)
    assert main(["--verbose", "up"]) == 0 and seen == {"REDIS_URL": None, "RECMESH_CLI_ENV": "off"}
    del os.environ["RECMESH_CLI_ENV"]
    assert main(["--verbose", "init"]) == 2
    err = capsys.readouterr().err
    assert "set REDIS_URL and KAFKA_BOOTSTRAP" in err and "mesh settings from" not in err
