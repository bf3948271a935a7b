"""Build, import and describe learnt retrieval for a repository (recmesh.retrieval).

`build` turns an event log into a recall version: the repository's
`[recall.learnt]` says which behaviours count and how strongly, which tables
(item-kNN, EASE, the sequence model) and how large; the seed decay, EASE's
lambda, the sequence model's epochs and the fusion weights are tuned on a
leave-last-out split of the same log. `import_similar` makes a version from
a team's own similar-items table.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import orjson

from recmesh.errors import InvalidArgument
from recmesh.events import Event
from recmesh.features.eventlog import behaviour_codes, behaviour_flags
from recmesh.features.repository import FeatureSet
from recmesh.heap import give_back
from recmesh.retrieval import build as rb
from recmesh.retrieval import files, sequence
from recmesh.retrieval.table import NeighbourTable, RecallTable

if TYPE_CHECKING:
    from recmesh.tools.training.train import Probe

Progress = Callable[[str], None]
TUNING_USERS = 2000


def config_of(feature_set: FeatureSet) -> rb.BuildConfig:
    decl = feature_set.decl.recall.learnt
    if not feature_set.roles.learnt_behaviors:
        raise InvalidArgument(
            f"repository {feature_set.name!r}: learnt retrieval is off "
            "([recall.learnt] enabled = false or methods = [])"
        )
    return rb.BuildConfig(
        behaviors=feature_set.roles.learnt_behaviors,
        previous=decl.previous,
        neighbours=decl.neighbours,
        history=decl.history,
        ease_items=decl.ease_items,
        methods=tuple(dict.fromkeys(decl.methods)),
        seen_behaviors=feature_set.roles.seen_behaviors,
    )


def targets(
    feature_set: FeatureSet, events: Sequence[Event], target: Collection[str] | None = None
) -> tuple[npt.NDArray[np.bool_], str]:
    """Which events the tuning split may hold out, and how they were chosen: the
    training label's positives (what `train --ranking` targets) of the `target`
    behaviours when given (`train --target`), else of the strongest learnt
    behaviours among them (a funnel's purchases, not its views); without a
    training label, events of the strongest learnt behaviours."""
    weights = feature_set.roles.learnt_behaviors
    codes, names = behaviour_codes(events)

    if feature_set.decl.training is not None:
        from recmesh.features.backfill import LabelRule, positive_examples

        positive = np.asarray(positive_examples(LabelRule.of(feature_set), events), bool)
        kinds = {names[c] for c in np.unique(codes[positive]).tolist()}
        if target is None and kinds and all(b in weights for b in kinds):
            top = max(weights[b] for b in kinds)
            target = frozenset(b for b in kinds if weights[b] == top)
        if target is None or set(target) >= kinds:
            return positive, "the training label's positives"
        keep = frozenset(target)
        return positive & behaviour_flags(events, keep), f"the training label's positives of {sorted(keep)}"
    top = max(weights.values())
    strongest = frozenset(b for b, w in weights.items() if w == top)
    return behaviour_flags(events, strongest), f"events of {sorted(strongest)}"


def served_popularity(feature_set: FeatureSet) -> rb.Popularity | None:
    """What the ranker's `popular` source serves, as the tuning must weigh it: the
    declared popularity feature's ranking (from the catalog), or counts of the
    popularity behaviours in the events; None without either (no popular source
    worth a weight: the learnt behaviours' counts stand in)."""
    roles = feature_set.roles
    if roles.popularity_feature is not None:
        from recmesh.features.tabular import read_entities

        source = feature_set.entity_source("item")
        if source is None:
            return None
        values: dict[str, float] = {}
        for item_id, row in read_entities(feature_set, "item", source):
            value = row.get(roles.popularity_feature)
            if isinstance(value, int | float):
                values[item_id] = float(value)
        ranked = sorted(values, key=lambda i: (-values[i], i))
        return lambda _events: ranked
    if roles.popularity_behaviors:
        behaviors = roles.popularity_behaviors

        def counted(events: Sequence[Event]) -> list[str]:
            counts = Counter(ev.item_id for ev in events if ev.behavior in behaviors)
            return sorted(counts, key=lambda i: (-counts[i], i))

        return counted
    return None


@dataclass(frozen=True)
class TuningSplit:
    """The leave-last-out split learnt retrieval is tuned on (`rb.holdout`), and
    how its targets were chosen (`targets`; the card says it)."""

    hold: rb.Holdout
    what: str


def tuning_split(
    feature_set: FeatureSet, events: Sequence[Event], seed: int = 0, target: Collection[str] | None = None
) -> TuningSplit:
    """Each of TUNING_USERS users' last positive of `target` (see `targets`) held
    out of `events`, the users drawn under `seed`; refused when no event is of
    the learnt behaviours."""
    cfg = config_of(feature_set)
    learnt = frozenset(b for b, w in cfg.behaviors.items() if w)  # as rb.interactions counts them
    if not any(ev.behavior in learnt for ev in events):
        raise InvalidArgument(
            f"no event of the learnt behaviours {sorted(cfg.behaviors)} in the log: nothing to learn from "
            "(recall.learnt.behaviors in the repository names them)"
        )
    is_target, what = targets(feature_set, events, target)
    hold = rb.holdout(events, is_target, cfg.behaviors, cfg.history, TUNING_USERS, seed, cfg.seen_behaviors)
    return TuningSplit(hold, what)


def build(
    feature_set: FeatureSet,
    events: Sequence[Event],
    model_dir: Path,
    progress: Progress = print,
    seed: int = 0,
    source: dict[str, Any] | None = None,
    activate: bool = True,
    target: Collection[str] | None = None,
    split: TuningSplit | None = None,
) -> tuple[dict[str, Any], rb.Tuned]:
    """Tune on a split of `events` (`split`, or `tuning_split`'s under `seed`
    and `target`), build the tables on all of them, save a version under
    model_dir/recall (current when `activate`); its card, and the tuning (the
    split and each tuning user's fused candidates, what `tune_blend` scores
    with the model trained beside the tables)."""
    cfg = config_of(feature_set)
    started = time.perf_counter()
    split = split or tuning_split(feature_set, events, seed, target)
    what = split.what
    progress(f"learnt retrieval: tuning {', '.join(cfg.methods)} on {len(events):,} events, "
             f"each user's last of {what} held out ...")  # fmt: skip
    tuned = rb.tune(split.hold, cfg, seed, progress, served_popularity(feature_set))
    data = rb.interactions(events, cfg.behaviors)
    tables, sources = _tables(data, cfg, tuned, seed)
    card = {
        "feature_set_version": feature_set.version,
        "repository": feature_set.name,
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "built_from": {
            **(source or {}),
            "events": len(events),
            "users": len(data.user_ids),
            "items": data.n_items,
        },
        "behaviors": dict(cfg.behaviors),
        "history": cfg.history,
        "sources": sources,
        "fusion": {k: w for k, w in tuned.fusion.items() if k in (*tables, "popular", "revisit")},
        # past the fused list's first rrf_head_tail items ({}: the same weights)
        "fusion_depth": {k: w for k, w in tuned.fusion_depth.items() if k in (*tables, "popular", "revisit")},
        "tuning": {"users": tuned.users, "ndcg@10": tuned.ndcg, "targets": what},
        "build_seconds": round(time.perf_counter() - started, 1),
    }
    card["version"] = files.save(model_dir, card, tables, activate)
    progress(
        f"learnt retrieval {card['version']}: "
        + ", ".join(f"{n} {s['items']:,} items x {_size(s)}" for n, s in sources.items())
        + f"; fusion {card['fusion']}; {card['build_seconds']} s"
    )
    return card, tuned


def _size(source: Mapping[str, Any]) -> str:
    if "dim" in source:  # the sequence model
        return f"{source['dim']}-d vectors ({source['epochs']} epochs)"
    return f"{source['entries'] // max(1, source['items'])} neighbours"


def _tables(
    data: rb.Interactions, cfg: rb.BuildConfig, tuned: rb.Tuned, seed: int
) -> tuple[dict[str, RecallTable], dict[str, dict[str, Any]]]:
    """The configured tables built on every event, with the tuned settings; each
    one's card entry (its settings, size and build time)."""
    tables: dict[str, RecallTable] = {}
    sources: dict[str, dict[str, Any]] = {}
    if "knn" in cfg.methods:
        t0 = time.perf_counter()
        tables["knn"] = rb.knn_table(data, cfg.previous, cfg.neighbours)
        sources["knn"] = {"decay": tuned.decay.get("knn", 1.0), "previous": cfg.previous,
                          "build_s": round(time.perf_counter() - t0, 2)}  # fmt: skip
    if "ease" in cfg.methods and cfg.ease_items > 1:
        t0 = time.perf_counter()
        lam = tuned.ease_lambda or float(rb.gram(data, rb.ease_items(data, cfg.ease_items)).diagonal().mean())
        tables["ease"] = rb.ease_table(data, lam, cfg.neighbours, cfg.ease_items)
        sources["ease"] = {"decay": tuned.decay.get("ease", 1.0), "lambda": round(lam, 3),
                           "build_s": round(time.perf_counter() - t0, 2)}  # fmt: skip
        give_back()  # its Gram matrix and inverse (the catalog's square) before the sequence model trains
    if "sequence" in cfg.methods:
        t0 = time.perf_counter()
        epochs = tuned.sequence_epochs or 1
        tables["sequence"] = sequence.train(data, epochs, seed)
        sources["sequence"] = {"epochs": epochs, "dim": sequence.DIM, "length": sequence.LENGTH,
                               "build_s": round(time.perf_counter() - t0, 2)}  # fmt: skip
    for name, table in tables.items():
        sources[name] |= {"items": len(table), "entries": table.entries, "bytes": table.nbytes}
    give_back()  # held by the heap until the process ends otherwise (about 100 MB at 2,000 items)
    return tables, sources


# The final order's weight on the recall order against the model's
# (services/ranker/policy.blend_orders), tried by `tune_blend`: 0 is the model's
# order, 32 all but the recall order.
BLEND_GRID = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 32.0)


def tune_blend(
    tuned: rb.Tuned,
    inputs: BlendInputs,
    probe: Probe,
    model_dir: Path,
    recall_version: str,
    progress: Progress = print,
) -> dict[str, Any]:
    """The blend of the model's order with the recall order that ranks the tuning
    users' held-out targets best, written into the recall version's card.

    Each tuning user's fused candidates (the tables built without their
    held-out part) are scored as the ranker would: features as of 1 ms before
    the held-out part (`inputs`: `blend_inputs`, computed while the model
    trained), by the full variant of the model trained beside it,
    which never saw those targets (`probe`: trained without the tuning users'
    held-out parts). The blend goes into the card of `recall_version` under
    `model_dir`.
    """
    hold = tuned.hold
    if hold is None or not inputs:
        return {}
    started = time.perf_counter()
    scored = _probe_scores(inputs, probe)
    targets = {u: hold.targets[u] for u in scored}
    ndcg = _blend_ndcg(scored, targets)
    top = max(BLEND_GRID, key=lambda w: (round(ndcg[w], 6), -w))
    # A shortfall smaller than one target's whole gain (1 / users) is a tie, and
    # a tie goes to the least recall weight (the most say for the model, which
    # also sees the real-time features the split cannot show). A stricter rule,
    # the least weight within one standard error, cost NDCG@10 on two of three
    # data sets (docs/models.md).
    best = next(w for w in BLEND_GRID if ndcg[top] - ndcg[w] < 1.0 / len(scored))
    progress(
        f"  blend of the model's order with the recall order, NDCG@10 on {len(targets)} tuning users: "
        + ", ".join(f"{w:g}: {v:.4f}" for w, v in ndcg.items())
        + f" -> {best:g} (best {top:g}; the least within one target's gain; "
        f"{time.perf_counter() - started:.1f} s)"
    )
    tuning = {"model": f"the model's full variant, {probe.rows:,} training rows", "users": len(targets),
              "best": top,
              "rule": "the least within 1/users of the best",
              "ndcg@10": {f"{w:g}": round(v, 4) for w, v in ndcg.items()}}  # fmt: skip
    changes = {"blend": best, "blend_tuning": tuning}
    files.update_card(model_dir, recall_version, changes)
    return changes


# Per tuning user: their candidates, their features and the candidates' (a
# column a feature) as of before their held-out part.
BlendInputs = dict[str, tuple[list[str], dict[str, Any], dict[str, list[Any]]]]


def blend_inputs(
    feature_set: FeatureSet,
    hold: rb.Holdout,
    candidates: Mapping[str, list[str]],
    users: Mapping[str, Mapping[str, Any]],
    items: Mapping[str, Mapping[str, Any]],
) -> BlendInputs:
    """What the blend's probe model scores, known before there is a model: each
    tuning user's candidates with the features a look-up would have given as of
    1 ms before their held-out part, replayed from the tuning split's events
    (`features_as_of`). `recmesh train` computes them in learnt retrieval's
    process once its build is done, while this one trains the model."""
    from recmesh.features.backfill import Query, features_as_of

    queries = [Query(u, hold.as_of[u], tuple(c)) for u, c in sorted(candidates.items()) if c]
    inputs: BlendInputs = {}
    for q, uf, rows in features_as_of(feature_set, hold.training, users, items, queries):
        names = {name for row in rows for name in row}
        inputs[q.user_id] = (list(q.items), uf, {n: [r.get(n) for r in rows] for n in sorted(names)})
    return inputs


def _probe_scores(inputs: BlendInputs, probe: Probe) -> dict[str, tuple[list[str], list[float]]]:
    """Per tuning user: their candidates and the probe model's scores for them."""
    from recmesh.features.vectorize import Vectorizer

    vec = Vectorizer(probe.transforms)
    names = {t.feature for t in vec.transforms if t.entity == "item"}
    scored: dict[str, tuple[list[str], list[float]]] = {}
    for user, (candidates, uf, columns) in inputs.items():
        item_columns = {n: columns.get(n, [None] * len(candidates)) for n in names}
        x = vec.matrix([uf], item_columns, candidates, [user])
        scored[user] = (candidates, [float(s) for s in probe.score(x.astype(np.float32))])
    return scored


def _blend_ndcg(
    scored: dict[str, tuple[list[str], list[float]]], targets: dict[str, str]
) -> dict[float, float]:
    """Per blend weight of BLEND_GRID, the tuning users' mean NDCG@10 of the blended order."""
    from services.ranker.policy import blend_orders

    tuning_users = sorted(scored)

    def gains(w: float) -> npt.NDArray[np.float64]:
        """Per tuning user, NDCG@10 of the blended order."""
        out = np.zeros(len(tuning_users))
        for n, u in enumerate(tuning_users):
            ids, s = scored[u]
            top = [i for i, _ in blend_orders(ids, s, w)][:10]
            if targets[u] in top:
                out[n] = 1.0 / np.log2(top.index(targets[u]) + 2)
        return out

    per_user = {w: gains(w) for w in BLEND_GRID}
    return {w: float(g.mean()) for w, g in per_user.items()}


def read_similar(path: Path) -> dict[str, list[tuple[str, float]]]:
    """A team's similar-items table: JSON lines {"item_id", "similar_id", "score"}
    or CSV/TSV with those three columns (a header line naming them)."""
    rows: dict[str, list[tuple[str, float]]] = {}
    text = path.read_text()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise InvalidArgument(f"{path}: empty")
    if lines[0].lstrip().startswith("{"):
        for n, line in enumerate(lines, start=1):
            try:
                obj = orjson.loads(line)
                a, b, w = str(obj["item_id"]), str(obj["similar_id"]), float(obj["score"])
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                raise InvalidArgument(
                    f'{path}:{n}: want {{"item_id", "similar_id", "score"}} ({type(err).__name__}: {err})'
                ) from None
            rows.setdefault(a, []).append((b, w))
        return rows
    sep = "\t" if "\t" in lines[0] else ","
    header = [h.strip() for h in lines[0].split(sep)]
    want = ("item_id", "similar_id", "score")
    if any(w not in header for w in want):
        raise InvalidArgument(
            f"{path}:1: the header must name item_id, similar_id and score (found {header})"
        )
    at = [header.index(w) for w in want]
    for n, line in enumerate(lines[1:], start=2):
        cells = line.split(sep)
        try:
            a, b, w = cells[at[0]].strip(), cells[at[1]].strip(), float(cells[at[2]])
        except (IndexError, ValueError) as err:
            raise InvalidArgument(f"{path}:{n}: {type(err).__name__}: {err}") from None
        rows.setdefault(a, []).append((b, w))
    return rows


def _beside_current(
    feature_set: FeatureSet, model_dir: Path
) -> tuple[dict[str, Any], files.RecallVersion | None]:
    """A new version's card starting from the current version's (its tables kept)."""
    card: dict[str, Any] = {
        "feature_set_version": feature_set.version,
        "repository": feature_set.name,
        "sources": {},
        "fusion": {},
        "history": feature_set.roles.history_cap,
    }
    current = files.load_current(model_dir, feature_set.version)
    if current is not None:
        card = {k: v for k, v in current.card.items() if k not in ("version", "files", "vectors_file")}
        card["sources"] = dict(card.get("sources", {}))
        card["fusion"] = dict(card.get("fusion", {}))
    card["built_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    return card, current


def import_similar(
    feature_set: FeatureSet,
    path: Path,
    model_dir: Path,
    weight: float,
    decay: float,
    neighbours: int,
    activate: bool,
) -> dict[str, Any]:
    """A version holding the team's table as the `similar` source, beside the
    current version's tables and vectors (kept as they are)."""
    table = NeighbourTable.from_pairs(read_similar(path), neighbours)
    if not len(table.indices):
        raise InvalidArgument(f"{path}: no pair with a positive score")
    card, current = _beside_current(feature_set, model_dir)
    tables = {**(current.tables if current else {}), "similar": table}
    card["sources"]["similar"] = {"decay": decay, "imported_from": str(path.resolve()), "items": len(table),
                                  "entries": len(table.indices), "bytes": table.nbytes}  # fmt: skip
    card["fusion"]["similar"] = weight
    vectors = current.vectors if current else None
    card["version"] = files.save(model_dir, card, tables, activate, vectors)
    return card


def import_vectors(
    feature_set: FeatureSet, items: Path, users: Path | None, model_dir: Path, weight: float, activate: bool
) -> dict[str, Any]:
    """A version holding the team's item (and user) vectors as the `vectors`
    source, beside the current version's tables."""
    from recmesh.retrieval.vectors import TwoTower, read_vectors

    item_ids, item_matrix = read_vectors(items, "item_id")
    user_ids, user_matrix = (
        read_vectors(users, "user_id") if users else ([], np.zeros((0, item_matrix.shape[1]), np.float32))
    )
    if user_matrix.shape[1] != item_matrix.shape[1]:
        raise InvalidArgument(
            f"{users}: user vectors have {user_matrix.shape[1]} numbers, item vectors {item_matrix.shape[1]}"
        )
    two = TwoTower(item_ids, item_matrix, user_ids, user_matrix)
    card, current = _beside_current(feature_set, model_dir)
    sources = [str(items.resolve()), str(users.resolve()) if users else None]
    card["sources"]["vectors"] = {"imported_from": sources, "items": len(item_ids), "users": len(user_ids),
                                  "dim": two.dim, "bytes": two.nbytes}  # fmt: skip
    card["fusion"]["vectors"] = weight
    card["version"] = files.save(model_dir, card, dict(current.tables) if current else {}, activate, two)
    return card
