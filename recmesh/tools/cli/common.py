"""What the command groups share: the repository a command serves, how a result
and progress are printed, and commands whose module loads only when they run."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recmesh.errors import FailedPrecondition
from recmesh.features.repository import FeatureSet


def print_figures(figures: Any, as_json: bool, text: str) -> None:
    """A command's result: `text` for a person, or (--json) the figures as
    one JSON object on the last line, for scripts."""
    print(json.dumps(figures) if as_json else text)


def lazy(module: str) -> Callable[[argparse.Namespace], int]:
    """A command whose module (and its heavy imports) loads only when it runs."""

    def run(args: argparse.Namespace) -> int:
        main: Callable[[argparse.Namespace], int] = importlib.import_module(module).main
        return main(args)

    return run


def whole_numbers(text: str) -> list[int]:
    """An argparse type: comma-separated whole numbers >= 0, e.g. `0,500`."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of whole numbers") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"'{text}': every value must be >= 0")
    return values


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (else a usage error naming the value)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def say_for(args: argparse.Namespace) -> Callable[[str], None]:
    """Progress to stderr when the figures go to stdout as JSON."""
    if getattr(args, "json", False):
        return lambda m: print(m, file=sys.stderr, flush=True)
    return lambda m: print(m, flush=True)


def repository(args: argparse.Namespace) -> FeatureSet:
    from recmesh.features.repository import configured_feature_set, load_feature_set
    from recmesh.settings import CommonSettings

    if getattr(args, "repository", None):
        return load_feature_set(Path(args.repository))
    return configured_feature_set(CommonSettings().repository)


def refuse_demo(feature_set: FeatureSet, args: argparse.Namespace, what: str) -> None:
    if feature_set.demo and not args.demo:
        raise FailedPrecondition(
            f"{feature_set.path} is the demo repository: {what} loads the demo catalog only with --demo "
            "(set RECMESH_REPOSITORY to your recmesh.toml to load yours)"
        )


def repository_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repository", help="the repository file (default: RECMESH_REPOSITORY, else the demo's)")
