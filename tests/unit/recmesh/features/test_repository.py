"""The feature repository file: what a valid one compiles to, and how a bad one is reported."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from recmesh.features.repository import (
    DEMO_REPOSITORY,
    FeatureSet,
    Guard,
    RepositoryError,
    default_slide_ms,
    load_feature_set,
    parse_duration_ms,
    parse_feature_set,
)

MIN = 60_000
PATH = Path("team/recmesh.toml")

# Line numbers below refer to this text (line 1 is '[repository]').
BASE = """\
[repository]
name = "team"

[events]
behaviors = ["view", "click", "purchase"]
values = ["rating", "price"]

[users.features]
age_band = { type = "categorical" }

[items.features]
category = { type = "categorical", description = "item category" }
length = { type = "integer" }

[realtime.clicks_5m]
entity = "user"
aggregate = "count"
behaviors = ["click"]
window = "5m"
"""

FULL = (
    BASE
    + """
[realtime.category_clicks_10m]
entity = "user"
aggregate = "count_by"
by = "category"
behaviors = ["click"]
window = "10m"
description = "category -> clicks"

[realtime.recent]
entity = "user"
aggregate = "last_n"
n = 3
behaviors = ["click", "view"]
window = "1h"
slide = "exact"

[realtime.spend_1h]
entity = "user"
aggregate = "sum"
field = "price"
behaviors = ["purchase"]
window = "1h"
slide = "exact"

[realtime.rating_mean_1d]
entity = "item"
aggregate = "mean"
field = "rating"
window = "1d"
slide = "exact"
ttl = "2d"

[realtime.views_10m]
entity = "item"
aggregate = "count"
behaviors = ["view"]
window = "10m"

[realtime.item_clicks_10m]
entity = "item"
aggregate = "count"
behaviors = ["click"]
window = "10m"

[realtime.item_clicks_1h]
entity = "item"
aggregate = "count"
behaviors = ["click"]
window = "1h"
slide = "exact"

