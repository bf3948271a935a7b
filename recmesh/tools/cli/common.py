"""What the command groups share: how a result is printed, and commands whose
module loads only when they run."""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Callable
from typing import Any


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
