"""`recmesh recall`: learnt retrieval built from your event log, or your own table."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from recmesh.errors import InvalidArgument
from recmesh.tools.cli.common import print_figures


def _model_dir(args: argparse.Namespace) -> Path:
    from recmesh.settings import InferenceSettings

    return Path(args.model_dir) if args.model_dir else InferenceSettings().model_dir


def _cmd_build(args: argparse.Namespace) -> int:
    from recmesh.features.eventlog import load_log
    from recmesh.tools.cli.common import repository
    from recmesh.tools.training import recall

    feature_set = repository(args)
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else print
    events = load_log(Path(args.events), feature_set.event_schema)
    card, _ = recall.build(feature_set, events, _model_dir(args), say, args.seed,
                        {"events_file": str(Path(args.events).resolve())})  # fmt: skip
    print_figures(card, args.json, f"recall version {card['version']} is current in {_model_dir(args)}")
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from recmesh.tools.cli.common import repository
    from recmesh.tools.training import recall

    feature_set = repository(args)
    if bool(args.similar) == bool(args.item_vectors):
        raise InvalidArgument("give one of --similar FILE or --item-vectors FILE [--user-vectors FILE]")
    if args.similar:
        card = recall.import_similar(
            feature_set,
            Path(args.similar),
            _model_dir(args),
            args.weight,
            args.decay,
            args.neighbours,
            not args.no_activate,
        )
        s = card["sources"]["similar"]
        text = f"similar {s['items']:,} items, {s['entries']:,} pairs"
    else:
        users = Path(args.user_vectors) if args.user_vectors else None
        card = recall.import_vectors(
            feature_set, Path(args.item_vectors), users, _model_dir(args), args.weight, not args.no_activate
        )
        s = card["sources"]["vectors"]
        text = f"vectors: {s['items']:,} items, {s['users']:,} users, {s['dim']} dimensions"
    print_figures(card, args.json, f"recall version {card['version']}: {text} (fusion weight {args.weight})")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from recmesh.retrieval import files

    model_dir = _model_dir(args)
    current = files.current_version(model_dir)
    out: list[dict[str, Any]] = []
    for version in files.list_versions(model_dir):
        card = files.read_card(model_dir, version)
        out.append({"version": version, "current": version == current,
                    "feature_set_version": card.get("feature_set_version"),
                    "sources": sorted(card.get("sources", {})), "fusion": card.get("fusion", {}),
                    "built_at": card.get("built_at")})  # fmt: skip
    lines = [f"{'*' if v['current'] else ' '} {v['version']}  {v['feature_set_version']}  "
             f"{','.join(v['sources'])}  fusion {v['fusion']}  {v['built_at']}" for v in out]  # fmt: skip
    print_figures(out, args.json, "\n".join(lines) or f"no recall versions in {model_dir}")
    return 0


def _cmd_activate(args: argparse.Namespace) -> int:
    from recmesh.retrieval import files
    from recmesh.tools.cli.common import repository

    feature_set = repository(args)
    card = files.activate(_model_dir(args), args.version, feature_set.version)
    print(
        json.dumps(card)
        if args.json
        else f"recall version {args.version} is current (the ranker switches within 5 s)"
    )
    return 0


def add_commands(sub: Any) -> None:
    rc = sub.add_parser(
        "recall", help="learnt retrieval: build it from your event log, or import your own table"
    )
    rsub = rc.add_subparsers(dest="recall_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--repository", help="the repository file (default: RECMESH_REPOSITORY, else the demo's)"
        )
        p.add_argument("--model-dir", help="default: RECMESH_MODEL_DIR or .recmesh/models")
        p.add_argument("--json", action="store_true", help="print the result as JSON on the last line")

    b = rsub.add_parser("build", help="item-kNN and EASE tables from an event log, tuned on a split of it")
    b.add_argument("--events", required=True, help="canonical JSON-lines event log (events import --to log)")
    b.add_argument("--seed", type=int, default=0)
    common(b)
    b.set_defaults(func=_cmd_build)
    i = rsub.add_parser("import", help="your own candidates: a similar-items table ('similar' source) or "
                        "item and user vectors ('vectors' source)")  # fmt: skip
    i.add_argument("--similar", help="JSON lines {item_id, similar_id, score} or CSV/TSV with those columns")
    i.add_argument("--item-vectors", help='JSON lines {"item_id", "vector": [...]} or .npz (ids, vectors)')
    i.add_argument("--user-vectors", help='JSON lines {"user_id", "vector": [...]} or .npz; '
                   "a user without one is the mean of their history's item vectors")  # fmt: skip
    i.add_argument("--weight", type=float, default=1.0, help="its fusion weight (the learnt ones are near 1)")
    i.add_argument("--decay", type=float, default=0.8, help="seed weight per step back in the user's history")
    i.add_argument("--neighbours", type=int, default=200, help="kept per item")
    i.add_argument("--no-activate", action="store_true", help="write the version without making it current")
    common(i)
    i.set_defaults(func=_cmd_import)
    ls = rsub.add_parser("list", help="recall versions, which is current")
    common(ls)
    ls.set_defaults(func=_cmd_list)
    a = rsub.add_parser(
        "activate", help="make a recall version current (refused if built on another feature set)"
    )
    a.add_argument("version")
    common(a)
    a.set_defaults(func=_cmd_activate)
