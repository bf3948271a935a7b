"""Build point-in-time rows from events, train, evaluate, export.

Training rows come from an event log replayed through the repository's
feature code (recmesh.features.backfill: one example per event of
`training.examples`, labelled by `training.label`), or, for the demo
repository without a log, from the demo generator. The model's inputs are
planned from those rows (recmesh.features.vectorize.plan_inputs: every
declared feature by its type, vocabularies learned here) and written into the
card, so the inference service builds the same inputs from served features.

Every degradation variant of the model family (recmesh.tools.training.family) is
exported into one version directory (layout: recmesh.modeldir). The model card
(card.json) records the version, the feature set it expects, its inputs, the
training data range, AUC on a time-based holdout for the full model and for
the same family trained without real-time features (so the lift from
real-time features is measured), and per variant: level, file, what it keeps,
weight bytes and holdout AUC.
"""

from __future__ import annotations

import functools
import hashlib
import json
import pickle
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recmesh.errors import InvalidArgument
from recmesh.events import Event
from recmesh.features.backfill import Example, ExampleDigest, LabelRule, training_examples
from recmesh.features.repository import EMBEDDING_L2_DEFAULT, FeatureSet
from recmesh.features.vectorize import InputStats, Transform, Vectorizer, plan_from
from recmesh.modeldir import MODEL_NAME, point_current, variant_file
from recmesh.tools.catalog import progress_bar
from recmesh.tools.training.beside import run_beside
from recmesh.tools.training.family import (
    LEVEL2_TOLERANCE,
    PREFIX_DIMS,
    Chunks,
    Family,
    Layout,
    Rows,
    Variant,
    auc,
    choose_level2_dim,
    gather,
    make_variants,
    offline_only,
    pick_level1,
    quantile,
    read_rows,
    row_index_dtype,
    to_onnx,
    train_family,
    trained_configs,
    weight_bytes,
    whole_file,
)

HOUR_MS = 3_600_000
# The origin on the card of the offline-only baseline every training exports beside
# its model (named by the model's card as `offline_only_version`).
OFFLINE_ONLY = "offline-only"


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 42
    epochs: int = 4  # passes over the training rows (mini-batch Adam)
    hidden: int = 32  # MLP hidden units (model size)
    holdout_fraction: float = 0.2
    # The demo generator, when no event log is given.
    sessions: int = 6000
    hours: float = 4.0
    # The demo start time is fixed for determinism: 2026-01-01T00:00:00Z.
    start_ms: int = 1_767_225_600_000
    # Leakage control: move impression units to random times (see shuffle_event_times).
    shuffle_times: bool = False


@dataclass
class Dataset:
    """Training rows as model inputs: x (rows x columns; in memory, or a file
    mapped in), labels, as-of times, each row's user."""

    transforms: tuple[Transform, ...]
    x: np.ndarray
    y: np.ndarray
    t: np.ndarray
    users: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # row -> index in user_ids
    user_ids: list[str] = field(default_factory=list)
    source: dict[str, Any] = field(default_factory=dict)
    w: np.ndarray | None = None  # per row, its weight in the loss (training.weights); None: 1 each
    digest: str = ""  # of the examples the rows were made from (ExampleDigest)


