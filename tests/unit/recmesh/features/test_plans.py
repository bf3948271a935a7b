"""The services' plans, compiled once per feature set."""

from __future__ import annotations

from pathlib import Path

from recmesh.features.plans import plans
from recmesh.features.repository import DEMO_REPOSITORY, load_feature_set

ROOT = Path(__file__).resolve().parents[4]


def test_one_compilation_per_feature_set_version() -> None:
    first, again = load_feature_set(DEMO_REPOSITORY), load_feature_set(DEMO_REPOSITORY)
    assert first is not again and plans(first) is plans(again)
    other = load_feature_set(ROOT / "examples" / "movielens" / "recmesh.toml")
    assert plans(other) is not plans(first)


def test_the_read_plan_lays_out_the_item_scripts_reply() -> None:
    feature_set = load_feature_set(DEMO_REPOSITORY)
    read = plans(feature_set).read
    assert read.item_streams == feature_set.streams_of(
        "item"
    ) and read.user_streams == feature_set.streams_of("user")
    assert read.item_widths == tuple(
        len(s.windows) + 1 if s.read == "count" else 1 for s in feature_set.streams_of("item")
    )
    assert read.item_stride == sum(read.item_widths)
    assert set(read.layouts) == {(s.entity, s.id) for s in feature_set.streams}
    spec = read.item_spec(10_000_000)
    assert spec.count(";") == len(read.item_streams) - 1
    assert [name for name, _ in read.offline_defaults["item"]] == [
        f.name for f in feature_set.features_of("item", "offline")
    ]


def test_the_write_plan_says_where_an_event_goes() -> None:
    feature_set = load_feature_set(DEMO_REPOSITORY)
    write = plans(feature_set).write
    assert write.streams == {e: feature_set.streams_of(e) for e in ("user", "item")}
    assert write.ids.retention_ms == feature_set.retention_ms and write.ids.entity == "user"
    assert write.covisit_stream == feature_set.roles.covisit_stream
    assert set(feature_set.attributes_needed("item")) <= set(write.attributes_needed["item"])
