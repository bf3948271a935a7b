"""The `recmesh` command groups, one module each; recmesh.cli assembles them."""

from __future__ import annotations

import json
from typing import Any


def print_figures(figures: Any, as_json: bool, text: str) -> None:
    """A command's result: `text` for a person, or (--json) the figures as
    one JSON object on the last line, for scripts."""
    print(json.dumps(figures) if as_json else text)
