"""`recmesh pipeline show`: validate and print the ranker's declared ranking graph."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def _cmd_pipeline_show(args: argparse.Namespace) -> int:
    from recmesh.settings import RankerSettings
    from services.ranker.graph import PipelineGraphError, to_dot, to_text
    from services.ranker.pipeline import load_graph

    settings = RankerSettings()
    if args.file:
        settings = settings.model_copy(update={"pipeline_graph": Path(args.file)})
    try:
        graph = load_graph(settings)
    except PipelineGraphError as err:
        print(f"recmesh pipeline show: {err}", file=sys.stderr)
        return 2
    print(to_dot(graph) if args.format == "dot" else to_text(graph))
    return 0


def add_commands(sub: Any) -> None:
    pipe = sub.add_parser("pipeline", help="the ranker's declared ranking graph").add_subparsers(
        dest="pipeline_command", required=True
    )
    show = pipe.add_parser("show", help="validate and print the ranking graph (text or Graphviz dot)")
    show.add_argument("--file", help="a graph TOML (default: RECMESH_RANKER_PIPELINE or the shipped one)")
    show.add_argument("--format", choices=("text", "dot"), default="text")
    show.set_defaults(func=_cmd_pipeline_show)