[recall]
category = "category"
affinity = "category_clicks_10m"
recent_items = "recent"
"""
)


def parse(text: str) -> FeatureSet:
    return parse_feature_set(text, PATH)


def error(text: str) -> str:
    with pytest.raises(RepositoryError) as err:
        parse(text)
    return str(err.value)


def line_of(text: str, needle: str) -> int:
    """The 1-based line of the first line of `text` that starts with `needle`."""
    return next(n for n, line in enumerate(text.splitlines(), start=1) if line.startswith(needle))


def test_a_valid_repository_compiles() -> None:
    feature_set = parse(FULL)
    assert feature_set.name == "team" and feature_set.path == PATH.resolve() and not feature_set.demo
    assert [f.name for f in feature_set.features] == [
        "age_band", "category", "length",  # offline first, in declaration order
        "clicks_5m", "category_clicks_10m", "recent", "spend_1h", "rating_mean_1d", "views_10m",
        "item_clicks_10m", "item_clicks_1h",
    ]  # fmt: skip
    clicks = feature_set.by_name["clicks_5m"]
    assert (clicks.entity, clicks.kind, clicks.dtype, clicks.window_ms) == (
        "user",
        "realtime",
        "int",
        5 * MIN,
    )
    assert clicks.behaviors == {"click"} and clicks.default == 0 and clicks.ttl_s == 3600  # default ttl: 1 h
    assert (
        feature_set.by_name["category_clicks_10m"].dtype == "counts"
        and feature_set.by_name["recent"].dtype == "strings"
    )
    assert feature_set.by_name["recent"].scan == 10  # default: max(n, 10)
    mean = feature_set.by_name["rating_mean_1d"]
    assert mean.behaviors == {"view", "click", "purchase"}  # no filter: every behaviour
    assert (mean.dtype, mean.field, mean.ttl_s) == ("float", "rating", 2 * 86_400)
    assert feature_set.by_name["category"].default == "unknown" and feature_set.by_name["length"].default == 0
    assert feature_set.behaviors == ("view", "click", "purchase") and feature_set.value_names == (
        "rating",
        "price",
    )


def test_streams_group_features_by_entity_and_behaviour_filter() -> None:
    feature_set = parse(FULL)
    streams = {(s.entity, s.id): s for s in feature_set.streams}
    assert set(streams) == {
        ("user", "click"), ("user", "click+view"), ("user", "click+view@last"), ("user", "purchase"),
        ("item", "click+purchase+view"), ("item", "view"), ("item", "click"),
    }  # fmt: skip
    user_clicks = streams[("user", "click")]
    assert [f.name for f in user_clicks.features] == ["clicks_5m", "category_clicks_10m"]
    assert user_clicks.attrs == ("category",) and not user_clicks.other_id and user_clicks.read == "range"
    assert user_clicks.windows == (10 * MIN, 5 * MIN)
    # State is kept long enough to fill the widest window, and lives as long as its features' TTL.
    assert user_clicks.retention_ms >= 10 * MIN and user_clicks.ttl_s == 3600
    recent = streams[("user", "click+view")]  # ["click", "view"]: one filter whatever the order
    assert recent.other_id and recent.read == "latest" and recent.scan == 10
    # Co-visitation (default: the recent items' behaviours, 30 min) keeps a capped list of
    # the user's newest distinct items of those behaviours: its state does not grow with events.
    covisit = streams[("user", "click+view@last")]
    assert feature_set.roles.covisit_stream == "click+view@last" and covisit.read == "distinct"
    assert covisit.features == () and covisit.scan == 10 and covisit.retention_ms >= 30 * MIN
    assert streams[("user", "purchase")].values == ("price",)
    assert streams[("item", "click+purchase+view")].values == ("rating",)
    item_clicks = streams[("item", "click")]
    assert item_clicks.read == "count" and item_clicks.other_id
    assert not (item_clicks.attrs or item_clicks.values)
    assert item_clicks.windows == (60 * MIN, 10 * MIN)  # widest first
    assert {s.id for s in feature_set.streams_of("item")} == {"click+purchase+view", "view", "click"}
    assert feature_set.attributes_needed("item") == ("category",)  # what user count_by features group by
    assert feature_set.attributes_needed("user") == ()


def test_windows_of_an_hour_or_more_are_tiled_by_default() -> None:
    feature_set = parse(FULL.replace('slide = "exact"\n', ""))
    streams = {(s.entity, s.id): s for s in feature_set.streams}
    # 1 h: 1-minute tiles; 1 d: 30-minute tiles (at least 48 per window); a last_n keeps a
    # capped list of distinct ids; windows under an hour stay exact.
    assert streams[("user", "purchase@1m")].read == "tiles"
    assert streams[("user", "purchase@1m")].slide_ms == MIN
    assert streams[("item", "click+purchase+view@30m")].slide_ms == 30 * MIN
    assert streams[("item", "click@1m")].windows == (60 * MIN,)
    assert streams[("item", "click")].read == "count" and streams[("item", "click")].windows == (10 * MIN,)
    recent = streams[("user", "click+view@last")]
    # the last_n and co-visitation share the list: at least n, and co-visitation's scan
    assert recent.read == "distinct" and recent.scan == 10 and [f.name for f in recent.features] == ["recent"]
    assert feature_set.roles.covisit_stream == "click+view@last" and ("user", "click+view") not in streams
    # the slides in force are part of the feature-set version
    assert feature_set.version != parse(FULL).version
    assert default_slide_ms(7 * 24 * 60 * MIN) == 3 * 60 * MIN and default_slide_ms(59 * MIN) == 0


def test_a_slide_must_divide_the_window() -> None:
    msg = error(BASE.replace('window = "5m"', 'window = "5m"\nslide = "2m"'))
    assert "slide '2m' must divide the window '5m'" in msg
    assert "slide" in error(BASE.replace('window = "5m"', 'window = "5m"\nslide = "10m"'))
    tiled = parse(BASE.replace('window = "5m"', 'window = "5m"\nslide = "30s"'))
    assert tiled.streams[0].read == "tiles" and tiled.streams[0].slide_ms == 30_000


def test_covisitation_gets_a_stream_of_its_own_when_no_feature_has_its_filter() -> None:
    feature_set = parse(
        FULL + 'covisit = { behaviors = ["purchase", "view"], window = "2h", previous = 3 }\n'
    )
    s = feature_set.stream("purchase+view@last", "user")
    assert s.features == () and s.other_id and s.read == "distinct" and s.retention_ms >= 120 * MIN
    assert s.ttl_s >= 7200, "state expiring before the co-visitation window ends would lose earlier items"
    assert s.scan == 10  # covisit.scan (default 10): the newest distinct items kept
    assert (feature_set.roles.covisit_stream, feature_set.roles.covisit_previous) == ("purchase+view@last", 3)


def test_the_version_is_a_content_hash_of_what_decides_values() -> None:
    version = parse(FULL).version
    assert re.fullmatch(r"fs-[0-9a-f]{12}", version)
    assert parse(FULL).version == version  # deterministic
    # Descriptions, the file's location, recall roles and training rules do not count.
    assert parse(FULL.replace("category -> clicks", "clicks per category")).version == version
    assert parse(FULL.replace('description = "item category"', 'description = "x"')).version == version
    assert parse_feature_set(FULL, Path("elsewhere/recmesh.toml")).version == version
    assert parse(FULL + 'covisit = { window = "1h" }\n').version == version
    assert (
        parse(
            FULL + '\n[training]\nexamples = ["view"]\nlabel = { behaviors = ["purchase"], within = "1h" }\n'
        ).version
        == version
    )
    # A window, a behaviour filter, a declared type or the vocabulary does.
    changed = [
        FULL.replace('window = "10m"\ndescription', 'window = "15m"\ndescription'),
        FULL.replace('behaviors = ["click"]\nwindow = "5m"', 'behaviors = ["click", "view"]\nwindow = "5m"'),
        FULL.replace('length = { type = "integer" }', 'length = { type = "numeric" }'),
        FULL.replace('"view", "click", "purchase"]', '"view", "click", "purchase", "share"]'),
    ]  # fmt: skip
    versions = {parse(text).version for text in changed}
    assert len(versions) == len(changed) and version not in versions


def test_the_demo_repository_loads(demo_feature_set: FeatureSet) -> None:
    assert (
        demo_feature_set.demo and demo_feature_set.name == "demo" and demo_feature_set.path == DEMO_REPOSITORY
    )
    assert (
        load_feature_set(DEMO_REPOSITORY.parent).version == demo_feature_set.version
    )  # a directory: its recmesh.toml
    assert demo_feature_set.version == parse_feature_set(DEMO_REPOSITORY.read_text(), DEMO_REPOSITORY).version
    assert {f.name for f in demo_feature_set.features} == {
        "age_band", "interest_tags", "category", "length", "author_level", "popularity",
        "clicks_5m", "category_clicks_10m", "last_viewed_3", "clicks_10m", "views_10m",
    }  # fmt: skip
    assert (
        demo_feature_set.roles.recent_items == "last_viewed_3"
        and demo_feature_set.roles.affinity == "category_clicks_10m"
    )


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(RepositoryError, match=r"nowhere\.toml: cannot read the repository file"):
        load_feature_set(tmp_path / "nowhere.toml")


def test_aliases_map_onto_the_vocabulary() -> None:
    feature_set = parse(
        BASE.replace('values = ["rating", "price"]', 'aliases = { buy = "purchase", tap = "click" }')
    )
    assert feature_set.aliases == {"buy": "purchase", "tap": "click"}
    schema = feature_set.event_schema
    assert (schema.behavior("buy"), schema.behavior("tap"), schema.behavior("view")) == (
        "purchase",
        "click",
        "view",
    )
    with pytest.raises(ValueError, match=r"unknown behaviour 'like'.*aliases buy, tap"):
        schema.behavior("like")


def test_durations() -> None:
    assert [parse_duration_ms(d) for d in ("250ms", "30s", "10m", "1h", "2d", 1500)] == [
        250, 30_000, 600_000, 3_600_000, 172_800_000, 1500,
    ]  # fmt: skip
    for bad in ("10 minutes", "0s", -5, "m"):
        with pytest.raises(ValueError):
            parse_duration_ms(bad)


# --- bad repositories: the file, the line and the key ------------------------------------

REALTIME_AT = line_of(BASE, "[realtime.clicks_5m]")


def test_an_unknown_key_is_named_with_its_line() -> None:
    text = BASE + 'windw = "5m"\n'
    msg = error(text)
    assert msg.startswith(f"{PATH}:{line_of(text, 'windw')}: realtime.clicks_5m.windw: unknown key"), msg
    text = BASE + "\n[extra]\nx = 1\n"
    assert error(text).startswith(f"{PATH}:{line_of(text, '[extra]')}: extra: unknown key")


def test_an_unknown_behaviour_in_a_feature() -> None:
    text = BASE.replace('behaviors = ["click"]', 'behaviors = ["like"]')
    msg = error(text)
    at = line_of(text, 'behaviors = ["like"]')
    assert msg.startswith(f"{PATH}:{at}: realtime.clicks_5m.behaviors: ")
    assert "['like'] not in events.behaviors" in msg


@pytest.mark.parametrize(
    "by",
    [
        "length",  # an item feature, but numeric
        "age_band",  # categorical, but of the user itself
        "genre",  # not declared at all
    ],
)
def test_count_by_must_group_by_a_categorical_feature_of_the_other_entity(by: str) -> None:
    text = (
        BASE + f'\n[realtime.per_{by}]\nentity = "user"\naggregate = "count_by"\nby = "{by}"\nwindow = "5m"\n'
    )
    msg = error(text)
    at = line_of(text, f'by = "{by}"')
    assert msg.startswith(f"{PATH}:{at}: realtime.per_{by}.by: '{by}' must be"), msg
    assert "categorical or multi offline feature of the item" in msg


def test_ttl_shorter_than_the_window() -> None:
    msg = error(BASE + 'ttl = "1m"\n')
    assert msg.startswith(f"{PATH}:{REALTIME_AT}: realtime.clicks_5m: ttl must be at least the window"), msg


@pytest.mark.parametrize(
    ("aggregate", "needs"), [("count_by", "by"), ("last_n", "n"), ("sum", "field"), ("mean", "field")]
)
def test_an_aggregate_missing_its_parameter(aggregate: str, needs: str) -> None:
    text = BASE + f'\n[realtime.agg]\nentity = "user"\naggregate = "{aggregate}"\nwindow = "5m"\n'
    msg = error(text)
    assert (
        msg
        == f"{PATH}:{line_of(text, '[realtime.agg]')}: realtime.agg: aggregate '{aggregate}' needs '{needs}'"
    )


def test_a_parameter_that_does_not_apply_and_an_undeclared_field() -> None:
    assert f"{PATH}:{REALTIME_AT}: realtime.clicks_5m: 'by' does not apply to aggregate 'count'" in error(
        BASE + 'by = "category"\n'
    )
    text = BASE + '\n[realtime.s]\nentity = "user"\naggregate = "sum"\nfield = "stars"\nwindow = "5m"\n'
    assert error(text) == (
        f"{PATH}:{line_of(text, 'field = ')}: realtime.s.field: 'stars' is not declared in events.values"
    )


def test_duplicate_feature_names() -> None:
    text = BASE + '\n[realtime.category]\nentity = "item"\naggregate = "count"\nwindow = "5m"\n'
    msg = error(text)
    assert msg.startswith(
        f"{PATH}:{line_of(text, '[realtime.category]')}: realtime.category: feature 'category'"
    )
    assert "declared twice" in msg
    text = BASE.replace("[items.features]\n", '[items.features]\nage_band = { type = "integer" }\n')
    at = line_of(text, 'age_band = { type = "integer" }')
    assert error(text).startswith(f"{PATH}:{at}: items.features.age_band: feature 'age_band'")


def test_a_toml_syntax_error_names_the_line() -> None:
    msg = error(BASE + "window = \n")
    assert msg.startswith(f"{PATH}: not valid TOML: ") and "line 20" in msg, msg
    assert "line 2," in error(BASE.replace('name = "team"', 'name = "team'))


def test_bad_aliases() -> None:
    msg = error(BASE.replace('values = ["rating", "price"]', 'aliases = { like = "heart" }'))
    assert msg.startswith(f"{PATH}:{line_of(BASE, '[events]')}: events: ")
    assert "aliases.like: 'heart' is not in behaviors ['view', 'click', 'purchase']" in msg
    hiding = error(BASE.replace('values = ["rating", "price"]', 'aliases = { click = "view" }'))
    assert "aliases.click: 'click' is itself a declared behaviour" in hiding


@pytest.mark.parametrize(
    ("training", "named"),
    [
        (
            'examples = ["impression"]\nlabel = { field = "rating", at_least = 4 }',
            "training.examples: ['impression'] not in events.behaviors",
        ),
        (
            'examples = ["view"]\nlabel = { behaviors = ["klick"], within = "10s" }',
            "training.label.behaviors: ['klick']",
        ),
        (
            'examples = ["view"]\nlabel = { behaviors = ["click"], within = "soon" }',
            "training.label.within: 'soon' is not a duration",
        ),
        (
            'examples = ["view"]\nlabel = { field = "stars", at_least = 4 }',
            "training.label.field: 'stars' is not declared",
        ),
        (
            'examples = ["view"]\nlabel = { implicit = true, field = "rating", at_least = 4 }',
            "give one of: implicit = true",
        ),
        (
            'examples = ["view"]\nlabel = { implicit = true }\nweights = { click = 2 }',
            "training.weights: ['click'] not in training.examples",
        ),
        (
            'examples = ["view"]\nlabel = { implicit = true }\nweights = { view = 0 }',
            "training.weights: weights must be positive",
        ),
    ],
)
def test_training_rules_are_checked_when_the_file_loads(training: str, named: str) -> None:
    assert named in error(BASE + f"\n[training]\n{training}\n")


def test_a_repository_without_training_rules_serves_and_says_so_when_asked_to_train() -> None:
    from recmesh.errors import FailedPrecondition
    from recmesh.features.backfill import LabelRule

    feature_set = parse(BASE)  # no [training]: it serves features all the same
    with pytest.raises(FailedPrecondition, match=r"declares no \[training\]"):
        LabelRule.of(feature_set)


def test_a_bad_duration_names_its_key() -> None:
    assert "freshness_tau: 'a while' is not a duration" in error(BASE + 'freshness_tau = "a while"\n')


DERIVE = 'values = ["rating"]\nderive = [{ behavior = "click", when = { field = "rating", at_least = 4 } }]'


def test_derive_rules_are_validated() -> None:
    feature_set = parse(BASE.replace('values = ["rating", "price"]', DERIVE))
    (rule,) = feature_set.decl.events.derive
    assert (
        rule.behavior == "click" and rule.when.holds({"rating": 4.0}) and not rule.when.holds({"rating": 3.9})
    )
    assert not rule.when.holds({})
    events_at = line_of(BASE, "[events]")
    bad_behavior = error(BASE.replace('values = ["rating", "price"]', DERIVE.replace('"click"', '"share"')))
    assert bad_behavior.startswith(
        f"{PATH}:{events_at}: events: derive[0].behavior 'share' is not in behaviors"
    )
    bad_field = error(
        BASE.replace('values = ["rating", "price"]', DERIVE.replace('field = "rating"', 'field = "stars"'))
    )
    assert "derive[0].when.field 'stars' is not a declared value" in bad_field
    for when in ('{ field = "rating", at_least = 4, below = 2 }', '{ field = "rating" }'):
        text = BASE.replace(
            'values = ["rating", "price"]',
            f'values = ["rating"]\nderive = [{{ behavior = "click", when = {when} }}]',
        )
        msg = error(text)
        assert msg == (
            f"{PATH}:{line_of(text, 'derive')}: events.derive[0].when: "
            "set exactly one of at_least, above, at_most, below, equals"
        )
    # As an array of tables.
    text = (
        BASE
        + '\n[[events.derive]]\nbehavior = "purchase"\nwhen = { field = "price", above = 0, equals = 1 }\n'
    )
    assert error(text).startswith(
        f"{PATH}:{line_of(text, 'when = ')}: events.derive[0].when: set exactly one"
    )


def test_the_messages_of_several_problems_are_all_given() -> None:
    text = BASE.replace('window = "5m"', 'windw = "5m"')
    msg = error(text)
    assert (
        "realtime.clicks_5m.window: Field required" in msg and "realtime.clicks_5m.windw: unknown key" in msg
    )


# --- [evaluation]: what credits an answer online ------------------------------------------


def test_evaluation_defaults_to_the_label_behaviours_else_click() -> None:
    plain = parse(BASE).evaluation
    assert plain.positive == {"click"} and (plain.window_ms, plain.lateness_ms, plain.k) == (
        1_800_000,
        120_000,
        10,
    )
    labelled = parse(
        BASE + '\n[training]\nexamples = ["view"]\nlabel = { behaviors = ["purchase"], within = "1h" }\n'
    )
    assert labelled.evaluation.positive == {"purchase"}
    declared = parse(
        BASE + '\n[evaluation]\npositive = ["purchase", "click"]\nwindow = "1d"\nk = 5\n'
    ).evaluation
    assert declared.positive == {"purchase", "click"} and declared.window_ms == 86_400_000 and declared.k == 5
    assert parse(BASE).version == parse(BASE + '\n[evaluation]\nwindow = "1d"\n').version, "not a feature"


def test_evaluation_errors_name_the_key() -> None:
    assert "evaluation.positive: ['like'] not in events.behaviors" in error(
        BASE + '\n[evaluation]\npositive = ["like"]\n'
    )
    assert "evaluation.window" in error(BASE + '\n[evaluation]\nwindow = "soon"\n')
    assert "evaluation.k" in error(BASE + "\n[evaluation]\nk = 0\n")


def test_the_guard_is_off_unless_declared_and_takes_its_defaults() -> None:
    assert parse(BASE).evaluation.guard is None
    defaults = parse(BASE + "\n[evaluation.guard]\n").evaluation.guard
    assert defaults == Guard(
        metric="auc", min_answers=1000, max_drop=0.01, confidence=0.95, max_answers=20_000
    )
    declared = parse(
        BASE + '\n[evaluation.guard]\nmetric = "ctr"\nmin_answers = 500\nmax_drop = 0.002\n'
        "confidence = 0.99\nmax_answers = 5000\n"
    ).evaluation.guard
    assert declared == Guard("ctr", 500, 0.002, 0.99, 5000)
    assert parse(BASE).version == parse(BASE + "\n[evaluation.guard]\n").version, "not a feature"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('metric = "mrr"', "evaluation.guard.metric: Input should be 'auc', 'ctr', 'hit' or 'ndcg'"),
        ("min_answers = 1", "evaluation.guard.min_answers: 1 must be at least 2"),
        (
            "min_answers = 500\nmax_answers = 100",
            "evaluation.guard.max_answers: 100 must be at least min_answers",
        ),
        ("max_drop = -0.1", "evaluation.guard.max_drop: -0.1 must be in [0, 1)"),
        ("confidence = 1.0", "evaluation.guard.confidence: 1.0 must be in [0.5, 1)"),
        ("confidence = 0.3", "evaluation.guard.confidence"),
        ("metrc = 'auc'", "evaluation.guard.metrc: unknown key"),
    ],
)
def test_guard_errors_name_the_key(body: str, message: str) -> None:
    text = BASE + f"\n[evaluation]\nk = 5\n\n[evaluation.guard]\n{body}\n"
    msg = error(text)
    assert message in msg, msg
    key = message.split(":", 1)[0].rsplit(".", 1)[1]
    assert msg.startswith(f"{PATH}:{line_of(text, key)}: "), msg  # the line of the key named
