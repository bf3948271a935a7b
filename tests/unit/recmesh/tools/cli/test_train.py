"""`recmesh train` refuses a log its label rule makes one class of, in one line, before any replay."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import orjson
import pytest

from recmesh.features.repository import DEMO_REPOSITORY
from recmesh.tools.cli.main import main as cli_main


def _log(path: Path, behaviors: list[str]) -> Path:
    t = 1_767_225_600_000
    with path.open("wb") as fh:
        for n, b in enumerate(behaviors):
            ev = {"event_id": f"e{n}", "user_id": f"u{n % 3}", "item_id": f"i{n % 7}", "behavior": b,
                  "event_time": t + n * 60_000}  # fmt: skip
            fh.write(orjson.dumps(ev) + b"\n")
    return path


@pytest.mark.parametrize(
    ("behaviors", "message"),
    [
        (["click"] * 12, "no event of these behaviours"),
        (["view"] * 12, "calls none of the 12 example events positive"),
    ],
)
def test_a_one_class_log_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], behaviors: list[str], message: str
) -> None:
    repo = tmp_path / "demo"
    shutil.copytree(DEMO_REPOSITORY.parent, repo)
    log = _log(tmp_path / "log.jsonl", behaviors)
    started = time.perf_counter()
    code = cli_main(["train", "--events", str(log), "--repository", str(repo / "recmesh.toml"),
                     "--model-dir", str(tmp_path / "models")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert time.perf_counter() - started < 5
    assert not (tmp_path / "models").exists()
