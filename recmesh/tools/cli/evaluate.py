"""`recmesh eval online`: what each model version, degradation level, SLO class and
arm earned online, from the sums attribution keeps (services/attribution)."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from recmesh.evaluation.sums import DIMENSIONS, FIGURES, SHADOW, Row, rows
from recmesh.features.repository import Evaluation, parse_duration_ms
from recmesh.tools.cli.common import repository, repository_arg

LABELS = {"ctr": "CTR@{k}", "hit": "hit@{k}", "ndcg": "NDCG@{k}", "auc": "AUC"}


def _dimensions(text: str) -> list[str]:
    wanted = [d.strip() for d in text.split(",") if d.strip()]
    unknown = sorted(set(wanted) - set(DIMENSIONS))
    if unknown:
        raise argparse.ArgumentTypeError(f"{unknown}: choose from {', '.join(DIMENSIONS)}")
    return wanted


def _window(text: str) -> int | None:
    if text == "all":
        return None
    try:
        return parse_duration_ms(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"'{text}': {err} (or 'all')") from None


async def _read(window_ms: int | None) -> tuple[dict[str, float], int | None]:
    from recmesh.redis_client import connect
    from recmesh.settings import FeatureSettings
    from services.attribution.store import read_sums

    client = connect(FeatureSettings().redis_url, 2)
    try:
        return await read_sums(client, window_ms)
    finally:
        await client.aclose()


def row_json(row: Row, k: int) -> dict[str, Any]:
    out: dict[str, Any] = dict(zip(DIMENSIONS, row.key, strict=True)) | {"answers": row.answers}
    for name in FIGURES:
        e = row.figure(name)
        out[name] = None if e is None else e.to_json()
    out["ctr_by_position"] = [row.position_ctr(p) for p in range(1, k + 1)]
    return out


def table(found: list[Row], by: list[str], k: int, positions: bool) -> str:
    if "arm" not in by and any(r.key[DIMENSIONS.index("arm")] == SHADOW for r in found):
        by = [*by, "arm"]  # a shadow's row is never merged: say which one it is
    heads = [*by, "answers", *(LABELS[f].format(k=k) for f in FIGURES)]
    lines = []
    for r in found:
        cells = [r.key[DIMENSIONS.index(d)] for d in by] + [f"{r.answers:,}"]
        for name in FIGURES:
            e = r.figure(name)
            cells.append("—" if e is None else (f"{e} (n={e.n:,})" if name == "auc" else str(e)))
        if positions:
            cells.append(" ".join(f"{r.position_ctr(p):.3f}" for p in range(1, k + 1)))
        lines.append(cells)
    if positions:
        heads.append(f"CTR at positions 1..{k}")
    widths = [max(len(str(c)) for c in col) for col in zip(heads, *lines, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*row) for row in [heads, *lines])


def header(evaluation: Evaluation, window_ms: int | None, newest: int | None) -> str:
    until = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime((newest + 1) * 60)) if newest is not None else "—"
    minutes = None if window_ms is None else max(1, window_ms // 60_000)
    span = (
        "every answer made final"
        if minutes is None
        else f"answers with as-of time in the {minutes} min to {until}"
    )
    return (
        f"online figures: {span}; an item is credited on {'/'.join(sorted(evaluation.positive)) or 'none'} "
        f"within {evaluation.window_ms // 1000} s of the answer (last touch); ± is the 95% interval; "
        "AUC is per answer, averaged (grouped AUC)"
    )


def main(args: argparse.Namespace) -> int:
    evaluation = repository(args).evaluation
    sums, newest = asyncio.run(_read(args.window))
    found = [r for r in rows(sums, args.by) if r.answers > 0]
    if args.json:
        print(json.dumps({"k": evaluation.k, "window_ms": args.window, "newest_minute": newest,
                          "rows": [row_json(r, evaluation.k) for r in found]}))  # fmt: skip
        return 0
    if not found:
        print("no answer is final yet: attribution makes one final once its window and lateness have passed "
              f"({evaluation.window_ms // 1000} s + {evaluation.lateness_ms // 1000} s) "
              "(is the attribution process running? `recmesh up` starts it)")  # fmt: skip
        return 0
    print(header(evaluation, args.window, newest))
    print(table(found, args.by, evaluation.k, args.positions))
    return 0


def add_commands(sub: Any) -> None:
    ev = sub.add_parser("eval", help="what models earn online").add_subparsers(dest="eval_cmd", required=True)
    online = ev.add_parser(
        "online",
        help="CTR@k, hit rate@k, NDCG@k and AUC with 95%% intervals, per model version, degradation level, "
        "SLO class and arm (from attribution's sums in Redis)",
    )
    online.add_argument("--window", type=_window, default=parse_duration_ms("1h"),
                        help="how much as-of time, back from the newest answer made final: 15m, 1h, 2d, "
                        "or all (default 1h)")  # fmt: skip
    every = ",".join(DIMENSIONS)
    online.add_argument("--by", type=_dimensions, default=list(DIMENSIONS),
                        help=f"dimensions to group by, comma-separated (default {every})")  # fmt: skip
    online.add_argument("--positions", action="store_true", help="add CTR by position")
    online.add_argument("--json", action="store_true", help="the figures as one JSON object")
    repository_arg(online)
    online.set_defaults(func=main)
