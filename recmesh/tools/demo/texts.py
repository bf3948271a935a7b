"""Titles and descriptions for the demo catalog, so item texts can be embedded.

Texts are generated from per-category vocabularies, so what an item says
reflects its category and a sub-topic within it. They use their own seeded
random stream (not the catalog's), so the catalog, the events and the training
data are identical with or without them. Shipped as demo/data/item_texts.csv
(item_id, title, description); items.csv stays the offline-feature table.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from recmesh.tools.demo.generate import Catalog

TEXT_SEED = 1013

# category -> sub-topics; each sub-topic is (noun phrases, detail phrases).
VOCAB: dict[str, list[tuple[list[str], list[str]]]] = {
    "news": [
        (
            ["election results", "parliament vote", "city council budget"],
            ["voters", "ballots", "coalition talks"],
        ),
        (
            ["storm warning", "flood recovery", "wildfire evacuation"],
            ["emergency crews", "residents", "relief funds"],
        ),
        (["court ruling", "police inquiry", "corruption trial"], ["judges", "witnesses", "the verdict"]),
    ],
    "sports": [
        (
            ["football derby", "league title race", "transfer window"],
            ["the striker", "the coach", "a late goal"],
        ),
        (
            ["tennis final", "grand slam upset", "doubles comeback"],
            ["the serve", "a tie-break", "the baseline rally"],
        ),
        (
            ["marathon record", "cycling stage", "olympic sprint"],
            ["the finish line", "training camp", "a personal best"],
        ),
    ],
    "music": [
        (
            ["jazz quartet", "saxophone solo", "blues session"],
            ["improvisation", "the rhythm section", "a smoky club"],
        ),
        (["pop album", "chart single", "stadium tour"], ["catchy hooks", "the fans", "a music video"]),
        (
            ["symphony concert", "piano recital", "opera premiere"],
            ["the orchestra", "the conductor", "a violin concerto"],
        ),
    ],
    "movies": [
        (
            ["horror sequel", "haunted house film", "slasher remake"],
            ["jump scares", "the villain", "a dark cellar"],
        ),
        (
            ["animated feature", "family comedy", "holiday film"],
            ["talking animals", "voice actors", "a happy ending"],
        ),
        (
            ["festival drama", "documentary premiere", "director interview"],
            ["the screenplay", "the cinematography", "critics"],
        ),
    ],
    "tech": [
        (
            ["smartphone launch", "laptop review", "wireless earbuds"],
            ["battery life", "the display", "processor speed"],
        ),
        (
            ["open source release", "programming language update", "cloud outage"],
            ["developers", "the compiler", "servers"],
        ),
        (
            ["artificial intelligence model", "robotics startup", "chip factory"],
            ["neural networks", "semiconductors", "automation"],
        ),
    ],
    "food": [
        (
            ["vegetarian recipe", "pasta dinner", "weeknight curry"],
            ["fresh herbs", "garlic and olive oil", "a simmering sauce"],
        ),
        (
            ["sourdough bread", "chocolate cake", "pastry class"],
            ["the oven", "flour and butter", "a crisp crust"],
        ),
        (
            ["street food tour", "restaurant opening", "coffee roastery"],
            ["the chef", "local markets", "espresso"],
        ),
    ],
    "travel": [
        (
            ["island getaway", "beach resort", "sailing trip"],
            ["turquoise water", "the harbour", "sunset views"],
        ),
        (["mountain hike", "alpine trail", "national park"], ["the summit", "a mountain hut", "glaciers"]),
        (
            ["city break", "museum weekend", "rail journey"],
            ["old town streets", "the night train", "boutique hotels"],
        ),
    ],
    "fashion": [
        (
            ["runway show", "designer collection", "fashion week"],
            ["the models", "couture gowns", "the catwalk"],
        ),
        (
            ["streetwear drop", "sneaker release", "denim jacket"],
            ["limited editions", "the sneakers", "urban style"],
        ),
        (
            ["sustainable fabric", "vintage thrift", "wardrobe capsule"],
            ["recycled cotton", "second-hand finds", "timeless pieces"],
        ),
    ],
    "gaming": [
        (
            ["console release", "open world game", "role-playing quest"],
            ["the controller", "side quests", "boss battles"],
        ),
        (
            ["esports final", "speedrun record", "tournament bracket"],
            ["pro players", "the live stream", "a clutch play"],
        ),
        (
            ["indie puzzle game", "pixel art platformer", "retro arcade"],
            ["level design", "chiptune music", "high scores"],
        ),
    ],
    "science": [
        (
            ["mars rover", "telescope image", "comet sighting"],
            ["astronomers", "distant galaxies", "the orbit"],
        ),
        (
            ["gene therapy", "vaccine trial", "brain study"],
            ["researchers", "the laboratory", "clinical results"],
        ),
        (
            ["climate data", "ocean current", "fossil discovery"],
            ["the glacier", "carbon dioxide", "ancient species"],
        ),
    ],
    "finance": [
        (
            ["stock market rally", "interest rate decision", "inflation report"],
            ["investors", "the central bank", "bond yields"],
        ),
        (
            ["retirement savings", "household budget", "mortgage advice"],
            ["pension funds", "monthly payments", "savings accounts"],
        ),
        (
            ["startup funding round", "crypto exchange", "bank merger"],
            ["venture capital", "the shareholders", "digital tokens"],
        ),
    ],
    "kids": [
        (
            ["bedtime story", "picture book", "fairy tale"],
            ["a sleepy dragon", "the little bear", "a magic forest"],
        ),
        (
            ["science experiment for kids", "craft project", "colouring activity"],
            ["paper and glue", "baking soda volcanoes", "crayons"],
        ),
        (
            ["cartoon episode", "toy unboxing", "playground game"],
            ["the puppy", "building blocks", "best friends"],
        ),
    ],
}

_TITLE = ["{Noun}: what happened next", "Inside the {noun}", "The {noun} everyone is talking about",
          "A closer look at the {noun}", "Why the {noun} matters", "{Noun}, explained"]  # fmt: skip
_SENTENCES = [
    "This piece covers the {noun} and {detail}.",
    "It follows {detail} through the {noun} from start to finish.",
    "Readers interested in {category} will recognise {detail}.",
    "The {noun} drew attention because of {detail}.",
    "Expect plenty about {detail} and {detail2}.",
    "A short guide to the {noun2} rounds it off.",
]


def item_texts(catalog: Catalog, seed: int = TEXT_SEED) -> dict[str, tuple[str, str]]:
    """item_id -> (title, description); deterministic for a catalog and seed."""
    rng = np.random.default_rng(seed)
    out: dict[str, tuple[str, str]] = {}
    for item in catalog.items:
        topics = VOCAB[item["category"]]
        nouns, details = topics[int(rng.integers(len(topics)))]
        noun = nouns[int(rng.integers(len(nouns)))]
        title = _TITLE[int(rng.integers(len(_TITLE)))].format(noun=noun, Noun=noun[0].upper() + noun[1:])
        picks = rng.choice(len(_SENTENCES), size=int(rng.integers(2, 4)), replace=False)
        sentences = [
            _SENTENCES[int(p)].format(
                noun=noun,
                noun2=nouns[int(rng.integers(len(nouns)))],
                detail=details[int(rng.integers(len(details)))],
                detail2=details[int(rng.integers(len(details)))],
                category=item["category"],
            )
            for p in sorted(picks)
        ]
        out[item["item_id"]] = (title, " ".join(sentences))
    return out


def embedding_text(title: str, description: str) -> str:
    """The one string embedded per item."""
    return f"{title}. {description}"


def write_item_texts(directory: Path, texts: dict[str, tuple[str, str]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "item_texts.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["item_id", "title", "description"])
        for item_id, (title, description) in texts.items():
            writer.writerow([item_id, title, description])
    return path


def read_item_texts(directory: Path) -> dict[str, tuple[str, str]]:
    with (directory / "item_texts.csv").open(newline="") as fh:
        return {row["item_id"]: (row["title"], row["description"]) for row in csv.DictReader(fh)}
