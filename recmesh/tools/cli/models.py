"""`recmesh models list | import | activate | experiment`: the served model's versions, a team's own
model, and experiments on live traffic.

A model directory a team brings holds an ONNX file and a `config.toml` in the
spirit of Triton's model configuration: the ONNX input's name and, for its
columns, the declared features and transforms that make them
(recmesh/features/vectorize.py), the output, and the feature-set version it
was built on. `import` validates all of it against the file (ONNX Runtime
loads it; the input takes [batch, columns]) and against the served repository
(every feature declared, with a type its transform reads; the same version),
and copies it into MODEL_DIR/ctr/<version>/ with a card; `activate` writes
MODEL_DIR/ctr/CURRENT, which the inference service follows without a restart;
`activate VERSION --share 10 [--shadow]` instead starts an experiment
(MODEL_DIR/ctr/EXPERIMENT, recmesh/evaluation/experiment.py): the version
serves a sticky share of users, and with --shadow scores the others' answers
too without serving them; `experiment --level 2 --share 10` serves a share at a
degradation level; `experiment` says what runs, `experiment --stop` ends it.
The guard of `[evaluation.guard]` promotes or rolls back by itself.

    # config.toml
    feature_set_version = "fs-e9e0cf552453"
    version = "gbdt-2026-12"             # optional: default, a hash of the files
    [input]
    name = "features"
    [[input.transforms]]
    kind = "log1p"
    feature = "clicks_5m"                # entity, name and default come from the repository
    [[input.transforms]]
    kind = "one_hot"
    feature = "category"
    vocabulary = ["news", "sports"]
    [output]
    name = "score"
    meaning = "P(click)"
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import time
import tomllib
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from recmesh.errors import FailedPrecondition, InvalidArgument, NotFound
from recmesh.evaluation.experiment import Experiment, State, new_experiment, read_experiment, write_experiment
from recmesh.evaluation.guard import shadow_only
from recmesh.features.repository import FeatureSet
from recmesh.features.vectorize import KINDS, Transform, Vectorizer, check_against
from recmesh.modeldir import MODEL_NAME, current_model, point_current, variant_file


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TransformConfig(_Strict):
    kind: str
    feature: str
    entity: str | None = None
    name: str | None = None
    of: str | None = None
    vocabulary: list[str] = Field(default_factory=list)
    buckets: int = 0
    length: int = 0
    default: Any = None


class InputConfig(_Strict):
    name: str
    transforms: list[TransformConfig] = Field(min_length=1)


class OutputConfig(_Strict):
    name: str
    meaning: str = ""


class ModelConfig(_Strict):
    feature_set_version: str
    version: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    description: str = ""
    file: str = "model.onnx"
    input: InputConfig
    output: OutputConfig


def _model_dir(args: argparse.Namespace) -> Path:
    from recmesh.settings import InferenceSettings

    return Path(args.model_dir) if args.model_dir else InferenceSettings().model_dir


def transforms_of(config: ModelConfig, feature_set: FeatureSet, where: Path) -> tuple[Transform, ...]:
    """The config's transforms, completed from the repository (entity, name, defaults)."""
    out = []
    for n, t in enumerate(config.input.transforms):
        key = f"{where}: input.transforms[{n}]"
        if t.kind not in KINDS:
            raise InvalidArgument(f"{key}: unknown kind {t.kind!r}; known: {', '.join(KINDS)}")
        f = feature_set.by_name.get(t.feature)
        if f is None and t.feature not in ("item_id", "user_id"):
            raise InvalidArgument(
                f"{key}: feature {t.feature!r} is not declared in repository {feature_set.name!r}"
            )
        entity = t.entity or (f.entity if f is not None else t.feature.split("_")[0])
        of_f = feature_set.by_name.get(t.of) if t.of else None
        out.append(
            Transform(
                kind=t.kind, feature=t.feature, entity=entity,  # type: ignore[arg-type]
                name=t.name or f"{entity[0]}_{t.feature}_{t.kind}",
                of=t.of, vocabulary=tuple(t.vocabulary), buckets=t.buckets, length=t.length,
                default=t.default if t.default is not None else (f.default if f is not None else None),
                of_default=of_f.default if of_f is not None else None,
            )
        )  # fmt: skip
    return tuple(out)


