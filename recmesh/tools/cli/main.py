"""The `recmesh` command line. Commands that train or measure take --json and
then print their figures as one JSON object on their last line."""

from __future__ import annotations

import argparse
import sys

from recmesh.errors import RecmeshError
from recmesh.tools.cli import bench, data, embed, mesh, models, pipeline, recall, trace, train

# In `recmesh --help` order.
GROUPS = (mesh, train, recall, data, models, bench, trace, pipeline, embed)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recmesh", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from recmesh.security import TlsConfigError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except RecmeshError as err:
        print(f"recmesh: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    except TlsConfigError as err:  # e.g. a command against `recmesh up` without its cli.env
        print(f"recmesh: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
