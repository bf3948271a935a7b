"""The replay's plan: where visits start, when two arms' intervals separate for good, and
which model serves the other arm."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from recmesh.evaluation.sums import Estimate
from recmesh.events import Event
from recmesh.features.repository import FeatureSet
from recmesh.modeldir import current_model, point_current
from recmesh.tools.bench.online import HOUR_MS, Visit, _experiment, _offline_aucs, separated_after, visits
from recmesh.tools.training.train import TrainConfig, build_dataset, demo_source, train


def _ev(user: str, t: int) -> Event:
    return Event(event_id=f"{user}-{t}", user_id=user, item_id="i1", behavior="view", event_time=t)


def test_a_visit_starts_after_a_gap_and_none_after_the_last_request_time() -> None:
    t0 = 500_000 * HOUR_MS  # 2027
    live = [_ev("a", t0), _ev("a", t0 + 60_000), _ev("b", t0 + 1), _ev("a", t0 + 2 * HOUR_MS),
            _ev("c", t0 + 3 * HOUR_MS), _ev("a", t0 + 9 * HOUR_MS)]  # fmt: skip
    got = visits(live, last_ms=t0 + 5 * HOUR_MS, gap_ms=HOUR_MS, before={"b": t0 - 10})
    assert got == [Visit("a", t0 - 1), Visit("a", t0 + 2 * HOUR_MS - 1), Visit("c", t0 + 3 * HOUR_MS - 1)]


def test_intervals_separate_for_good_only_once_they_stay_apart() -> None:
    def e(mean: float, hw: float) -> Estimate:
        return Estimate(mean, hw, 10)

    curve = [(10, e(0.5, 0.3), e(0.4, 0.3)), (20, e(0.6, 0.05), e(0.4, 0.05)),
             (30, e(0.5, 0.1), e(0.45, 0.1)), (40, e(0.6, 0.02), e(0.4, 0.02)),
             (50, e(0.6, 0.01), e(0.4, 0.01))]  # fmt: skip
    assert separated_after(curve) == 40
    assert separated_after([(10, e(0.5, 0.3), e(0.4, 0.3))]) is None
    assert separated_after([]) is None


def test_attribution_counters_are_read_from_its_metrics_text() -> None:
    from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

    from recmesh.tools.bench.online import _metric

    registry = CollectorRegistry()
    answers = Counter("recmesh_attribution_answers", "", ("outcome",), registry=registry)
    answers.labels("added").inc(7)
    answers.labels("expired").inc(2)
    Gauge("recmesh_attribution_pending", "", registry=registry).set(3)
    text = generate_latest(registry).decode()
    assert _metric(text, "recmesh_attribution_answers_total", {"outcome": "added"}) == 7
    assert _metric(text, "recmesh_attribution_pending") == 3
    assert _metric(text, "recmesh_attribution_answers_total", {"outcome": "already_added"}) == 0


def test_the_offline_only_candidate_is_the_baseline_trained_beside_the_model(
    tmp_path: Path, demo_feature_set: FeatureSet
) -> None:
    ds = build_dataset(demo_feature_set, *demo_source(TrainConfig(sessions=150, hours=0.5)))
    card = train(TrainConfig(epochs=1), tmp_path, demo_feature_set, ds, progress=lambda _: None).card
    args = argparse.Namespace(
        candidate="offline-only", share=30.0, level=3, model_dir=str(tmp_path), shadow=False, control=None
    )
    exp = _experiment(args, tmp_path)
    assert (exp.kind, exp.candidate, exp.share) == ("model", card["offline_only_version"], 30.0)
    assert _offline_aucs(tmp_path, exp) == {
        "control": card["metrics"]["auc_holdout"],
        "candidate": card["metrics"]["auc_holdout_offline_only"],
    }
    shadow = _experiment(argparse.Namespace(**{**vars(args), "share": 0.0, "shadow": True}), tmp_path)
    assert shadow.shadow and shadow.share == 0 and shadow.candidate == exp.candidate
    assert _offline_aucs(tmp_path, shadow)["shadow"] == card["metrics"]["auc_holdout_offline_only"]
    levels = argparse.Namespace(candidate=None, share=50.0, level=3, model_dir="", shadow=False, control=None)
    level = _experiment(levels, tmp_path)
    assert _offline_aucs(tmp_path, level)["level:3"] == card["variants"][3]["auc_holdout"]
    with pytest.raises(SystemExit, match="--shadow scores with a candidate model"):
        _experiment(argparse.Namespace(**{**vars(levels), "shadow": True}), tmp_path)
    # Any two versions: the baseline served as control, the model as the candidate.
    swapped = argparse.Namespace(**{**vars(args), "control": exp.candidate, "candidate": card["version"]})
    assert _experiment(swapped, tmp_path).candidate == card["version"]
    assert current_model(tmp_path) == tmp_path / "ctr" / exp.candidate
    for wrong in ({"candidate": "ctr-nope"}, {"candidate": exp.candidate}, {"control": "ctr-nope"}):
        with pytest.raises(SystemExit, match=r"ctr-nope: no such model version|not one of shuffled"):
            _experiment(argparse.Namespace(**{**vars(swapped), **wrong}), tmp_path)
    point_current(tmp_path, card["version"])
    # A model trained before baselines were exported names none: refused, saying what to do.
    path = tmp_path / "ctr" / card["version"] / "card.json"
    path.write_text(json.dumps({k: v for k, v in card.items() if k != "offline_only_version"}))
    with pytest.raises(SystemExit, match=r"names no offline-only baseline.*train it again"):
        _experiment(args, tmp_path)
