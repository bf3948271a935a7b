"""Item texts: shipped file equals the generator, texts follow the category,
and adding them changes nothing else in the demo data."""

from __future__ import annotations

from pathlib import Path

from recmesh.features.repository import DEMO_REPOSITORY, FeatureSet
from recmesh.features.tabular import read_texts
from recmesh.tools.demo.generate import make_catalog
from recmesh.tools.demo.texts import VOCAB, embedding_text, item_texts, read_item_texts, write_item_texts

DEMO_DATA_DIR = DEMO_REPOSITORY.parent


def test_shipped_item_texts_match_generator(tmp_path: Path) -> None:
    fresh = write_item_texts(tmp_path, item_texts(make_catalog()))
    assert fresh.read_text() == (DEMO_DATA_DIR / "item_texts.csv").read_text()


def test_every_item_has_a_text_about_its_category() -> None:
    catalog = make_catalog()
    texts = read_item_texts(DEMO_DATA_DIR)
    assert set(texts) == set(catalog.item_ids)
    for item in catalog.items[:300]:
        title, description = texts[item["item_id"]]
        words = {w for nouns, details in VOCAB[item["category"]] for w in nouns + details}
        assert any(w in f"{title} {description}" for w in words), item


def test_the_repository_embeds_title_and_description(demo_feature_set: FeatureSet) -> None:
    """`[items] texts` of the demo repository reads the shipped file: one text per
    item, its title and description joined as the demo's embedding text."""
    texts = read_item_texts(DEMO_DATA_DIR)
    embedded = read_texts(demo_feature_set)
    assert embedded == {item_id: embedding_text(t, d) for item_id, (t, d) in texts.items()}


def test_texts_are_seeded_and_leave_the_catalog_alone() -> None:
    before = make_catalog()
    assert item_texts(before) == item_texts(before)
    assert item_texts(before, seed=1) != item_texts(before)
    assert make_catalog() == before
