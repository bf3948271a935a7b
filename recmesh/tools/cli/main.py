"""The `recmesh` command line. Commands that train or measure take --json and
then print their figures as one JSON object on their last line."""

from __future__ import annotations

import argparse
import os
import sys

from recmesh.errors import RecmeshError
from recmesh.tools.cli import (
    bench,
    catalog,
    demo,
    embed,
    evaluate,
    events,
    features,
    mesh,
    models,
    pipeline,
    recall,
    repository,
    trace,
    train,
)  # fmt: skip

# In `recmesh --help` order.
GROUPS = (
    mesh,
    train,
    recall,
    repository,
    catalog,
    events,
    features,
    demo,
    models,
    evaluate,
    bench,
    trace,
    pipeline,
    embed,
)
# Commands that start or prepare a mesh of their own: neither they nor the processes
# they start read the local mesh's cli.env (clienv). Its REDIS_URL would stop `up`
# and the benchmarks from starting their own Redis and point `init` (for external
# Redis and Kafka) at `up`'s; its Redis user would be refused by a benchmark's Redis.
OWN_MESH_COMMANDS = frozenset({"up", "init", "bench"})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recmesh", description=__doc__)
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="say where the mesh's settings came from (cli.env); on an error, print the traceback too "
        "(for a bug report)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from recmesh.security import TlsConfigError

    args = build_parser().parse_args(argv)
    try:
        if args.command in OWN_MESH_COMMANDS:
            os.environ["RECMESH_CLI_ENV"] = "off"  # for `up`'s embed-items, a benchmark's `recmesh` runs
        else:
            _find_the_mesh(args.verbose)
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except (RecmeshError, TlsConfigError, OSError) as err:
        # A user's mistake (a bad file, value or flag; a path that is not there;
        # a command with no cli.env to find `recmesh up` by, or a bad one): one line, exit 2.
        # A traceback only when asked, or for what is not one (a bug).
        if args.verbose or (isinstance(err, OSError) and err.filename is None):
            raise
        print(f"recmesh: {_one_line(err)}", file=sys.stderr)
        return 2


def _find_the_mesh(verbose: bool) -> None:
    """The credentials and addresses `recmesh up` wrote for the CLI, under the
    environment's own (clienv), before any command reads a setting."""
    from recmesh.tools.cli.clienv import load_cli_env

    loaded = load_cli_env()
    if verbose:
        print(f"recmesh: {loaded.describe()}", file=sys.stderr)


def _one_line(err: Exception) -> str:
    """The error as the user reads it (a repository file with several mistakes: one line each)."""
    if isinstance(err, OSError):
        return f"{err.filename}: {err.strerror or err}"
    return f"{type(err).__name__}: {err}" if isinstance(err, RecmeshError) else str(err)


if __name__ == "__main__":
    raise SystemExit(main())
