"""`recmesh bench recall`: each source timed on the same look-up, the current version's too."""

from __future__ import annotations

from pathlib import Path

from recmesh.retrieval import files
from recmesh.retrieval.table import RecallTable
from recmesh.tools.bench import recall


def test_random_sources_have_the_asked_size_and_answer_the_look_up() -> None:
    t = recall.random_table(500, 20)
    m = recall.random_sequence_model(500)
    assert len(t) == len(m) == 500 and t.entries == 500 * 20
    seeds = [str(i) for i in range(20)]
    for source in (t, m):
        got = source.top(seeds, [1.0] * 20, 200, frozenset(seeds))
        assert 100 < len(got) <= 200 and not set(seeds) & {i for i, _ in got}


def test_run_times_the_current_version_beside_the_random_sources(tmp_path: Path) -> None:
    sources: dict[str, RecallTable] = {
        "knn": recall.random_table(300, 10),
        "sequence": recall.random_sequence_model(300),
    }
    files.save(tmp_path, {"feature_set_version": "fs-1"}, sources)
    f = recall.run(tmp_path, items=400, neighbours=10, lookups=3, repeat=2)
    names = [r["source"] for r in f["rows"]]
    assert names[:2] == [f"{f['version']}/knn", f"{f['version']}/sequence"] and len(names) == 4
    for r in f["rows"]:
        assert len(r["lookup_us_blocks"]) == 2 and r["lookup_us_p50"] > 0 and r["bytes"] > 0, r
    assert "sequence model" in recall.table(f)
