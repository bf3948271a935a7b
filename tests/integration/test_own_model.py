"""A model built outside `recmesh train` (ONNX written with onnx.helper, a Triton-style
config.toml) is validated, imported, activated and served from the features the
feature service serves, through the inference service's hot switch."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from recmesh.clients.inference import InferenceClient
from recmesh.features.repository import FeatureSet
from recmesh.features.vectorize import Vectorizer, transforms_from_card
from recmesh.features.wire import row_values, table_columns
from recmesh.settings import InferenceSettings
from recmesh.tools.cli.main import main as cli_main
from services.inference.model import ModelRegistry
from services.inference.server import build_server
from tests.helpers import free_port, poll_until
from tests.integration.conftest import Mesh

W = np.array([[0.8], [0.3], [1.5], [0.2], [-0.4], [0.1]], np.float32)
B = np.array([-1.0], np.float32)


def own_model(directory: Path, feature_set: FeatureSet, width: int = 6, feature: str = "clicks_10m") -> Path:
    """A logistic model over six columns, with two outputs: the score and its logit."""
    directory.mkdir(parents=True, exist_ok=True)
    weights = np.resize(W, (width, 1)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["logit"]),
            helper.make_node("Sigmoid", ["logit"], ["p"]),
        ],
        "team-model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["batch", 1]),
         helper.make_tensor_value_info("logit", TensorProto.FLOAT, ["batch", 1])],
        initializer=[numpy_helper.from_array(weights, "w"), numpy_helper.from_array(B, "b")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(directory / "model.onnx"))
    (directory / "config.toml").write_text(f"""
feature_set_version = "{feature_set.version}"
version = "team-logreg-1"
description = "a logistic regression trained elsewhere"

[input]
name = "x"

[[input.transforms]]
kind = "log1p"
feature = "{feature}"

[[input.transforms]]
kind = "log1p"
feature = "views_10m"

[[input.transforms]]
kind = "contains"
feature = "last_viewed_3"
of = "item_id"

[[input.transforms]]
kind = "one_hot"
feature = "category"
vocabulary = ["news", "sports", "tech"]

[output]
name = "p"
meaning = "P(click)"
""")
    return directory


@pytest.fixture
def own_dir(model_dir: Path, tmp_path: Path) -> Path:
    own = tmp_path / "models"
    shutil.copytree(model_dir, own)
    return own


async def test_an_outside_model_is_imported_activated_and_served(
    mesh: Mesh,
    own_dir: Path,
    demo_feature_set: FeatureSet,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    team = own_model(tmp_path / "team-model", demo_feature_set)
    registry = ModelRegistry(own_dir, feature_set=demo_feature_set)
    registry.load_current()
    server = build_server(
        InferenceSettings(inference_port=free_port(), model_dir=own_dir, batching=False), registry
    )
    await server.start()
    await server.set_serving()
    follower = asyncio.create_task(registry.follow(interval_s=0.05))
    client = InferenceClient(server.address, "test")
    try:
        assert cli_main(["models", "import", str(team), "--model-dir", str(own_dir)]) == 0
        assert cli_main(["models", "list", "--model-dir", str(own_dir), "--json"]) == 0
        listed = {v["version"]: v for v in json.loads(capsys.readouterr().out.strip().splitlines()[-1])}
        assert listed["team-logreg-1"]["origin"] == "imported" and not listed["team-logreg-1"]["current"]
        assert listed["team-logreg-1"]["fits"]
        assert cli_main(["models", "activate", "team-logreg-1", "--model-dir", str(own_dir)]) == 0
        await poll_until(lambda: asyncio.sleep(0, registry.model.version == "team-logreg-1"), "hot switch", 5)

        items = ["i1", "i2", "i3", "i4"]
        served = await mesh.feature_client.get_features("u42", items, 0, cap_s=2.0)
        scored = await client.score_features(demo_feature_set.version, served.user, served.items)
        assert scored.model_version == "team-logreg-1" and scored.level == 0
        card = json.loads((own_dir / "ctr" / "team-logreg-1" / "card.json").read_text())
        x = Vectorizer(transforms_from_card(card["input"]["transforms"])).matrix(
            [row_values(served.user)], table_columns(served.items), items, ["u42"]
        )
        want = 1 / (1 + np.exp(-(x @ W + B))).ravel()
        np.testing.assert_allclose(scored.scores, want, rtol=1e-5)
        # A degraded level asks for a variant the team did not ship: level 0 answers.
        assert (
            await client.score_features(demo_feature_set.version, served.user, served.items, level=3)
        ).level == 0
    finally:
        await client.close()
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        await server.stop(0.2)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"feature": "clicks_1y"}, "feature 'clicks_1y' is not declared in repository 'demo'"),
        ({"width": 7}, "input 'x' has shape"),
        ({"version": "fs-000000000000"}, "built on feature set 'fs-000000000000'"),
        ({"kind": "distribution"}, "distribution needs a count_by feature"),
    ],
)
def test_a_model_that_does_not_fit_is_refused_with_the_reason(
    own_dir: Path, demo_feature_set: FeatureSet, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    change: dict[str, object], says: str,
) -> None:  # fmt: skip
    team = own_model(tmp_path / "team", demo_feature_set, width=int(change.get("width", 6)),  # type: ignore[call-overload]
                     feature=str(change.get("feature", "clicks_10m")))  # fmt: skip
    config = team / "config.toml"
    if "version" in change:
        config.write_text(config.read_text().replace(demo_feature_set.version, str(change["version"])))
    if "kind" in change:
        old, new = 'kind = "log1p"\nfeature = "views_10m"', 'kind = "distribution"\nfeature = "views_10m"'
        config.write_text(config.read_text().replace(old, new))
    before = sorted(p.name for p in (own_dir / "ctr").iterdir())
    assert cli_main(["models", "import", str(team), "--model-dir", str(own_dir)]) == 2
    assert says in capsys.readouterr().err
    assert sorted(p.name for p in (own_dir / "ctr").iterdir()) == before, "nothing half-imported"
    assert cli_main(["models", "activate", "no-such-version", "--model-dir", str(own_dir)]) == 2
    assert "no model version 'no-such-version'" in capsys.readouterr().err
