"""What `recmesh up` keeps across runs: the catalog reload rule, the embedded Redis's
persistence arguments and data files, `--fresh`, demo event ids, the banner's note,
and the bench's persistence comparison."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from recmesh.settings import UpSettings
from recmesh.tools.bench.features import persistence_cost
from recmesh.tools.cli.main import main
from recmesh.tools.demo.live import demo_events
from recmesh.tools.localinfra import REDIS_PERSISTENCE, redis_data, redis_process, remove_redis_data
from recmesh.tools.up import Mesh, catalog_reload_reason, restart_note


def _loaded(at_ms: int, name: str = "demo", version: str = "v1") -> dict[str, str]:
    return {"name": name, "version": version, "loaded_at_ms": str(at_ms)}


def test_the_catalog_is_loaded_again_only_when_redis_lacks_the_current_one(tmp_path: Path) -> None:
    users, items = tmp_path / "users.csv", tmp_path / "items.csv"
    users.write_text("user_id\n")
    items.write_text("item_id\n")
    for path in (users, items):
        os.utime(path, ns=(1_000_000_000_000, 1_000_000_000_000))  # written at 1,000,000 ms
    sources = [users, items, None]
    assert catalog_reload_reason(_loaded(2_000_000), "demo", "v1", sources) is None
    assert catalog_reload_reason({}, "demo", "v1", sources) == "no catalog in Redis"
    assert "'shop' v1" in str(catalog_reload_reason(_loaded(2_000_000, name="shop"), "demo", "v1", sources))
    assert "v0" in str(catalog_reload_reason(_loaded(2_000_000, version="v0"), "demo", "v1", sources))
    assert (
        catalog_reload_reason(_loaded(1_000_000), "demo", "v1", sources)
        == "users.csv changed since it was loaded"
    )
    no_time = {"name": "demo", "version": "v1"}
    assert catalog_reload_reason(no_time, "demo", "v1", sources) == "the catalog in Redis has no load time"
    # A source that is gone: the load reports it.
    assert catalog_reload_reason(_loaded(2_000_000), "demo", "v1", [tmp_path / "gone.csv"]) is None


def test_each_persistence_mode_keeps_what_it_says(tmp_path: Path) -> None:
    def argv(mode: str) -> list[str]:
        return list(redis_process(1, tmp_path / mode, tmp_path, persistence=mode).argv)

    rdb, aof, off = argv("rdb"), argv("aof"), argv("off")
    assert " ".join(REDIS_PERSISTENCE["rdb"]) in " ".join(rdb)
    assert "300 1" in " ".join(rdb) and rdb[rdb.index("--appendonly") + 1] == "no", "snapshots, no AOF"
    assert aof[aof.index("--appendonly") + 1] == "yes" and aof[aof.index("--save") + 1] == "", "AOF only"
    assert off.count("--save") == 1 and off[off.index("--save") + 1] == "" and "--appendfsync" not in off


def test_fresh_deletes_the_data_and_keeps_the_aclfile(tmp_path: Path) -> None:
    for name in ("appendonly.aof", "dump.rdb", "temp-rewriteaof-bg-7.aof", "temp-9.rdb", "users.acl"):
        (tmp_path / name).write_text("x")
    (tmp_path / "appendonlydir").mkdir()  # Redis 7's AOF
    (tmp_path / "appendonlydir" / "appendonly.aof.1.base.rdb").write_text("x")
    names = ["appendonly.aof", "appendonlydir", "dump.rdb", "temp-9.rdb", "temp-rewriteaof-bg-7.aof"]
    assert [p.name for p in redis_data(tmp_path)] == names
    assert [p.name for p in remove_redis_data(tmp_path)] == names
    assert [p.name for p in tmp_path.iterdir()] == ["users.acl"] and remove_redis_data(tmp_path) == []


def test_up_passes_fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RECMESH_STATE_DIR", str(tmp_path))
    seen: list[bool] = []

    async def run(settings: object, demo_events: int, fresh: bool = False) -> int:
        seen.append(fresh)
        return 0

    monkeypatch.setattr("recmesh.tools.up.run", run)
    assert main(["up"]) == 0 and main(["up", "--fresh"]) == 0 and seen == [False, True]


def test_demo_events_of_two_runs_never_share_an_id() -> None:
    """The ingest's per-user id sets survive a restart: a run's demo events must not
    be taken for the last run's (same seed, a millisecond apart)."""
    first = {e.event_id for e in demo_events(300, seed=5, end_ms=1_767_225_600_000)}
    second = {e.event_id for e in demo_events(300, seed=5, end_ms=1_767_225_600_001)}
    assert len(first) == 300 and not first & second


def test_the_banner_says_what_a_restart_keeps(tmp_path: Path) -> None:
    embedded = restart_note(Mesh(UpSettings(state_dir=tmp_path)))
    assert str(tmp_path / "redis") in embedded and "--fresh" in embedded
    assert "real-time windows" in embedded and "consumer offsets do not survive" in embedded
    external = restart_note(
        Mesh(UpSettings(state_dir=tmp_path, redis_url="redis://r:6379/0", kafka_bootstrap="k:9092"))
    )
    assert "REDIS_URL" in external and "KAFKA_BOOTSTRAP" in external and "--fresh" not in external


def test_persistence_cost_is_the_ratio_per_round() -> None:
    def figures(ingest: float, p99: float) -> dict[str, Any]:
        base = {k: 1.0 for k in ("freshness_p50_ms", "lookup_p50_ms", "lookup_p99_ms", "raw_redis_p50_ms")}
        return {**base, "ingest_events_per_s": ingest, "freshness_p99_ms": p99}

    rounds = [
        {"off": figures(100.0, 10.0), "aof": figures(90.0, 12.0)},
        {"aof": figures(80.0, 10.0), "off": figures(100.0, 10.0)},
    ]
    cost = persistence_cost(rounds, "aof")
    expected = {"median": 0.85, "low": 0.8, "high": 0.9, "rounds": 2}
    assert cost["ingest_events_per_s"] == pytest.approx(expected)
    assert cost["freshness_p99_ms"]["high"] == pytest.approx(1.2)
    assert cost["lookup_p50_ms"]["median"] == 1.0


def test_bench_compare_runs_every_configuration_in_rotating_order(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from recmesh.tools.bench import features

    ran: list[str] = []

    async def run(*args: Any, persistence: str = "off") -> dict[str, Any]:
        ran.append(persistence)
        targets = {k: 1.0 for k in features.TARGETS}
        scale = {"off": 1.0, "rdb": 1.5, "aof": 2.0}[persistence]
        return targets | {k: scale for k in features.PERSISTENCE_FIGURES} | {"ingest_lost": 0}

    monkeypatch.setattr(features, "run", run)
    monkeypatch.setattr(features, "table", lambda f: "")
    monkeypatch.delenv("REDIS_URL", raising=False)
    args = SimpleNamespace(redis_persistence="compare", repeat=3, json=True, events=1, lookups=1, items=1,
                           concurrency=1, rate=1, seconds=1.0, served_rate=1.0)  # fmt: skip
    assert features.main(args) == 0
    assert ran == ["off", "rdb", "aof", "aof", "rdb", "off", "off", "rdb", "aof"]
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert set(out) == {"off", "rdb", "aof", "persistence_cost"}
    assert out["persistence_cost"]["rdb"]["ingest_events_per_s"]["median"] == 1.5
    assert out["persistence_cost"]["aof"]["ingest_events_per_s"] == {
        "median": 2.0,
        "low": 2.0,
        "high": 2.0,
        "rounds": 3,
    }
