from __future__ import annotations

from pathlib import Path

import pytest

from recmesh.settings import RankerSettings
from services.ranker.graph import DEFAULT_GRAPH, PipelineGraphError, levels, parse, to_dot, to_text, validate
from services.ranker.pipeline import load_graph
from services.ranker.stages import KIND_SPECS

MINIMAL = """
[[node]]
name = "popular"
kind = "recall.popular"
budget_share = 0.2

[[node]]
name = "fuse"
kind = "fuse"
budget_share = 0.05
inputs = ["popular"]

[[node]]
name = "features"
kind = "item_features"
budget_share = 0.3
skippable = true
inputs = ["fuse"]

[[node]]
name = "score"
kind = "score"
resource = "gpu"
budget_share = 0.4
skippable = true
skip_at_level = 2
inputs = ["features"]
"""

EXTRA_SINK = '\n[[node]]\nname = "extra"\nkind = "fuse"\nbudget_share = 0.1\ninputs = ["popular"]\n'


def _check(text: str) -> None:
    validate(parse(text), KIND_SPECS)


def test_the_shipped_graph_is_valid_and_runs_recall_concurrently() -> None:
    graph = load_graph(RankerSettings())
    assert graph.output == "diversity"
    stages = levels(graph)
    assert stages[0] == ["user", "popular"]
    assert stages[1] == [
        "covisit", "category", "semantic", "knn", "ease", "sequence", "similar", "vectors", "revisit"
    ]  # fmt: skip
    assert graph.nodes["score"].resource == "gpu" and graph.nodes["score"].skippable
    assert not graph.nodes["fuse"].skippable


def test_a_minimal_graph_from_a_file_needs_no_code(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text(MINIMAL)
    graph = load_graph(RankerSettings(pipeline_graph=path))
    assert graph.order == ("popular", "fuse", "features", "score")
    assert graph.output == "score" and graph.nodes["score"].skip_at_level == 2


def test_text_and_dot_show_every_node_and_edge() -> None:
    graph = load_graph(RankerSettings())
    text = to_text(graph)
    assert "stage 1 (concurrent)" in text and "skippable from L4" in text
    assert all(name in text for name in graph.nodes)
    dot = to_dot(graph)
    assert dot.startswith("digraph ranking {") and dot.rstrip().endswith("}")
    assert "  user -> covisit;" in dot and "  score -> diversity;" in dot
    assert dot.count("->") == sum(len(n.inputs) for n in graph.nodes.values())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.replace('["features"]', '["featurez"]'), "reads featurez, which no node"),
        (lambda t: t.replace('kind = "fuse"', 'kind = "blend"'), "unknown kind 'blend'"),
        (lambda t: t.replace('inputs = ["features"]', 'inputs = ["features", "fuse"]'),
         "node 'score' \\(score\\) cannot take 'fuse' \\(candidates\\)"),
        (lambda t: t.replace('name = "fuse"', 'name = "popular"'), "duplicate node names: popular"),
        (lambda t: t.replace("budget_share = 0.4", "budget_share = 1.5"), "less than or equal to 1"),
        (lambda t: t.replace('resource = "gpu"', 'resource = "quantum"'), "resource"),
        (lambda t: t + EXTRA_SINK, "exactly one node; these feed nothing: score, extra"),
        (lambda t: t.replace("[[node]]", "[[node", 1), "not valid TOML"),
        (lambda t: t.replace('kind = "item_features"', 'kind = "item_features"\ncolour = "red"'),
         "Extra inputs are not permitted"),
    ],
)  # fmt: skip
def test_bad_graphs_are_refused_with_a_clear_message(change: object, message: str) -> None:
    assert callable(change)
    with pytest.raises(PipelineGraphError, match=message):
        _check(change(MINIMAL))


def test_a_cycle_is_refused() -> None:
    cyclic = MINIMAL.replace(
        'budget_share = 0.05\ninputs = ["popular"]', 'budget_share = 0.05\ninputs = ["popular", "again"]'
    )
    cyclic += '\n[[node]]\nname = "again"\nkind = "fuse"\nbudget_share = 0.1\ninputs = ["fuse"]\n'
    with pytest.raises(PipelineGraphError, match="cycle among: again, features, fuse, score"):
        _check(cyclic)


def test_a_kind_missing_its_required_input_is_refused() -> None:
    no_user = MINIMAL.replace('kind = "recall.popular"', 'kind = "recall.covisit"')
    with pytest.raises(PipelineGraphError, match="needs an input producing 'user'"):
        _check(no_user)


def test_the_final_node_must_produce_a_ranking(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text(MINIMAL.split('[[node]]\nname = "features"', maxsplit=1)[0])
    with pytest.raises(PipelineGraphError, match="final node 'fuse' \\(fuse\\) must produce a ranked list"):
        load_graph(RankerSettings(pipeline_graph=path))


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PipelineGraphError, match="cannot read the ranking graph"):
        load_graph(RankerSettings(pipeline_graph=tmp_path / "nope.toml"))
    assert DEFAULT_GRAPH.exists()


def test_a_recall_node_without_a_fusion_weight_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    renamed = MINIMAL.replace('name = "popular"', 'name = "trending"')
    path.write_text(renamed.replace('["popular"]', '["trending"]'))
    with pytest.raises(PipelineGraphError, match="recall node 'trending' has no positive weight"):
        load_graph(RankerSettings(pipeline_graph=path))
    weighted = RankerSettings(pipeline_graph=path, fusion_weights={"trending": 1.0})
    assert load_graph(weighted).order[0] == "trending"
