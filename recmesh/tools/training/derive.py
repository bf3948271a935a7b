"""A new model version from an existing one: a copy, a copy with its weights shuffled, or
one that scores backwards.

`recmesh models copy VERSION NEW [--shuffle-weights SEED | --invert]`: fire drills for
online evaluation and its guard (docs/operations.md, *Measuring models online*).
- A shuffled copy keeps every tensor's shape and values but not where they sit: what it
  learnt is gone. Its scores can collapse to one value (a saturated output), and an
  answer whose scores tie keeps the recall order, so it need not serve worse.
- An inverted copy negates the model's output: it puts first what the model puts last,
  which serves worse wherever the model's order is served.
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


def derive_version(
    model_dir: Path, version: str, new_version: str, shuffle_seed: int | None = None, invert: bool = False
) -> Path:
    """MODEL_DIR/ctr/<new_version>: `version` copied, its card renamed (and marked
    `derived_from`), every float weight of every variant permuted when `shuffle_seed`,
    every variant's output negated when `invert`."""
    root = model_dir / MODEL_NAME
    source, target = root / version, root / new_version
    if not (source / "card.json").exists():
        raise NotFound(f"no model version {version!r} in {root}")
    if target.exists():
        raise FailedPrecondition(f"{target} exists already: choose another name")
    shutil.copytree(source, target)
    card: dict[str, Any] = json.loads((target / "card.json").read_text())
    card["version"] = new_version
    card["derived_from"] = {"version": version, "shuffled_weights_seed": shuffle_seed, "inverted": invert}
    if shuffle_seed is not None or invert:
        card["metrics"] = {"note": "derived: the source's metrics no longer hold"}
        for variant in card.get("variants", []):
            variant.pop("auc_holdout", None)
            path = target / variant["file"]
            if shuffle_seed is not None:
                _shuffle(path, np.random.default_rng(shuffle_seed + int(variant["level"])))
            if invert:
                _invert(path)
    (target / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    return target


def _invert(path: Path) -> None:
    model = onnx.load(str(path))
    for out in model.graph.output:
        raw = f"{out.name}__before_inversion"
        for node in model.graph.node:
            node.output[:] = [raw if o == out.name else o for o in node.output]
        model.graph.node.append(onnx.helper.make_node("Neg", [raw], [out.name]))
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _shuffle(path: Path, rng: np.random.Generator) -> None:
    model = onnx.load(str(path))
    for init in model.graph.initializer:
        values = numpy_helper.to_array(init)
        if values.dtype.kind != "f" or values.size < 2:
            continue
        shuffled = rng.permutation(values.reshape(-1)).reshape(values.shape)
        init.CopyFrom(numpy_helper.from_array(shuffled.astype(values.dtype), init.name))
    onnx.save(model, str(path))
