"""`recmesh trace-report`: latency attribution per component from span files
(recmesh/tools/tracereport.py)."""

from __future__ import annotations

from typing import Any

from recmesh.tools.cli.common import lazy


def add_commands(sub: Any) -> None:
    tr_rep = sub.add_parser("trace-report", help="latency attribution per component from span files")
    tr_rep.add_argument("files", nargs="+", help="JSON-lines span files (RECMESH_SPANS_FILE)")
    tr_rep.add_argument("--slo-class", help="only traces of this class")
    tr_rep.add_argument("--json", action="store_true")
    tr_rep.set_defaults(func=lazy("recmesh.tools.tracereport"))
