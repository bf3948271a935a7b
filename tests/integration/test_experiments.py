"""Experiments on live traffic over real gRPC: a candidate version serves its sticky
share of users, a shadow candidate scores control answers without serving them and
its scores reach the impression record aligned with the items, a level experiment
serves its arm at that level, and a candidate that does not load leaves the
served model alone."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from aiokafka import AIOKafkaProducer

from recmesh.clients.inference import InferenceClient
from recmesh.clients.ranker import RankerClient
from recmesh.evaluation import impression
from recmesh.evaluation.experiment import new_experiment, write_experiment
from recmesh.features.repository import FeatureSet
from recmesh.modeldir import MODEL_NAME, current_model
from recmesh.settings import GatewaySettings, InferenceSettings, RankerSettings
from recmesh.tools.training.derive import derive_version
from services.gateway.app import GatewayDeps, create_app
from services.gateway.edge import ClassPolicy
from services.gateway.event_publisher import EventPublisher
from services.gateway.impressions import ImpressionLog
from services.gateway.recommend import Recommender
from services.inference.model import ModelRegistry
from services.inference.server import build_server as build_inference
from services.ranker.pipeline import build_pipeline
from services.ranker.server import build_server as build_ranker
from tests.helpers import free_port
from tests.integration.conftest import Mesh


@contextlib.asynccontextmanager
async def ranking(
    mesh: Mesh, model_dir: Path, feature_set: FeatureSet
) -> AsyncIterator[tuple[RankerClient, ModelRegistry]]:
    """An inference service on `model_dir` and a ranker on it and the mesh's feature service."""
    registry = ModelRegistry(model_dir, feature_set=feature_set)
    registry.load_current()
    inference = build_inference(InferenceSettings(inference_port=free_port(), model_dir=model_dir), registry)
    ic = InferenceClient(inference.address, "ranker")
    settings = RankerSettings(ranker_port=free_port(), model_dir=model_dir)
    ranker = build_ranker(settings, build_pipeline(settings, mesh.feature_client, ic, feature_set))
    for s in (inference, ranker):
        await s.start()
        await s.set_serving()
    rc = RankerClient(ranker.address, "gateway")
    try:
        yield rc, registry
    finally:
        await rc.close()
        await ic.close()
        for s in (ranker, inference):
            await s.stop(0.2)


def _no_producer() -> AIOKafkaProducer:
    raise AssertionError("the test reads the log's queue; nothing is produced")


async def test_split_shadow_and_level_arms_reach_the_impression(
    mesh: Mesh, model_dir: Path, demo_feature_set: FeatureSet, tmp_path: Path
) -> None:
    own = tmp_path / "models"
    shutil.copytree(model_dir, own)
    current = current_model(own)
    assert current is not None
    derive_version(own, current.name, "cand-copy")
    derive_version(own, current.name, "cand-shuffled", shuffle_seed=1)
    async with ranking(mesh, own, demo_feature_set) as (ranker, registry):
        users = [f"u{n}" for n in range(40)]
        exp = new_experiment("model", 50.0, candidate="cand-shuffled")
        write_experiment(own, exp)
        registry.load_current()  # what its follow loop does every 2 s
        answers = {u: await ranker.rank(u, 8, {}, 0) for u in users}
        for u, resp in answers.items():
            assert resp.arm == exp.arm(u)
            want = "cand-shuffled" if resp.arm == "candidate" else current.name
            assert resp.model_version == want, (u, resp.arm)
        assert 5 < sum(r.arm == "candidate" for r in answers.values()) < 35

        write_experiment(own, new_experiment("model", 0.0, candidate="cand-copy", shadow=True))
        registry.load_current()
        log = ImpressionLog(_no_producer, "impressions", 1.0)  # entries are read off its queue
        recommender = Recommender(ranker, mesh.feature_client, max_count=50, on_answer=log.offer)
        settings = GatewaySettings(gateway_grpc_port=free_port())
        publisher = EventPublisher("127.0.0.1:1", "unused", 1.0)  # no event is posted
        app = create_app(
            settings, GatewayDeps(recommender, ClassPolicy.from_settings(settings), publisher, {})
        )
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            for u in users[:5]:
                answer = await http.post("/v1/recommend", json={"user_id": u, "count": 8})
                assert answer.status_code == 200, answer.text
                shown = impression.parse(ImpressionLog._record(log._queue.get_nowait()).value)
                assert shown.group.arm == "control" and shown.shadow is not None
                assert shown.shadow.model_version == "cand-copy"
                assert len(shown.shadow.scores) == len(shown.items) == len(answer.json()["items"])
                assert any(s != 0.0 for s in shown.shadow.scores)

        level = new_experiment("level", 100.0, level=3)
        write_experiment(own, level)
        registry.load_current()
        resp = await ranker.rank("u1", 8, {}, 0)
        assert resp.arm == "level:3" and resp.model_version == current.name

        (own / MODEL_NAME / "cand-broken").mkdir()
        (own / MODEL_NAME / "cand-broken" / "card.json").write_text("{}")
        write_experiment(own, new_experiment("model", 100.0, candidate="cand-broken"))
        registry.load_current()
        resp = await ranker.rank("u1", 8, {}, 0)
        assert resp.arm == "control" and resp.model_version == current.name, "a bad candidate changes nothing"
        assert registry.experiment is None


def test_models_commands_start_show_replace_and_stop_experiments(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from recmesh.evaluation.experiment import read_experiment
    from recmesh.tools.cli.main import main as cli_main

    own = tmp_path / "models"
    shutil.copytree(model_dir, own)
    current = current_model(own)
    assert current is not None
    at = ["--model-dir", str(own)]
    assert cli_main(["models", "copy", current.name, "cand", "--shuffle-weights", "3", *at]) == 0
    assert cli_main(["models", "activate", "cand", "--share", "10", *at]) == 0
    first = read_experiment(own)
    assert first is not None and first.running and (first.candidate, first.share) == ("cand", 10.0)
    assert cli_main(["models", "experiment", *at]) == 0
    assert "model cand for 10% of users (running)" in capsys.readouterr().out
    assert cli_main(["models", "experiment", "--level", "2", "--share", "5", *at]) == 0
    second = read_experiment(own)
    assert second is not None and second.kind == "level" and f"ended {first.id}" in capsys.readouterr().out
    assert cli_main(["models", "experiment", "--stop", *at]) == 0
    stopped = read_experiment(own)
    assert stopped is not None and stopped.state == "stopped"
    assert cli_main(["models", "activate", current.name, "--share", "10", *at]) != 0
    assert "current version already" in capsys.readouterr().err
    assert cli_main(["models", "activate", "cand", "--share", "0", *at]) != 0
    assert "--shadow" in capsys.readouterr().err
    assert cli_main(["models", "activate", "cand", *at]) == 0
    now = current_model(own)
    assert now is not None and now.name == "cand"