def read_config(directory: Path, feature_set: FeatureSet) -> tuple[ModelConfig, tuple[Transform, ...]]:
    where = directory / "config.toml"
    try:
        raw = tomllib.loads(where.read_text())
    except OSError as err:
        raise InvalidArgument(f"{where}: cannot read it ({err.strerror or err}); a model directory holds "
                              "an ONNX file and a config.toml") from None  # fmt: skip
    except tomllib.TOMLDecodeError as err:
        raise InvalidArgument(f"{where}: not valid TOML: {err}") from None
    try:
        config = ModelConfig.model_validate(raw)
    except ValidationError as err:
        msgs = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()]
        raise InvalidArgument(f"{where}: " + "; ".join(msgs)) from None
    if config.feature_set_version != feature_set.version:
        raise FailedPrecondition(
            f"{where}: the model was built on feature set {config.feature_set_version!r}, the served "
            f"repository {feature_set.name!r} is {feature_set.version!r}"
        )
    transforms = transforms_of(config, feature_set, where)
    problems = check_against(transforms, feature_set)
    if problems:
        raise FailedPrecondition(f"{where}: " + "; ".join(problems))
    return config, transforms


def import_model(directory: Path, model_dir: Path, feature_set: FeatureSet) -> dict[str, Any]:
    """Validate a team's model directory and copy it in as a version; returns its card."""
    from services.inference.model import load_variant, read_card, session_options

    config, transforms = read_config(directory, feature_set)
    onnx_file = directory / config.file
    if not onnx_file.exists():
        raise InvalidArgument(f"{directory}: no {config.file} (config.toml's `file`)")
    vec = Vectorizer(transforms)
    digest = hashlib.sha256(onnx_file.read_bytes() + (directory / "config.toml").read_bytes()).hexdigest()[
        :12
    ]
    version = config.version or f"{MODEL_NAME}-imported-{digest}"
    out = model_dir / MODEL_NAME / version
    if out.exists():
        raise FailedPrecondition(f"version {version!r} already exists in {model_dir / MODEL_NAME}")
    card: dict[str, Any] = {
        "name": MODEL_NAME,
        "version": version,
        "feature_set_version": feature_set.version,
        "repository": feature_set.name,
        "origin": "imported",
        "description": config.description,
        "input": {
            "name": config.input.name,
            "columns": vec.columns,
            "transforms": [t.to_json() for t in transforms],
        },
        "output": {"name": config.output.name, "meaning": config.output.meaning},
        "variants": [{"level": 0, "file": variant_file(0), "file_bytes": onnx_file.stat().st_size}],
        "imported_from": str(directory.resolve()),
        "imported_at_ms": int(time.time() * 1000),
    }
    staging = model_dir / MODEL_NAME / f".{version}.importing"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        shutil.copy(onnx_file, staging / variant_file(0))
        (staging / "card.json").write_text(json.dumps(card, indent=2) + "\n")
        read_card(staging, feature_set)  # the card as the inference service will read it
        load_variant(staging, 0, config.input.name, vec.width, session_options(), config.output.name)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return card


def versions(model_dir: Path) -> list[dict[str, Any]]:
    root = model_dir / MODEL_NAME
    current_file = root / "CURRENT"
    current = current_file.read_text().strip() if current_file.exists() else None
    out = []
    for card_path in sorted(root.glob("*/card.json")):
        try:
            card = json.loads(card_path.read_text())
        except (OSError, ValueError):
            continue
        out.append({
            "version": card.get("version", card_path.parent.name),
            "current": card_path.parent.name == current,
            "origin": card.get("origin", "unknown"), "feature_set_version": card.get("feature_set_version"),
            "repository": card.get("repository"), "auc_holdout": card.get("metrics", {}).get("auc_holdout"),
            "variants": [v["level"] for v in card.get("variants", [])],
            "modified_ms": int(card_path.stat().st_mtime * 1000),
        })  # fmt: skip
    return sorted(out, key=lambda v: v["modified_ms"])


