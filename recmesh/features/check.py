"""A repository file held against a team's event log and catalog, in seconds.

`check_log` finds what would fail minutes later (`train` replaying the whole
log, then refusing one class of labels) and what is valid but probably not
what the team meant. Every finding names the repository file's line of the
key it is about and says what to write instead. `recmesh repository check
LOG` prints them; `recmesh train --events` refuses on the errors before any
replay and prints the warnings.

Errors (training cannot work):
- no event of the example behaviours;
- no positive example under the label rule (e.g. a label that waits for a
  later event of the example's own behaviour: an event never labels itself);
- every example positive and no sampled negatives: one class;
- (for a ranking evaluation) no user with a positive example after an earlier
  event of theirs: nothing to hold out and rank from a history.

Warnings (valid, likely unmeant):
- a behaviour declared and never seen in the log;
- a real-time window longer than the log's whole span;
- a recall role on an attribute that (nearly) every item or user lacks;
- an item catalog with no item of the log (ids that do not match).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from recmesh.events import Event
from recmesh.features.backfill import LabelRule, positive_examples
from recmesh.features.eventlog import EventTable, behaviour_codes, behaviour_flags
from recmesh.features.repository import FeatureSet, key_location
from recmesh.retrieval.build import last_targets

EMPTY_SHARE = 0.9  # a recall role on an attribute empty for more than this share of entities warns


@dataclass(frozen=True)
class Finding:
    level: Literal["error", "warning"]
    key: str  # the repository key it is about, e.g. "training.label"
    where: str  # "path:line" of that key
    message: str

    def text(self) -> str:
        return f"{self.where}: {self.key}: {self.message}"


def check_log(
    feature_set: FeatureSet,
    events: Sequence[Event],
    users: Mapping[str, Mapping[str, Any]] | None = None,
    items: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    ranking: bool = True,
) -> list[Finding]:
    """Errors first, then warnings (module docstring). `events` sorted by time."""
    found: list[Finding] = []

    def add(level: Literal["error", "warning"], key: str, message: str) -> None:
        found.append(Finding(level, key, key_location(feature_set, key), message))

    if feature_set.decl.training is not None:
        _labels(feature_set, events, ranking, add)
    seen = _behaviours(events)
    never = [b for b in feature_set.behaviors if b not in seen]
    if events and never:
        add("warning", "events.behaviors", f"{never} declared and never seen in the log "
            f"({len(events):,} events; it has {sorted(seen)})")  # fmt: skip
    if len(events) > 1:
        span = events[-1].event_time - events[0].event_time
        for f in feature_set.features:
            if f.kind == "realtime" and f.window_ms and f.window_ms > span:
                add("warning", f"realtime.{f.name}.window",
                    f"{f.window_ms / 86_400_000:g} days is longer than the log's span "
                    f"({span / 86_400_000:.1f} days): as of any moment the window holds the whole "
                    "past")  # fmt: skip
    roles = feature_set.roles
    for entity, role, feature, table in (
        ("item", "recall.category", roles.category, items),
        ("user", "recall.interests", roles.interests, users),
    ):
        if feature is None or not table:
            continue
        default = feature_set.by_name[feature].default
        empty = sum(1 for row in table.values() if row.get(feature) in (None, "", [], default))
        if empty > EMPTY_SHARE * len(table):
            add("warning", role, f"{feature!r} is empty for {empty:,} of {len(table):,} {entity}s: "
                f"{role.split('.')[1]} recall proposes almost nothing (learnt retrieval does not "
                "need it)")  # fmt: skip
    if items and events:
        logged = _items(events)
        if not logged & set(items):
            add("warning", "items.id", f"none of the log's {len(logged):,} item ids is in the items file "
                f"({len(items):,} rows; e.g. log {sorted(logged)[:2]}, file {sorted(items)[:2]}): "
                "check the id column")  # fmt: skip
    return found


def _behaviours(events: Sequence[Event]) -> set[str]:
    codes, names = behaviour_codes(events)
    return {names[c] for c in np.unique(codes).tolist()}


def _items(events: Sequence[Event]) -> set[str]:
    if isinstance(events, EventTable):
        found = {events.items[c] for c in np.unique(events.codes()[2]).tolist()}
        events.let_go()
        return found
    return {ev.item_id for ev in events}


def _labels(feature_set: FeatureSet, events: Sequence[Event], ranking: bool, add: Any) -> None:
    rule = LabelRule.of(feature_set)
    examples = int(behaviour_flags(events, rule.examples).sum())
    if not examples:
        add("error", "training.examples", f"the log has no event of {sorted(rule.examples)} "
            f"(it has {sorted(_behaviours(events))})")  # fmt: skip
        return
    positive = positive_examples(rule, events)
    positives = sum(positive)
    if not positives:
        hint = (
            'label by a later event of another behaviour (label = { behaviors = [...], within = "..." }), '
            "by a value the events carry (label = { field = ..., at_least = ... }), or, when every "
            "example is itself a positive (purchases, plays), label = { implicit = true } with "
            "training.negatives = 4"
        )
        if rule.behaviors & rule.examples:
            hint = (
                f"an event never labels itself, so {sorted(rule.behaviors & rule.examples)} events wait "
                "for a later one. When every example is itself a positive (purchases, plays), write "
                "label = { implicit = true } with training.negatives = 4"
            )
        add("error", "training.label", f"({rule.describe()}) calls none of the {examples:,} example "
            f"events positive, and a model cannot learn from one class: {hint}")  # fmt: skip
        return
    if positives == examples and not rule.negatives:
        add("error", "training.negatives", f"the label calls every one of the {examples:,} example "
            "events positive and training.negatives is 0: a model cannot learn from one class; write "
            "negatives = 4 (catalog items the user had no event on, drawn per example)")  # fmt: skip
    if ranking and not last_targets(events, positive):  # the split `train --ranking` holds out
        add("error", "training.label", f"no user has a positive example after an earlier event of "
            "theirs, so a ranking evaluation has nothing to hold out and rank from a history "
            f"({positives:,} positives, none with an earlier event of its user on another item)")  # fmt: skip


def errors(found: Sequence[Finding]) -> list[Finding]:
    return [f for f in found if f.level == "error"]