def shuffle_event_times(events: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """The leakage control: every impression unit (a view and the click, cart
    and purchase that follow it) moves, intact, to a random time in the same
    range. Labels survive; the temporal structure the real-time features
    exploit (session interest, trending items) does not."""
    rng = np.random.default_rng(seed)
    units: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        units.setdefault(e["event_id"][:-1], []).append(e)  # ids end in v/c/a/p per step
    lo = min(e["event_time"] for e in events)
    hi = max(e["event_time"] for e in events)
    out: list[dict[str, Any]] = []
    for unit in units.values():
        base = unit[0]["event_time"]
        start = int(rng.integers(lo, hi))
        out.extend({**e, "event_time": start + e["event_time"] - base} for e in unit)
    out.sort(key=lambda e: (e["event_time"], e["event_id"]))
    return out


def demo_source(cfg: TrainConfig) -> tuple[list[Event], dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The demo generator's events and catalog (the demo repository's world)."""
    from recmesh.tools.demo.generate import generate_events, make_catalog

    catalog = make_catalog()
    raw: Iterable[dict[str, Any]] = generate_events(
        catalog, cfg.start_ms, int(cfg.hours * HOUR_MS), cfg.sessions, seed=cfg.seed
    )
    if cfg.shuffle_times:
        raw = shuffle_event_times(list(raw), cfg.seed)
    events = [Event.model_construct(**e) for e in raw]
    users = {u["user_id"]: u for u in catalog.users}
    items = {i["item_id"]: i for i in catalog.items}
    return events, users, items


# Examples replayed per chunk: spilled to disk (pickled) past the first, each
# vectorised on its own; what memory holds of the rows at a time.
CHUNK_ROWS = 65_536
VECTORISE_ROWS = 4096


def build_dataset(
    feature_set: FeatureSet,
    events: Iterable[Event],
    users: Mapping[str, Mapping[str, Any]],
    items: Mapping[str, Mapping[str, Any]],
    transforms: tuple[Transform, ...] | None = None,
    *,
    rows_dir: Path | None = None,
    chunk_rows: int = CHUNK_ROWS,
    say: Callable[[str], None] | None = None,
    replay: Replay = training_examples,
) -> Dataset:
    """Point-in-time rows of `events` (sorted by time) as model inputs; the
    inputs are planned from these rows unless given (a model's own).

    The replay's examples never all sit in memory: every `chunk_rows` of them
    go to disk (pickled, in a temporary directory under `rows_dir`, else the
    system's), while the statistics the inputs are planned from are gathered
    (InputStats); then each chunk is vectorised into the rows. With `rows_dir`
    the rows are .npy files there, mapped in (numpy.load(mmap_mode="r")):
    memory holds one chunk of examples, never the log's. `say`: a progress
    line every tenth of the rows written. `replay`: what turns the events into
    examples (training_examples, or the engine's partitioned replay: the same
    examples); their digest (ExampleDigest) is the dataset's `digest`."""
    stats = InputStats(feature_set) if transforms is None else None
    digest = ExampleDigest()
    with tempfile.TemporaryDirectory(dir=rows_dir, prefix=".examples-") as tmp:
        spilled: list[Path] = []
        buf: list[_Row] = []
        for ex in replay(feature_set, events, users, items):
            digest.add(ex)
            if stats is not None:
                stats.add(ex.user, ex.item)
            # a plain tuple: pickled and read back several times faster than the dataclass
            buf.append((ex.user_id, ex.item_id, ex.as_of_ms, ex.user, ex.item, ex.label, ex.weight))
            if len(buf) >= chunk_rows:
                spilled.append(_spill(buf, Path(tmp) / f"{len(spilled):06d}.pickle"))
                buf = []
        n = len(spilled) * chunk_rows + len(buf)
        if not n:
            raise InvalidArgument(
                f"no training examples: no {LabelRule.of(feature_set).examples_text()} events in the log"
            )
        planned = plan_from(stats) if stats is not None else transforms
        assert planned is not None  # given, or planned from the rows
        bar = progress_bar(say, "rows", n, "rows") if say is not None else None
        dataset = _vectorised(planned, [*spilled, buf], n, rows_dir, bar)
        dataset.digest = digest.hexdigest()
        return dataset


_Row = tuple[str, str, int, dict[str, Any], dict[str, Any], int, float]  # an Example's fields, in order
Replay = Callable[
    [FeatureSet, Iterable[Event], Mapping[str, Mapping[str, Any]], Mapping[str, Mapping[str, Any]]],
    Iterable[Example],
]


def _spill(examples: list[_Row], path: Path) -> Path:
    with path.open("wb") as fh:
        pickle.dump(examples, fh, protocol=pickle.HIGHEST_PROTOCOL)
    return path


def _vectorised(
    transforms: tuple[Transform, ...],
    chunks: list[Path | list[_Row]],
    n: int,
    rows_dir: Path | None,
    bar: Callable[[int], None] | None,
) -> Dataset:
    """The rows of the spilled (and last, in-memory) chunks of examples, in order."""
    vec = Vectorizer(transforms)
    item_names = {t.feature for t in transforms if t.entity == "item"}

    def column(name: str, shape: tuple[int, ...], dtype: Any) -> _Column:
        return _Column(shape, dtype, None if rows_dir is None else rows_dir / f"{name}.npy")

    x = column("x", (n, vec.width), np.float32)
    y, t, w = column("y", (n,), np.float32), column("t", (n,), np.int64), column("w", (n,), np.float32)
    users = column("users", (n,), np.int32)
    user_index: dict[str, int] = {}
    at = 0
    for chunk in chunks:
        if isinstance(chunk, Path):
            with chunk.open("rb") as fh:
                examples: list[_Row] = pickle.load(fh)  # our own file, written above
            chunk.unlink()
        else:
            examples = chunk
        for start in range(0, len(examples), VECTORISE_ROWS):
            user_ids, item_ids, as_of, user_rows, item_rows, labels, weights = zip(
                *examples[start : start + VECTORISE_ROWS], strict=True
            )
            columns = {name: [it.get(name) for it in item_rows] for name in item_names}
            x.put(at, vec.matrix(list(user_rows), columns, list(item_ids), list(user_ids)))
            y.put(at, labels)
            t.put(at, as_of)
            w.put(at, weights)
            users.put(at, [user_index.setdefault(u, len(user_index)) for u in user_ids])
            at += len(user_ids)
        if bar is not None:
            bar(at)
    xa, ya, ta, wa, ua = (c.done() for c in (x, y, t, w, users))
    weighted = not bool((np.asarray(wa) == 1).all())
    return Dataset(transforms, xa, ya, ta, ua, list(user_index), w=wa if weighted else None)


class _Column:
    """Rows of one array written front to back: in memory, or (`path`) an .npy
    file written with plain writes and mapped in read-only once complete. Never
    a writable mapping: its dirty pages would stay in the process until it ends
    (at 1 M events, 5 M rows, they were the peak's largest growing part)."""

    def __init__(self, shape: tuple[int, ...], dtype: Any, path: Path | None) -> None:
        self.shape, self.dtype, self.path = shape, np.dtype(dtype), path
        self._array = np.empty(shape, dtype) if path is None else None
        self._fh = None if path is None else path.open("wb")
        self._written = 0
        if self._fh is not None:
            header = {
                "descr": np.lib.format.dtype_to_descr(self.dtype),
                "fortran_order": False,
                "shape": shape,
            }
            np.lib.format.write_array_header_1_0(self._fh, header)

    def put(self, at: int, values: Any) -> None:
        block = np.asarray(values, self.dtype)
        if self._array is not None:
            self._array[at : at + len(block)] = block
        elif self._fh is not None:
            if at != self._written:
                raise ValueError(f"rows {at}.. written after {self._written}: a column is written in order")
            self._fh.write(np.ascontiguousarray(block).tobytes())
        self._written = at + len(block)

    def done(self) -> np.ndarray:
        if self._array is not None:
            return self._array
        assert self._fh is not None and self.path is not None
        self._fh.close()
        if self._written != self.shape[0]:
            raise ValueError(f"{self.path}: {self._written} rows written of {self.shape[0]}")
        mapped: np.ndarray = np.load(self.path, mmap_mode="r")
        return mapped


def demo_dataset(
    feature_set: FeatureSet, cfg: TrainConfig, transforms: tuple[Transform, ...] | None = None
) -> Dataset:
    events, users, items = demo_source(cfg)
    ds = build_dataset(feature_set, events, users, items, transforms)
    ds.source = {"demo": {"seed": cfg.seed, "sessions": cfg.sessions, "hours": cfg.hours,
                          "start_ms": cfg.start_ms, "shuffle_times": cfg.shuffle_times}}  # fmt: skip
    return ds


def _time_split(times: Chunks, holdout_fraction: float) -> int:
    """The last training time: the (1 - holdout_fraction) quantile of the rows'
    times (np.quantile's, read a chunk at a time: family.quantile)."""
    return int(quantile(times, 1 - holdout_fraction))


@dataclass(frozen=True)
class _Rows:
    """The dataset's rows split by time, as row indices (int32 where they fit):
    `tr` the training part, `ho` the holdout (the last holdout_fraction, from
    `split` + 1 ms on), `newest` the training part's newest tenth (where level
    2's embedding size is chosen). The rows, their labels and weights stay where
    they are, and so do the parts' row numbers when the rows are files (read a
    chunk or a group of blocks at a time); of the times only what the card says
    is kept. What a row costs while the family trains: an epoch's order of
    blocks (8 bytes a block of BLOCK_ROWS) and, while a part is measured, its
    labels and scores (8 bytes a row of it)."""

    x: np.ndarray
    y: np.ndarray
    w: np.ndarray | None
    split: int
    tr: Rows
    ho: Rows
    newest: Rows
    used: int  # rows in either part (the tuning users' left-out rows are in neither)
    left_out: int
    positive_rate: float  # over the rows used
    from_ms: int
    to_ms: int


@dataclass(frozen=True)
class _Trained:
    """The family, its served variants and their holdout AUC, and level 1's
    holdout AUC at each trained embedding prefix."""

    family: Family
    variants: tuple[Variant, ...]
    variant_auc: dict[int, float]
    prefix_auc: dict[int, float]


@dataclass(frozen=True)
class Probe:
    """The trained family's full variant (level 0) scoring in memory: what
    learnt retrieval's blend is tuned with (recmesh.tools.training.recall.tune_blend),
    the served model itself. `train(..., unseen=...)` keeps the tuning users'
    held-out parts out of its training rows, so it has never seen a target it
    is asked to rank."""

    family: Family
    variant: Variant
    transforms: tuple[Transform, ...]
    rows: int  # the rows it trained on

    def score(self, x: np.ndarray) -> np.ndarray:
        return self.family.predict(x, self.variant)


@dataclass(frozen=True)
class Fitted:
    card: dict[str, Any]
    probe: Probe


def train(
    cfg: TrainConfig,
    model_dir: Path,
    feature_set: FeatureSet,
    dataset: Dataset | None = None,
    progress: Callable[[str], None] = print,
    origin: str | None = None,
    unseen: Mapping[str, int] | None = None,
    late_source: Callable[[], Mapping[str, Any]] | None = None,
    jobs: int = 1,
) -> Fitted:
    """Train the family on `dataset` (default: the demo generator's), export
    every variant and the card, and make it the current version; the card and
    the full variant as a probe. `unseen`: users whose rows as
    of their time there are never trained on (the blend's tuning users' held-out
    parts), though the holdout still measures them. `late_source`: called once
    the family is trained, before the export, for what the card's training data
    says beside `dataset.source` that is known only then (the learnt retrieval
    built beside the training). `jobs` > 1: the offline-only baseline trains in
    a second process beside the family (the same model as in this one)."""
    started = time.perf_counter()
    if dataset is None:
        progress(f"building point-in-time rows ({cfg.sessions} demo sessions over {cfg.hours} h) ...")
        dataset = demo_dataset(feature_set, cfg)
    rows = _split_rows(dataset, cfg, feature_set, unseen)
    left_out = rows.left_out
    progress(
        f"{rows.used} rows, {rows.x.shape[1]} input columns, positive rate {rows.positive_rate:.3f}; "
        f"holdout = last {cfg.holdout_fraction:.0%} by time"
    )
    layout = Layout.of(dataset.transforms)
    l2 = feature_set.decl.training.embedding_l2 if feature_set.decl.training else EMBEDDING_L2_DEFAULT
    train_baseline = functools.partial(
        _offline_baseline, cfg, feature_set, dataset.transforms, layout, rows, l2, progress
    )
    baseline = run_beside(train_baseline, "the offline-only baseline's training", jobs)
    try:
        trained = _train_variants(cfg, layout, rows, l2, progress, jobs)
    except BaseException:
        baseline.cancel()
        raise
    auc_full, prefix_auc = trained.variant_auc[0], trained.prefix_auc
    base = baseline.result()
    auc_base = base.variant_auc[0]
    training_data = {
        **dataset.source,
        **(late_source() if late_source is not None else {}),
        "from_ms": rows.from_ms, "to_ms": rows.to_ms, "rows": rows.used,
        "holdout_rows": len(rows.ho), "holdout_from_ms": int(rows.split) + 1,
        "positive_rate": round(rows.positive_rate, 4), "label": LabelRule.of(feature_set).describe(),
        **({"rows_digest": dataset.digest} if dataset.digest else {}),
        **({"not_trained_on": {"users": len(unseen), "rows": left_out,
                               "why": "the blend's tuning users' held-out parts"}} if unseen else {}),
    }  # fmt: skip
    # The baseline is a version too (never made current): served beside the model
    # (`recmesh models activate BASELINE --share 50`), it shows online what the
    # real-time features earn.
    base_card = export(
        base.family, base.variants, dataset, model_dir, feature_set,
        metrics={"auc_holdout": round(auc_base, 4)}, variant_auc=base.variant_auc,
        training_data=training_data, seed=cfg.seed, origin=OFFLINE_ONLY, started=started, current=False,
    )  # fmt: skip
    card = export(
        trained.family, trained.variants, dataset, model_dir, feature_set,
        metrics={
            "auc_holdout": round(auc_full, 4),
            "auc_holdout_offline_only": round(auc_base, 4),
            "auc_lift_from_realtime": round(auc_full - auc_base, 4),
            "auc_holdout_level1_by_embedding_dim": {str(d): round(a, 4) for d, a in prefix_auc.items()},
        },
        variant_auc=trained.variant_auc,
        training_data=training_data,
        offline_only_version=base_card["version"],
        seed=cfg.seed,
        origin=origin or ("demo" if feature_set.demo or "demo" in dataset.source else "trained"),
        started=started,
    )  # fmt: skip
    progress(f"exported {len(trained.variants)} variants to {model_dir / MODEL_NAME / card['version']} "
             f"in {card['train_seconds']} s; the offline-only baseline as {base_card['version']} "
             "(not current)")  # fmt: skip
    probe = Probe(trained.family, trained.variants[0], dataset.transforms, len(rows.tr))
    return Fitted(card, probe)


def _split_rows(
    dataset: Dataset, cfg: TrainConfig, feature_set: FeatureSet, unseen: Mapping[str, int] | None = None
) -> _Rows:
    """The rows split by time, the training part without `unseen` users' rows
    from their time on; refused when either part's labels are all one class.
    Every pass reads the times (8 bytes a row), users and labels a chunk at a
    time, and so does each quantile (family.quantile: np.quantile's value, to
    the bit): nothing is held per row, not even a part's mask (the whole
    columns and their masks at once were about 40 bytes a row for a moment,
    the 4 M-event run's peak at 20 M rows; the times' quantiles and the parts'
    masks, about 20 bytes a row, 2026-12-07). Each part's row numbers are
    written to a file beside the rows when the rows are files (and read a
    chunk or a block at a time, as the rows are)."""
    n = len(dataset.t)
    starts = range(0, n, SPLIT_CHUNK)

    def times() -> Iterator[np.ndarray]:
        return (read_rows(dataset.t, start, start + SPLIT_CHUNK) for start in starts)

    split = _time_split(times, cfg.holdout_fraction)
    last = np.iinfo(np.int64).max
    limit = None
    if unseen:
        limit = np.asarray([unseen.get(u, last) for u in dataset.user_ids] or [last], np.int64)

    def parts() -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
        """Each chunk's times, training and holdout masks, and first row."""
        for start, t in zip(starts, times(), strict=True):
            tr = t <= split
            if limit is not None:
                tr &= t < limit[read_rows(dataset.users, start, start + SPLIT_CHUNK)]
            yield t, tr, t > split, start

    from_ms, to_ms = last, -last
    n_tr = n_ho = pos_tr = pos_ho = 0
    for t, tr, ho, start in parts():
        used = tr | ho
        from_ms = min(from_ms, int(np.min(t, where=used, initial=last)))
        to_ms = max(to_ms, int(np.max(t, where=used, initial=-last)))
        y = read_rows(dataset.y, start, start + SPLIT_CHUNK)
        n_tr, n_ho = n_tr + int(tr.sum()), n_ho + int(ho.sum())
        pos_tr += int(np.count_nonzero(y[tr] == 1))
        pos_ho += int(np.count_nonzero(y[ho] == 1))
    if not (0 < pos_tr < n_tr and 0 < pos_ho < n_ho):
        rate = (pos_tr + pos_ho) / max(1, n_tr + n_ho)
        raise InvalidArgument(
            f"labels are all one class in the training or holdout part (positive rate {rate:.3f}; "
            f"rule: {LabelRule.of(feature_set).describe()}): check training.label in the repository"
        )
    newest_from = quantile(lambda: (t[tr] for t, tr, _, _ in parts()), 0.9)

    def newest() -> Iterator[np.ndarray]:
        return (tr & (t > newest_from) for t, tr, _, _ in parts())

    folder = Path(str(dataset.x.filename)).parent if whole_file(dataset.x) else None
    part = functools.partial(_row_numbers, index=row_index_dtype(n), folder=folder)
    return _Rows(
        dataset.x, dataset.y, dataset.w, split,
        part(n_tr, (tr for _, tr, _, _ in parts()), "train"),
        part(n_ho, (ho for _, _, ho, _ in parts()), "holdout"),
        part(sum(int(m.sum()) for m in newest()), newest(), "newest"),
        used=n_tr + n_ho, left_out=n - n_tr - n_ho,
        positive_rate=float(np.float32(pos_tr + pos_ho) / (n_tr + n_ho)),  # as y.mean()
        from_ms=from_ms, to_ms=to_ms,
    )  # fmt: skip


SPLIT_CHUNK = 1 << 20  # rows of a column read at a time by _split_rows (8 MB of times)


def _row_numbers(
    count: int, masks: Iterable[np.ndarray], name: str, *, index: Any, folder: Path | None
) -> Rows:
    """The numbers of the `count` rows the consecutive chunk `masks` hold,
    ascending: in memory, or (with `folder`, where the rows' files are) written
    to part-<name>.npy a chunk at a time and mapped in (read as the rows are:
    family.read_rows, take_rows). A file of an earlier split is unlinked, not
    written over: a split still in use keeps reading its own."""
    path = None if folder is None else folder / f"part-{name}.npy"
    if path is not None:
        path.unlink(missing_ok=True)
    column = _Column((count,), index, path)
    at = start = 0
    for mask in masks:
        chunk = np.flatnonzero(mask) + start
        column.put(at, chunk)
        at, start = at + len(chunk), start + len(mask)
    return column.done()


def _train_variants(
    cfg: TrainConfig, layout: Layout, rows: _Rows, l2: float, progress: Callable[[str], None], jobs: int = 1
) -> _Trained:
    """The family trained on the summed loss of its configurations; level 2's
    embedding size chosen on the training rows' newest tenth; every served
    variant measured on the holdout."""
    x, y, tr, ho = rows.x, rows.y, rows.tr, rows.ho
    level1 = pick_level1(x, y, layout, tr)
    configs = trained_configs(make_variants(layout, level1))
    progress(f"training the model family ({len(configs)} configurations, summed loss) ...")
    family = train_family(
        x, y, layout, configs, hidden=cfg.hidden, epochs=cfg.epochs, seed=cfg.seed, l2_embedding=l2,
        progress=_bar(progress, "train"), weights=rows.w, rows=tr,
    )  # fmt: skip
    l1 = make_variants(layout, level1)[1]
    # A sub-network's score reads its columns, dimensions and cross alone (not
    # its level): level 1 and level 2 are two of level 1's prefixes, scored once.
    parts = {"newest": rows.newest, "holdout": ho}
    scored: dict[tuple[str, tuple[str, ...], int, bool], float] = {}

    def measured(v: Variant, part: str) -> float:
        key = (part, v.dense, v.dim, v.cross)
        if key not in scored:
            scored[key] = auc(gather(y, parts[part]), family.predict(x, v, parts[part]))
        return scored[key]

    def at_prefix(part: str) -> dict[int, float]:
        return {d: measured(Variant(1, l1.dense, d, l1.cross), part) for d in PREFIX_DIMS}

    # The holdout's prefixes beside (with jobs > 1), while this process chooses
    # level 2's embedding size on the newest tenth of the training rows (never on
    # the holdout the card reports) and scores the levels that are not prefixes.
    what = "the holdout's AUC at level 1's prefixes"
    beside = run_beside(functools.partial(at_prefix, "holdout"), what, jobs)
    try:
        level2_dim = choose_level2_dim(at_prefix("newest"))
        variants = make_variants(layout, level1, level2_dim)
        for v in variants:
            if (v.dense, v.cross) != (l1.dense, l1.cross) or v.dim not in PREFIX_DIMS:
                measured(v, "holdout")
    except BaseException:
        beside.cancel()
        raise
    prefix_auc = beside.result()
    scored |= {("holdout", l1.dense, d, l1.cross): a for d, a in prefix_auc.items()}
    variant_auc = {v.level: measured(v, "holdout") for v in variants}
    for v in variants:
        progress(f"  level {v.level} ({v.describe(layout)}): holdout AUC {variant_auc[v.level]:.4f}")
    progress("  level 1 at embedding prefixes " + ", ".join(f"{d}: {a:.4f}" for d, a in prefix_auc.items())
             + f" (level 2 serves {level2_dim}: the smallest within {LEVEL2_TOLERANCE} of 128 on the "
             "training rows' newest tenth)")  # fmt: skip
    return _Trained(family, variants, variant_auc, prefix_auc)


def _offline_baseline(
    cfg: TrainConfig, feature_set: FeatureSet, transforms: tuple[Transform, ...], layout: Layout, rows: _Rows,
    l2: float, progress: Callable[[str], None],
) -> _Trained:  # fmt: skip
    """The same family trained without the real-time features' columns (one
    variant, level 0) and its holdout AUC."""
    progress("training baseline (same family, offline features only) ...")
    realtime_cols = {
        c for tf in transforms if feature_set.by_name.get(tf.feature) is not None
        and feature_set.by_name[tf.feature].kind == "realtime" for c in tf.columns
    }  # fmt: skip
    base_variant = offline_only(layout, realtime_cols)
    x, y, tr, ho = rows.x, rows.y, rows.tr, rows.ho
    base = train_family(
        x, y, layout, (base_variant,), hidden=cfg.hidden, epochs=cfg.epochs, seed=cfg.seed,
        l2_embedding=l2, weights=rows.w, rows=tr,
    )  # fmt: skip
    auc_base = auc(gather(y, ho), base.predict(x, base_variant, ho))
    progress(f"  holdout AUC {auc_base:.4f}")
    return _Trained(base, (base_variant,), {0: auc_base}, {})


def _bar(progress: Callable[[str], None], label: str) -> Callable[[int, int], None]:
    """A progress line every 10 % of the steps, with their rate and the time left."""
    bars: dict[int, Callable[[int], None]] = {}

    def step(done: int, total: int) -> None:
        if total not in bars:
            bars[total] = progress_bar(progress, label, total, "steps")
        bars[total](done)

    return step


def export(
    family: Family,
    variants: tuple[Variant, ...],
    dataset: Dataset,
    model_dir: Path,
    feature_set: FeatureSet,
    *,
    metrics: dict[str, Any],
    variant_auc: dict[int, float],
    training_data: dict[str, Any],
    seed: int,
    origin: str,
    started: float,
    current: bool = True,
    offline_only_version: str | None = None,
) -> dict[str, Any]:
    """Every variant's ONNX file and the card under MODEL_DIR/ctr/<version> (the
    version a digest of the files); made the current version when `current`."""
    blobs = {v.level: to_onnx(family, v).SerializeToString() for v in variants}
    digest = hashlib.sha256(b"".join(blobs[level] for level in sorted(blobs))).hexdigest()[:12]
    version = f"{MODEL_NAME}-{digest}"
    out = model_dir / MODEL_NAME / version
    out.mkdir(parents=True, exist_ok=True)
    for level, blob in blobs.items():
        (out / variant_file(level)).write_bytes(blob)
    layout = family.layout
    card: dict[str, Any] = {
        "name": MODEL_NAME,
        "version": version,
        "feature_set_version": feature_set.version,
        "repository": feature_set.name,
        "origin": origin,
        "input": {
            "name": "features",
            "columns": list(layout.columns),
            "transforms": [t.to_json() for t in dataset.transforms],
        },
        "output": {
            "name": "score",
            "meaning": f"P(label) for an impression; label: {LabelRule.of(feature_set).describe()}",
        },
        "training_data": training_data,
        "metrics": metrics,
        **({"offline_only_version": offline_only_version} if offline_only_version else {}),
        "variants": [
            {
                "level": v.level,
                "file": variant_file(v.level),
                "dense_columns": list(v.dense),
                "embedding_dim": v.dim,
                "cross_features": v.cross,
                "weight_bytes": weight_bytes(family, v),
                "file_bytes": len(blobs[v.level]),
                "auc_holdout": round(variant_auc[v.level], 4),
            }
            for v in variants
        ],
        "seed": seed,
        "train_seconds": round(time.perf_counter() - started, 2),
    }
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    if current:
        point_current(model_dir, version)
    return card