def activate(model_dir: Path, version: str, feature_set: FeatureSet) -> Path:
    """Point CURRENT at `version` after checking it loads for the served repository."""
    check_version(model_dir, version, feature_set)
    return point_current(model_dir, version)


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not 0.0 <= value <= 100.0:
        raise argparse.ArgumentTypeError(f"{value:g} is not a percentage (0-100)")
    return value


def check_version(model_dir: Path, version: str, feature_set: FeatureSet) -> Path:
    """The version's directory, after checking it loads for the served repository (as inference will)."""
    from services.inference.model import load

    path = model_dir / MODEL_NAME / version
    if not (path / "card.json").exists():
        known = ", ".join(v["version"] for v in versions(model_dir)) or "none"
        raise NotFound(f"no model version {version!r} in {model_dir / MODEL_NAME} (versions: {known})")
    load(path, 1, feature_set)  # the inference service's own load: card, transforms, every variant
    return path


def _cmd_list(args: argparse.Namespace) -> int:
    from recmesh.tools.cli.common import repository

    feature_set = repository(args)
    rows = versions(_model_dir(args))
    if args.json:
        print(json.dumps([{**r, "fits": r["feature_set_version"] == feature_set.version} for r in rows]))
        return 0
    if not rows:
        print(f"no model versions in {_model_dir(args) / MODEL_NAME}")
        return 0
    print(f"{'':2}{'version':<28} {'origin':<12} {'feature set':<16} {'fits':<5} {'AUC':>7}  levels")
    for r in rows:
        fits = "yes" if r["feature_set_version"] == feature_set.version else "no"
        auc = f"{r['auc_holdout']:.4f}" if isinstance(r["auc_holdout"], float) else "-"
        print(f"{'*' if r['current'] else ' '} {r['version']:<28} {r['origin']:<12} "
              f"{r['feature_set_version'] or '?':<16} {fits:<5} {auc:>7}  {r['variants']}")  # fmt: skip
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from recmesh.tools.cli.common import repository

    feature_set = repository(args)
    card = import_model(Path(args.directory), _model_dir(args), feature_set)
    print(f"imported {card['version']} ({len(card['input']['columns'])} input columns) into "
          f"{_model_dir(args) / MODEL_NAME}")  # fmt: skip
    if args.activate:
        activate(_model_dir(args), card["version"], feature_set)
        print(f"activated {card['version']}: the inference service switches to it within its poll (2 s)")
    return 0


def _cmd_activate(args: argparse.Namespace) -> int:
    from recmesh.tools.cli.common import repository

    model_dir = _model_dir(args)
    if args.share is None and not args.shadow:
        path = activate(model_dir, args.version, repository(args))
        ended = _end_running(model_dir, "stopped", f"{args.version} activated by hand")
        print(f"activated {args.version} ({path}): the inference service switches to it within its poll (2 s)"
              + (f"; ended {ended.id}" if ended else ""))  # fmt: skip
        return 0
    check_version(model_dir, args.version, repository(args))
    current = current_model(model_dir)
    if current is not None and current.name == args.version:
        raise FailedPrecondition(f"{args.version} is the current version already: nothing to compare it with")
    try:
        exp = new_experiment("model", args.share or 0.0, candidate=args.version, shadow=args.shadow)
    except ValueError as err:
        raise InvalidArgument(str(err)) from None
    _start(model_dir, exp)
    return 0


def _start(model_dir: Path, exp: Experiment) -> None:
    ended = _end_running(model_dir, "stopped", f"replaced by {exp.id}")
    write_experiment(model_dir, exp)
    print(f"started {exp.describe()}" + (f"; ended {ended.id}" if ended else ""))
    decides = "validates or rolls back this shadow" if shadow_only(exp) else "promotes or rolls it back"
    print("the inference service follows it within its poll (2 s); figures: "
          f"`recmesh eval online --by model_version,arm`; [evaluation.guard], when declared, "
          f"{decides}")  # fmt: skip


