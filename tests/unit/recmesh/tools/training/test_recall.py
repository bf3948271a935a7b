"""`recmesh recall`: building a repository's learnt retrieval, a team's table, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recmesh.errors import InvalidArgument
from recmesh.events import Event
from recmesh.features.repository import FeatureSet
from recmesh.retrieval import files
from recmesh.tools.cli.main import main as cli_main
from recmesh.tools.training import recall


def _events(feature_set: FeatureSet) -> list[Event]:
    """Per user six steps, each a view and a click on it a moment later (the
    demo's label: a click within 10 s makes the view a positive example)."""
    assert set(feature_set.roles.learnt_behaviors) == {"click"}
    out = []
    for u in range(60):
        for s in range(6):
            t = 1_700_000_000_000 + s * 10_000 + u
            item = f"i{(u + s) % 25}"
            out.append(
                Event(event_id=f"v{u}-{s}", user_id=f"u{u}", item_id=item, behavior="view", event_time=t)
            )
            out.append(Event(event_id=f"c{u}-{s}", user_id=f"u{u}", item_id=item, behavior="click",
                             event_time=t + 1000))  # fmt: skip
    return sorted(out, key=lambda e: (e.event_time, e.event_id))


def test_build_tunes_builds_and_records_a_current_version(
    tmp_path: Path, demo_feature_set: FeatureSet
) -> None:
    card, _ = recall.build(demo_feature_set, _events(demo_feature_set), tmp_path, progress=lambda _: None)
    assert files.current_version(tmp_path) == card["version"]
    assert card["feature_set_version"] == demo_feature_set.version
    assert set(card["sources"]) == {"knn", "ease", "sequence"} and card["tuning"]["users"] > 0
    assert set(card["fusion"]) <= {"knn", "ease", "sequence", "popular"} and max(card["fusion"].values()) > 0
    assert 1 <= card["sources"]["sequence"]["epochs"] <= 8
    loaded = files.load_current(tmp_path, demo_feature_set.version)
    assert loaded is not None and len(loaded.tables["knn"]) == 25 and len(loaded.tables["sequence"]) == 25


def test_a_log_without_the_learnt_behaviours_is_a_clear_error(
    tmp_path: Path, demo_feature_set: FeatureSet
) -> None:
    events = [e for e in _events(demo_feature_set) if e.behavior == "view"]
    with pytest.raises(InvalidArgument, match="no event of the learnt behaviours"):
        recall.build(demo_feature_set, events, tmp_path, progress=lambda _: None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("item_id,similar_id,score\na,b,0.5\na,c,oops\n", r"similar.csv:3: ValueError"),
        ("item,other\na,b\n", r"similar.csv:1: the header must name item_id, similar_id and score"),
        ("", "empty"),
    ],
)
def test_a_bad_similar_items_file_names_the_line(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "similar.csv").write_text(text)
    with pytest.raises(InvalidArgument, match=message):
        recall.read_similar(tmp_path / "similar.csv")


def test_import_keeps_the_current_tables_and_the_cli_says_a_mistake_in_one_line(
    tmp_path: Path, demo_feature_set: FeatureSet, capsys: pytest.CaptureFixture[str]
) -> None:
    recall.build(demo_feature_set, _events(demo_feature_set), tmp_path, progress=lambda _: None)
    table = tmp_path / "similar.jsonl"
    table.write_text(json.dumps({"item_id": "i1", "similar_id": "i2", "score": 1.0}) + "\n")
    where = ["--model-dir", str(tmp_path), "--repository", str(demo_feature_set.path)]
    assert cli_main(["recall", "import", "--similar", str(table), *where]) == 0
    loaded = files.load_current(tmp_path, demo_feature_set.version)
    assert loaded is not None and set(loaded.tables) == {"knn", "ease", "sequence", "similar"}
    assert loaded.card["fusion"]["similar"] == 1.0
    capsys.readouterr()
    table.write_text('{"item_id": "i1"}\n')
    assert cli_main(["recall", "import", "--similar", str(table), *where]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "similar.jsonl:1" in err[0], err
    assert cli_main(["recall", "activate", "nope", *where]) == 2


def test_the_tuning_weighs_the_popularity_the_ranker_serves(demo_feature_set: FeatureSet) -> None:
    """The demo declares popularity as an item feature: the tuning ranks by it
    (from the catalog), as the ranker's popular source does, not by the log."""
    from recmesh.features.tabular import read_entities

    served = recall.served_popularity(demo_feature_set)
    assert served is not None
    ranked = served([])
    source = demo_feature_set.entity_source("item")
    assert source is not None
    values = {i: float(row["popularity"]) for i, row in read_entities(demo_feature_set, "item", source)}  # type: ignore[arg-type]
    assert len(ranked) == len(values) and values[ranked[0]] == max(values.values())
