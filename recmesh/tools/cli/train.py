"""`recmesh train`: the model family on a team's event log (or the demo's), and
with --ranking the served ranking's quality on held-out examples."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recmesh.errors import InvalidArgument
from recmesh.heap import give_back
from recmesh.tools.cli.common import print_figures


def _ranking_dir() -> Path:
    from recmesh.settings import UpSettings

    return UpSettings().state_dir / "ranking"


# What one replayed example holds in memory (its user and item features) until
# its chunk is written out, about, with the heap it leaves behind: `--max-memory`
# sizes the chunk by it. The chunk is a small share of the memory allowed
# (CHUNK_SHARE): the replay's window state is allocated between chunks, in the
# pools a written chunk's examples freed, and keeps them, so the replay's
# process holds about a chunk beyond its state however large the log (a 400 k
# event shop log: 392 MB resident at the replay's end with chunks of 262,144
# examples, 317 MB with 16,384, and no slower).
EXAMPLE_BYTES = 2048
CHUNK_SHARE = 64
SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def memory_size(text: str) -> int:
    """Bytes of '512M', '2G', '1.5G' or a plain number."""
    raw = text.strip().upper().removesuffix("B")
    unit = raw[-1:] if raw[-1:] in SIZE_UNITS else ""
    try:
        value = float(raw[: len(raw) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want a size such as 512M or 2G") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: want a positive size")
    return int(value * SIZE_UNITS[unit])


def chunk_rows(max_memory: int) -> int:
    """Examples per replayed chunk: a 64th of the memory allowed, 4,096 to 1,048,576
    (16,384 at the default 2G)."""
    return max(4096, min(1 << 20, max_memory // CHUNK_SHARE // EXAMPLE_BYTES))


def _metered(events: Iterable[Any], total: int, say: Any) -> Iterator[Any]:
    from recmesh.tools.catalog import progress_bar

    bar = progress_bar(say, "replay", total, "events")
    for n, ev in enumerate(events, start=1):
        if n % 10_000 == 0 or n == total:
            bar(n)
        yield ev


def check_or_refuse(
    feature_set: Any, events: Sequence[Any], users: Any, items: Any, ranking: bool, say: Any
) -> None:
    """Refuse in one line, before minutes of replay, what training would fail on
    (recmesh.features.check); say the warnings and carry on."""
    from recmesh.features.check import check_log, errors

    found = check_log(feature_set, events, users, items, ranking=ranking)
    for f in found:
        if f.level == "warning":
            say(f"warning: {f.text()}")
    bad = errors(found)
    if bad:
        raise InvalidArgument(bad[0].text())


def _target(feature_set: Any, given: list[str] | None) -> frozenset[str] | None:
    """--target: the behaviours whose last positive example is held out (default: any example)."""
    from recmesh.features.backfill import LabelRule

    if not given:
        return None
    examples = LabelRule.of(feature_set).examples
    wrong = sorted(set(given) - examples)
    if wrong:
        raise InvalidArgument(
            f"--target {wrong}: not among training.examples {sorted(examples)} of {feature_set.path} "
            "(a target is a positive example)"
        )
    return frozenset(given)


def _tune_blend(
    tuned: Any, inputs: Any, probe: Any, model_dir: Path, version: str, say: Any
) -> dict[str, Any]:
    """The model/recall blend for the recall version, tuned on retrieval's tuning
    users (`inputs`: their candidates and features, computed beside) with the
    trained model's full variant (`probe`: trained without those users'
    held-out parts: a model that has seen a target would claim it); then the
    version becomes current beside the model."""
    from recmesh.retrieval import files as recall_files
    from recmesh.tools.training import recall

    changes: dict[str, Any] = {}
    if tuned.hold is not None and inputs:
        changes = recall.tune_blend(tuned, inputs, probe, model_dir, version, say)
    recall_files.set_current(model_dir, version)
    return changes


@dataclass
class _Training:
    """What `recmesh train` trains on and where it goes: the rows replayed from
    the log (None: the demo generator's), the held-out split (--ranking), the
    learnt retrieval built from the same log and its tuning."""

    model_dir: Path
    dataset: Any = None
    split: Any = None
    recall_card: dict[str, Any] | None = None
    tuned: Any = None
    hold: Any = None  # learnt retrieval's tuning split (its users' held-out parts are not trained on)
    retrieval: Any = None  # learnt retrieval's build, running beside the replay and the training
    blend_inputs: Any = None  # what the blend's probe scores (recall.blend_inputs), computed beside too
    rows_dir: Path | None = None  # the rows on disk while training (removed after)
    replay_seconds: float | None = None  # the log replayed into rows (the engine's part)


def _cmd_train(args: argparse.Namespace) -> int:
    from recmesh.settings import InferenceSettings
    from recmesh.tools.cli.common import repository
    from recmesh.tools.training.train import TrainConfig

    feature_set = repository(args)
    model_dir = Path(args.model_dir) if args.model_dir else InferenceSettings().model_dir
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else print
    cfg = TrainConfig(seed=args.seed, sessions=args.sessions, epochs=args.epochs)
    if args.ranking and not args.events:
        raise InvalidArgument(
            "--ranking needs the event log (--events LOG) to hold users' last examples out of"
        )
    if args.engine == "single" and (args.engine_address or args.partitions):
        raise InvalidArgument("--engine-address and --partitions are for --engine dask")
    if args.engine != "single" and not args.events:
        raise InvalidArgument(f"--engine {args.engine} replays an event log: give it with --events LOG")
    if args.workers < 1 or args.jobs < 1 or (args.partitions is not None and args.partitions < 1):
        raise InvalidArgument("--workers, --jobs and --partitions: at least 1")
    if not args.events and not feature_set.demo:
        raise InvalidArgument(f"repository {feature_set.name!r}: give your event log with --events LOG")
    run = _Training(model_dir)
    try:
        if args.events:
            run = _from_log(args, feature_set, model_dir, run, say)
            give_back()  # the replay's buffers, and the log's columns unless --ranking holds its split
        return _train_run(args, cfg, feature_set, run, say)
    finally:
        if run.retrieval is not None:
            run.retrieval.cancel()
        if run.rows_dir is not None:
            shutil.rmtree(run.rows_dir, ignore_errors=True)


def _train_run(args: argparse.Namespace, cfg: Any, feature_set: Any, run: _Training, say: Any) -> int:
    from recmesh.tools.training.train import train

    hold = run.hold
    unseen = hold.as_of if hold is not None and any(u in hold.history for u in hold.targets) else None
    if unseen:
        say(f"the {len(unseen):,} tuning users' held-out parts are left out of the model's training rows: "
            "its full variant tunes the blend")  # fmt: skip
    fitted = train(cfg, run.model_dir, feature_set, run.dataset, progress=say, unseen=unseen,
                   late_source=functools.partial(_retrieval_built, run, say), jobs=args.jobs)  # fmt: skip
    card = fitted.card
    recall_card = run.recall_card
    if recall_card is not None and run.tuned is not None and run.dataset is not None:
        version = recall_card["version"]
        recall_card |= _tune_blend(run.tuned, run.blend_inputs, fitted.probe, run.model_dir, version, say)
    figures = _figures(card, recall_card)
    if run.replay_seconds is not None:
        figures["replay_seconds"] = run.replay_seconds
    if run.split is not None:
        figures["ranking"] = _rank_held_out(args, feature_set, run.split, card["version"], run.model_dir, say)
    print_figures(figures, args.json, f"model {card['version']}: AUC {figures['auc_holdout']} "
                  f"(offline-only {figures['auc_holdout_offline_only']})")  # fmt: skip
    return 0


def _from_log(
    args: argparse.Namespace, feature_set: Any, model_dir: Path, run: _Training, say: Any
) -> _Training:
    """Training rows replayed from --events (with --ranking, from its training
    part, the model going to the ranking state), and learnt retrieval from the
    same events when the repository declares it."""
    from recmesh.features.eventlog import load_log
    from recmesh.features.tabular import read_catalog
    from recmesh.settings import UpSettings
    from recmesh.tools.training.train import build_dataset

    target = _target(feature_set, args.target)  # a wrong one is refused before the log is read
    training_dir = UpSettings().state_dir / "training"
    if args.engine != "single":  # so is an engine that cannot run
        from recmesh.tools.training import engine

        engine.check_engine(_engine_config(args, training_dir))
    users, items = read_catalog(feature_set, args.users, args.items)
    say(
        f"replaying {args.events} through repository {feature_set.name!r} ({feature_set.version}) "
        "for training rows ..."
    )
    # columns, not objects: ~50 bytes an event against ~1.7 KB, read by every pass below
    logged_all = load_log(Path(args.events), feature_set.event_schema)
    events = iter(logged_all)
    check_or_refuse(feature_set, logged_all, users, items, bool(args.ranking), say)
    training_dir.mkdir(parents=True, exist_ok=True)
    run.rows_dir = Path(tempfile.mkdtemp(dir=training_dir, prefix="rows-"))
    split = None
    if args.ranking:
        split = run.split = _hold_out(args, feature_set, logged_all, target, say)
        events = iter(split.training)
        run.model_dir = _ranking_dir() / "models"
    if feature_set.roles.learnt_behaviors:
        # Learnt retrieval from the same log (the training part with --ranking),
        # served beside the model; built in a process of its own while this one
        # replays the log and trains (--jobs): the two share only the log.
        from recmesh.tools.training import recall
        from recmesh.tools.training.beside import run_beside

        logged = split.training if split is not None else logged_all
        tuning = recall.tuning_split(feature_set, logged, args.seed, target)
        run.hold = tuning.hold
        build = functools.partial(
            recall.build, feature_set, logged, run.model_dir, say, args.seed,
            {"events_file": str(Path(args.events).resolve())}, activate=False, split=tuning,
        )  # fmt: skip
        beside = functools.partial(_built_beside, build, feature_set, users, items, say)
        run.retrieval = run_beside(beside, "learnt retrieval's build", args.jobs)
        events = iter(logged)
    total = len(split.training) if split is not None else len(logged_all)
    replay_started = time.perf_counter()
    with _replay(args, training_dir, say) as replay:
        dataset = run.dataset = build_dataset(
            feature_set, _metered(events, total, say), users, items, rows_dir=run.rows_dir,
            chunk_rows=chunk_rows(args.max_memory), say=say, replay=replay,
        )  # fmt: skip
    run.replay_seconds = round(time.perf_counter() - replay_started, 1)
    if run.hold is not None:  # the build (beside, or done) has its events: this process needs its targets
        run.hold = dataclasses.replace(run.hold, training=())
    say(f"{len(dataset.y):,} training rows in {run.replay_seconds} s (digest {dataset.digest})")
    dataset.source = {
        "events": str(Path(args.events).resolve()),
        "users": args.users,
        "items": args.items,
        **({"held_out": {"users": len(split.targets), "events": split.held_out_events,
                         "seed": args.seed}} if split else {}),
    }  # fmt: skip
    return run


def _built_beside(
    build: Callable[[], tuple[dict[str, Any], Any]], feature_set: Any, users: Any, items: Any, say: Any
) -> tuple[dict[str, Any], Any, Any]:
    """Learnt retrieval's build, then what the blend's probe will score (its
    tuning users' candidates with their features: a replay of the log that
    needs no model, done here while the model trains); the build's tuning is
    sent back without its split (the caller holds it; its events are a view of
    the whole log)."""
    from recmesh.tools.training import recall

    card, tuned = build()
    inputs = None
    if tuned.hold is not None and tuned.candidates:
        started = time.perf_counter()
        inputs = recall.blend_inputs(feature_set, tuned.hold, tuned.candidates, users, items)
        say(f"  the blend's inputs: {len(inputs):,} tuning users' candidates with their features as of "
            f"their held-out parts ({time.perf_counter() - started:.1f} s)")  # fmt: skip
    tuned.hold = None
    return card, tuned, inputs


def _retrieval_built(run: _Training, say: Any) -> dict[str, Any]:
    """Learnt retrieval's build, waited for once the model is trained (it was
    running beside); what the model card says of it: the version served beside."""
    if run.retrieval is None:
        return {}
    if not run.retrieval.ready():
        say("waiting for learnt retrieval's build (running beside) ...")
    run.recall_card, run.tuned, run.blend_inputs = run.retrieval.result()
    run.tuned.hold = run.hold
    return {"recall_version": run.recall_card["version"]}


@contextmanager
def _replay(args: argparse.Namespace, work_dir: Path, say: Any) -> Iterator[Any]:
    """What turns the log into examples: this process (--engine single), or the
    partitioned replay on Dask (recmesh.tools.training.engine): the same rows."""
    from recmesh.features.backfill import training_examples

    if args.engine == "single":
        yield training_examples
        return
    from recmesh.tools.training import engine

    config = _engine_config(args, work_dir)
    where = args.engine_address or f"a local cluster of {args.workers} worker processes"
    say(f"engine: Dask on {where}, {config.parts} partitions per entity")
    with engine.dask_runner(config) as run:
        yield functools.partial(engine.partitioned_examples, config=config, run=run, say=say)


def _engine_config(args: argparse.Namespace, work_dir: Path) -> Any:
    from recmesh.tools.training import engine

    return engine.EngineConfig(work_dir, args.workers, args.partitions, args.engine_address)


def _hold_out(
    args: argparse.Namespace, feature_set: Any, events: Sequence[Any], target: frozenset[str] | None, say: Any
) -> Any:
    """--ranking: each (sampled) user's last positive example held out (leave_last_out)."""
    from recmesh.features.backfill import LabelRule
    from recmesh.tools.training.ranking import leave_last_out

    split = leave_last_out(LabelRule.of(feature_set), events, args.ranking_users, args.seed, target,
                           feature_set.roles.seen_behaviors)  # fmt: skip
    say(
        f"leave-last-out: {len(split.targets)} users' last positive examples held out "
        f"({split.held_out_events} events; {split.users_with_a_positive} users have one)"
    )
    if not split.targets:
        raise InvalidArgument(
            f"{args.events}: no user has a positive {'/'.join(sorted(target or ()))} example after "
            "an earlier event of theirs, so there is nothing to hold out and rank from a history"
        )
    return split


