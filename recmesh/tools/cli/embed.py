"""`recmesh embed ...` commands: export the encoder, embed item texts, measure alignment."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _model_dir(args: argparse.Namespace) -> Path:
    from recmesh.settings import InferenceSettings

    return Path(args.model_dir) if args.model_dir else InferenceSettings().model_dir


def _repository_texts() -> dict[str, str]:
    """The served repository's item texts (RECMESH_REPOSITORY, else the demo's)."""
    from recmesh.features.repository import configured_feature_set
    from recmesh.features.tabular import read_texts
    from recmesh.settings import CommonSettings

    return read_texts(configured_feature_set(CommonSettings().repository))


def _cmd_export(args: argparse.Namespace) -> int:
    from recmesh.tools.embedding.export import export

    card = export(_model_dir(args))
    print(
        json.dumps(card)
        if args.json
        else f"wrote {_model_dir(args) / 'embedder'} in {card['export_seconds']} s"
    )
    return 0


def _cmd_items(args: argparse.Namespace) -> int:
    from recmesh.features.repository import configured_feature_set
    from recmesh.features.tabular import read_texts
    from recmesh.settings import CommonSettings
    from recmesh.tools.embedding.items import embed_items

    feature_set = configured_feature_set(
        Path(args.repository) if args.repository else CommonSettings().repository
    )
    texts = read_texts(feature_set, Path(args.texts) if args.texts else None)
    embed_items(_model_dir(args), texts, progress=lambda m: print(m, file=sys.stderr))
    return 0


def alignment(model_dir: Path, sessions: int, seed: int, blend: float) -> dict[str, Any]:
    import numpy as np

    from recmesh.tools.demo.generate import generate_events, make_catalog
    from recmesh.tools.embedding.alignment import alignment_report, replay_cases
    from recmesh.tools.embedding.items import embed_items
    from recmesh.vectors import load_item_vectors

    vectors = load_item_vectors(model_dir)
    if vectors is None:
        embed_items(model_dir, _repository_texts(), progress=lambda m: print(m, file=sys.stderr))
        vectors = load_item_vectors(model_dir)
        assert vectors is not None
    catalog = make_catalog()
    popularity_of = {i["item_id"]: float(i["popularity"]) for i in catalog.items}
    popularity = np.array([popularity_of.get(i, 0.0) for i in vectors.item_ids])
    index = {item_id: n for n, item_id in enumerate(vectors.item_ids)}
    events = generate_events(catalog, 1_767_225_600_000, 2 * 3_600_000, sessions, seed)
    return {"seed": seed, **alignment_report(vectors.matrix, popularity, replay_cases(events, index), blend)}


def _cmd_mrr(args: argparse.Namespace) -> int:
    figures = alignment(_model_dir(args), args.sessions, args.seed, args.blend)
    if args.json:
        print(json.dumps(figures))
        return 0
    print(
        f"next-click MRR over {figures['cases']} replayed clicks, {figures['items']} items (seed {args.seed})"
    )
    for label, key in (
        ("intent cosine (mean of last 3 viewed)", "mrr_intent_cosine"),
        (f"cosine + {args.blend} x log popularity", "mrr_cosine_plus_popularity"),
        ("popularity baseline", "mrr_popularity"),
        ("random baseline", "mrr_random"),
    ):
        print(f"  {label:<40} {figures[key]:.4f}")
    print(f"  mean cosine intent->clicked {figures['mean_cosine_intent_to_clicked']}, "
          f"intent->any item {figures['mean_cosine_intent_to_all']}")  # fmt: skip
    return 0


def add_commands(sub: Any) -> None:
    embed = sub.add_parser("embed", help="text embeddings (all-MiniLM-L6-v2, offline)").add_subparsers(
        dest="embed_command", required=True
    )
    ex = embed.add_parser("export", help="build the ONNX sentence encoder from the packaged weights")
    ex.add_argument("--model-dir", help="default: RECMESH_MODEL_DIR or .recmesh/models")
    ex.add_argument("--json", action="store_true")
    ex.set_defaults(func=_cmd_export)
    it = embed.add_parser("items", help="embed the repository's item texts into item_vectors/")
    it.add_argument("--model-dir")
    it.add_argument("--repository", help="a repository file (default: RECMESH_REPOSITORY, else the demo's)")
    it.add_argument(
        "--texts", help="a file with the item texts instead of the repository's items.texts source"
    )
    it.set_defaults(func=_cmd_items)
    mrr = embed.add_parser("mrr", help="next-click MRR of the intent vector vs popularity/random")
    mrr.add_argument("--model-dir")
    mrr.add_argument("--sessions", type=int, default=2000)
    mrr.add_argument("--seed", type=int, default=12, help="event seed (the blend weight was chosen on 11)")
    mrr.add_argument("--blend", type=float, default=0.2)
    mrr.add_argument("--json", action="store_true")
    mrr.set_defaults(func=_cmd_mrr)