def _end_running(model_dir: Path, state: State, reason: str) -> Experiment | None:
    exp = read_experiment(model_dir)
    if exp is None or not exp.running:
        return None
    write_experiment(model_dir, exp.ended(state, reason))
    return exp


def _cmd_copy(args: argparse.Namespace) -> int:
    from recmesh.tools.training.derive import derive_version

    path = derive_version(_model_dir(args), args.version, args.new_version, args.shuffle_weights, args.invert)
    what = (
        f"with its weights shuffled (seed {args.shuffle_weights})" if args.shuffle_weights is not None else ""
    )
    what += " scoring backwards" if args.invert else ""
    print(f"copied {args.version} to {args.new_version} {what} ({path})")
    return 0


def _cmd_experiment(args: argparse.Namespace) -> int:
    model_dir = _model_dir(args)
    if args.stop:
        ended = _end_running(model_dir, "stopped", "stopped by hand")
        print(
            f"stopped {ended.id}: every user is served the current version" if ended else "no experiment runs"
        )
        return 0
    if args.level is not None:
        try:
            exp = new_experiment("level", args.share or 0.0, level=args.level)
        except ValueError as err:
            raise InvalidArgument(str(err)) from None
        _start(model_dir, exp)
        return 0
    found = read_experiment(model_dir)
    if args.json:
        print(json.dumps(None if found is None else asdict(found)))
        return 0
    print("no experiment has run" if found is None else found.describe()
          + (f": {found.reason}" if found.reason else ""))  # fmt: skip
    return 0


def add_commands(sub: Any) -> None:
    models = sub.add_parser("models", help="model versions: list, import your own, activate").add_subparsers(
        dest="models_command", required=True
    )
    helps = {
        "list": "the versions in MODEL_DIR, the current one starred, whether each fits the repository",
        "import": "validate a model directory (ONNX + config.toml) and add it as a version",
        "activate": "make a version current (the inference service switches without a restart), or with "
        "--share/--shadow try it on live traffic first",
        "copy": "a new version from one (--shuffle-weights: a fire drill for the guard)",
        "experiment": "the experiment on live traffic: what runs (no options), a degradation level for a "
        "share of users (--level N --share P), or --stop",
    }
    commands = (("list", _cmd_list), ("import", _cmd_import), ("activate", _cmd_activate),
                ("copy", _cmd_copy), ("experiment", _cmd_experiment))  # fmt: skip
    for name, func in commands:
        help_ = helps[name]
        p = models.add_parser(name, help=help_)
        if name == "import":
            p.add_argument("directory", help="a directory with the ONNX file and config.toml")
            p.add_argument("--activate", action="store_true", help="make it current once imported")
        if name == "activate":
            p.add_argument("version")
            p.add_argument("--share", type=_percent, help="serve it to this percentage of users (sticky by "
                           "user id) instead of making it current")  # fmt: skip
            p.add_argument("--shadow", action="store_true", help="score the other users' answers with it "
                           "too, without serving its order, and log its scores")  # fmt: skip
        if name == "copy":
            p.add_argument("version")
            p.add_argument("new_version")
            shuffle_help = "permute every weight tensor: same shapes and scales, nothing learnt"
            p.add_argument("--shuffle-weights", type=int, metavar="SEED", help=shuffle_help)
            p.add_argument("--invert", action="store_true", help="negate its output: it serves backwards")
        if name == "experiment":
            p.add_argument("--level", type=int, choices=(1, 2, 3), help="serve this degradation level")
            p.add_argument("--share", type=_percent, help="to this percentage of users (with --level)")
            p.add_argument("--stop", action="store_true", help="end the running experiment")
        p.add_argument("--model-dir", help="default: RECMESH_MODEL_DIR or .recmesh/models")
        p.add_argument(
            "--repository", help="the repository file (default: RECMESH_REPOSITORY, else the demo's)"
        )
        if name in ("list", "experiment"):
            p.add_argument("--json", action="store_true")
        p.set_defaults(func=func)