def _figures(card: dict[str, Any], recall_card: dict[str, Any] | None) -> dict[str, Any]:
    """What `train` reports: the model card's figures, and the learnt retrieval's."""
    return {
        "version": card["version"],
        **card["metrics"],
        "rows": card["training_data"]["rows"],
        "rows_digest": card["training_data"].get("rows_digest"),
        "train_seconds": card["train_seconds"],
        **(
            {
                "recall_version": recall_card["version"],
                "recall_fusion": recall_card["fusion"],
                "recall_blend": recall_card.get("blend"),
            }
            if recall_card
            else {}
        ),
    }


def _rank_held_out(
    args: argparse.Namespace, feature_set: Any, split: Any, version: str, model_dir: Path, say: Any
) -> dict[str, Any]:
    """--ranking: the held-out examples ranked by a mesh serving the model (recmesh.tools.bench.ranking)."""
    from recmesh.tools.bench import ranking

    say(f"ranking the held-out examples with the served mesh (model {version} in {model_dir}) ...")
    figures = ranking.run(feature_set, split, model_dir, _ranking_dir() / "mesh", args.k, say)
    say(ranking.table(figures))
    say(f"(the model in {model_dir} never saw the held-out examples; train without --ranking "
        "for the model to serve)")  # fmt: skip
    return figures


