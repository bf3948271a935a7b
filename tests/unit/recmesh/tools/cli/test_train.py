"""`recmesh train` and `recmesh repository check` refuse what training would fail
on, in one line naming the repository file's line, before any replay."""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path

import orjson
import pytest

from recmesh.features.repository import DEMO_REPOSITORY
from recmesh.tools.cli.main import main as cli_main

PURCHASES = """
[repository]
name = "shop"

[events]
event_id = ""
user_id = "shopper"
item_id = "product"
behavior = { value = "purchase" }
event_time = "day"
time_unit = "iso8601"
behaviors = ["purchase", "return"]

[training]
examples = ["purchase"]
LABEL
"""


def _log(path: Path, behaviors: list[str], users: int = 3) -> Path:
    t = 1_767_225_600_000
    with path.open("wb") as fh:
        for n, b in enumerate(behaviors):
            ev = {"event_id": f"e{n}", "user_id": f"u{n % users}", "item_id": f"i{n % 7}", "behavior": b,
                  "event_time": t + n * 60_000}  # fmt: skip
            fh.write(orjson.dumps(ev) + b"\n")
    return path


def _shop(tmp_path: Path, label: str) -> Path:
    repo = tmp_path / "recmesh.toml"
    repo.write_text(PURCHASES.replace("LABEL", label))
    return repo


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    started = time.perf_counter()
    code = cli_main(argv)
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("warning")]
    assert code == 2 and len(err) == 1, err
    assert time.perf_counter() - started < 5
    return err[0]


@pytest.mark.parametrize(
    ("behaviors", "message"),
    [
        (["click"] * 12, "recmesh.toml:99: training.examples: the log has no event of ['view']"),
        (["view"] * 12, "calls none of the 12 example events positive"),
    ],
)
def test_a_one_class_log_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], behaviors: list[str], message: str
) -> None:
    repo = tmp_path / "demo"
    shutil.copytree(DEMO_REPOSITORY.parent, repo)
    log = _log(tmp_path / "log.jsonl", behaviors)
    err = _refused(capsys, ["train", "--events", str(log), "--repository", str(repo / "recmesh.toml"),
                            "--model-dir", str(tmp_path / "models")])  # fmt: skip
    assert message in err, err
    assert not (tmp_path / "models").exists()


@pytest.mark.parametrize(
    ("label", "line", "message"),
    [
        # The natural first try for a purchase log: an event never labels itself.
        ('label = { behaviors = ["purchase"], within = "0s" }', 16, "write label = { implicit = true }"),
        ("label = { implicit = true }", 14, "training.negatives: the label calls every one of the 12"),
    ],
)
def test_a_purchase_log_is_told_what_to_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], label: str, line: int, message: str
) -> None:
    repo = _shop(tmp_path, label)
    log = _log(tmp_path / "log.jsonl", ["purchase"] * 12)
    for argv in (["train", "--events", str(log)], ["repository", "check", str(log)]):
        err = _refused(capsys, [*argv, "--repository", str(repo)])
        assert f"{repo}:{line}:" in err and message in err, err


def test_no_user_with_a_positive_after_an_earlier_event_is_refused_for_ranking(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = _shop(tmp_path, "label = { implicit = true }\nnegatives = 2")
    log = _log(tmp_path / "log.jsonl", ["purchase"] * 4, users=4)  # one purchase per user
    err = _refused(capsys, ["train", "--events", str(log), "--ranking", "--repository", str(repo)])
    assert "no user has a positive example after an earlier event" in err, err


def test_check_warns_and_passes_a_valid_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = _shop(tmp_path, "label = { implicit = true }\nnegatives = 2")
    log = _log(tmp_path / "log.jsonl", ["purchase"] * 12)
    assert cli_main(["repository", "check", str(log), "--repository", str(repo), "--json"]) == 0
    out = orjson.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["errors"] == [] and out["events"] == 12
    assert any("['return'] declared and never seen" in w for w in out["warnings"]), out


def test_a_missing_file_is_one_line_and_verbose_shows_the_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = _shop(tmp_path, "label = { implicit = true }\nnegatives = 2")
    gone = tmp_path / "nope.jsonl"
    err = _refused(capsys, ["repository", "check", str(gone), "--repository", str(repo)])
    assert err == f"recmesh: {gone}: No such file or directory", err
    with pytest.raises(FileNotFoundError):
        cli_main(["--verbose", "repository", "check", str(gone), "--repository", str(repo)])


@pytest.mark.parametrize(
    ("text", "size"), [("2G", 2 << 30), ("512M", 512 << 20), ("1.5g", 3 << 29), ("4096", 4096)]
)
def test_max_memory_reads_sizes(text: str, size: int) -> None:
    from recmesh.tools.cli.train import memory_size

    assert memory_size(text) == size


@pytest.mark.parametrize("text", ["lots", "-1G", "0"])
def test_a_size_that_is_none_is_refused(text: str) -> None:
    import argparse

    from recmesh.tools.cli.train import memory_size

    with pytest.raises(argparse.ArgumentTypeError, match="want a"):
        memory_size(text)


def test_the_chunk_follows_max_memory_within_bounds() -> None:
    from recmesh.tools.cli.train import chunk_rows

    assert chunk_rows(2 << 30) == 16_384
    assert chunk_rows(1 << 20) == 4096 and chunk_rows(1 << 40) == 1 << 20


def test_an_engine_that_cannot_run_is_refused_before_the_log_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No scheduler at --engine-address: refused at once, not after the log's checks,
    learnt retrieval's build and the plan (minutes on a long log): the log named here
    does not even exist."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    repo = _shop(tmp_path, "label = { implicit = true }\nnegatives = 2")
    err = _refused(capsys, ["train", "--events", str(tmp_path / "not-written-yet.jsonl"), "--repository",
                            str(repo), "--model-dir", str(tmp_path / "models"), "--engine", "dask",
                            "--engine-address", f"tcp://127.0.0.1:{port}"])  # fmt: skip
    assert f"--engine-address tcp://127.0.0.1:{port}: no Dask scheduler answers" in err, err
    assert not (tmp_path / "models").exists()
