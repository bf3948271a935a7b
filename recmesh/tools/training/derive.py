"""A new model version from an existing one: a copy, or a copy with its weights shuffled.

`recmesh models copy VERSION NEW [--shuffle-weights SEED]`. A shuffled copy keeps
every tensor's shape and its values (so its scores have the same range and cost
the same) but not where they sit: what it learnt is gone. It is the fire drill
of online evaluation: served to a share of users, the guard must roll it back
(docs/operations.md, *Measuring models online*).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from recmesh.errors import FailedPrecondition, NotFound
from recmesh.modeldir import MODEL_NAME


def derive_version(model_dir: Path, version: str, new_version: str, shuffle_seed: int | None = None) -> Path:
    """MODEL_DIR/ctr/<new_version>: `version` copied, its card renamed (and marked
    `derived_from`), every float weight of every variant permuted when `shuffle_seed`."""
    root = model_dir / MODEL_NAME
    source, target = root / version, root / new_version
    if not (source / "card.json").exists():
        raise NotFound(f"no model version {version!r} in {root}")
    if target.exists():
        raise FailedPrecondition(f"{target} exists already: choose another name")
    shutil.copytree(source, target)
    card: dict[str, Any] = json.loads((target / "card.json").read_text())
    card["version"] = new_version
    card["derived_from"] = {"version": version, "shuffled_weights_seed": shuffle_seed}
    if shuffle_seed is not None:
        card["metrics"] = {"note": "weights shuffled: the source's metrics no longer hold"}
        for variant in card.get("variants", []):
            variant.pop("auc_holdout", None)
            _shuffle(target / variant["file"], np.random.default_rng(shuffle_seed + int(variant["level"])))
    (target / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    return target


def _shuffle(path: Path, rng: np.random.Generator) -> None:
    model = onnx.load(str(path))
    for init in model.graph.initializer:
        values = numpy_helper.to_array(init)
        if values.dtype.kind != "f" or values.size < 2:
            continue
        shuffled = rng.permutation(values.reshape(-1)).reshape(values.shape)
        init.CopyFrom(numpy_helper.from_array(shuffled.astype(values.dtype), init.name))
    onnx.save(model, str(path))