def add_commands(sub: Any) -> None:
    from recmesh.tools.training.beside import usable_cpus

    tr = sub.add_parser(
        "train", help="train the model family on your event log (or the demo's) and export ONNX + model card"
    )
    tr.add_argument("--events", help="canonical JSON-lines event log (events import --to log); "
                    "without it, the demo repository trains on generated demo sessions")  # fmt: skip
    tr.add_argument("--users", help="users file (default: the repository's users.source)")
    tr.add_argument("--items", help="items file (default: the repository's items.source)")
    tr.add_argument("--repository", help="the repository file (default: RECMESH_REPOSITORY, else the demo's)")
    tr.add_argument("--model-dir", help="default: RECMESH_MODEL_DIR or .recmesh/models")
    tr.add_argument("--seed", type=int, default=42)
    tr.add_argument("--sessions", type=int, default=6000, help="demo sessions (without --events)")
    tr.add_argument("--epochs", type=int, default=4, help="passes over the training rows")
    tr.add_argument(
        "--ranking",
        action="store_true",
        help="also measure ranking quality: hold each user's last positive example out, train on "
        "the rest (into <state>/ranking/models, not the served model dir), replay it into a mesh "
        "and report HR@k and NDCG@k of the served ranking, recall alone and popularity",
    )
    tr.add_argument(
        "--ranking-users",
        type=int,
        help="with --ranking: hold out this many users (seeded draw; "
        "default every user with a positive example)",
    )
    tr.add_argument(
        "--target",
        action="append",
        metavar="BEHAVIOR",
        help="hold out each user's last positive example of this behaviour (repeat for several): in the "
        "ranking evaluation (--ranking) and in learnt retrieval's tuning, e.g. the last purchase while "
        "views and carts stay history (default: any positive; retrieval's tuning: the strongest)",
    )
    tr.add_argument("--k", type=int, default=10, help="with --ranking: the cut-off of HR@k and NDCG@k")
    tr.add_argument(
        "--max-memory", type=memory_size, default="2G", metavar="SIZE",
        help="what the replay's chunk of training examples is sized to (a 64th of it; the rows "
        "themselves go to files under <state>/training and are read a batch at a time), e.g. 512M",
    )  # fmt: skip
    tr.add_argument(
        "--engine", choices=("single", "dask"), default="single",
        help="where the replay computes the training rows' features: this process, or Dask "
        "(the log partitioned by entity, each partition replayed by the same code; the same rows, "
        "bit for bit: compare the printed digest). Needs pip install 'recmesh[engine]'",
    )  # fmt: skip
    tr.add_argument(
        "--jobs", type=int, default=min(2, usable_cpus()), metavar="N",
        help="processes for work that runs side by side: with 2, learnt retrieval is built in a second "
        "process while this one replays the log, and the offline-only baseline in one beside the "
        "model's training (the same tables and models as with 1; default 2 where this process may "
        "run on 2 CPUs or more)",
    )  # fmt: skip
    tr.add_argument("--workers", type=int, default=2,
                    help="--engine dask: worker processes of the local cluster")  # fmt: skip
    tr.add_argument("--partitions", type=int,
                    help="--engine dask: partitions per entity (default 2 per worker)")  # fmt: skip
    tr.add_argument(
        "--engine-address", metavar="tcp://HOST:8786",
        help="--engine dask: a running Dask scheduler instead of a local cluster; its workers must "
        "see <state>/training at the same path (a shared file system) and have recmesh installed",
    )  # fmt: skip
    tr.add_argument("--json", action="store_true", help="print figures as JSON on the last line")
    tr.set_defaults(func=_cmd_train)
