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
    parser.add_argument(
        "--verbose", action="store_true", help="on an error, print the traceback too (for a bug report)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from recmesh.security import TlsConfigError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except (RecmeshError, TlsConfigError, OSError) as err:
        # A user's mistake (a bad file, value or flag; a path that is not there;
        # a command against `recmesh up` without its cli.env): one line, exit 2.
        # A traceback only when asked, or for what is not one (a bug).
        if args.verbose or (isinstance(err, OSError) and err.filename is None):
            raise
        print(f"recmesh: {_one_line(err)}", file=sys.stderr)
        return 2


def _one_line(err: Exception) -> str:
    """The error as the user reads it (a repository file with several mistakes: one line each)."""
    if isinstance(err, OSError):
        return f"{err.filename}: {err.strerror or err}"
    return f"{type(err).__name__}: {err}" if isinstance(err, RecmeshError) else str(err)


if __name__ == "__main__":
    raise SystemExit(main())
