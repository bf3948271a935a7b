"""`recmesh bench ...`: benchmarks that print figures (recmesh/tools/bench/);
each loads its module only when it runs."""

from __future__ import annotations

import argparse
from typing import Any

from recmesh.tools.cli.common import lazy, positive_int, whole_numbers


def add_commands(sub: Any) -> None:
    bench = sub.add_parser("bench", help="benchmarks that print figures").add_subparsers(
        dest="bench_command", required=True
    )
    _add_features(bench)
    _add_import(bench)
    _add_windows(bench)
    _add_recall(bench)
    _add_train(bench)
    _add_inference(bench)
    _add_degrade(bench)
    _add_embed(bench)
    _add_ai_tools(bench)
    _add_coldstart(bench)
    _add_ranker(bench)
    _add_graph(bench)
    _add_e2e(bench)
    _add_tls(bench)
    _add_floor(bench)
    _add_online(bench)


def _add_online(bench: Any) -> None:
    bo = bench.add_parser(
        "online",
        help="an event log replayed as live traffic with two arms served side by side: what online "
        "evaluation says about them, and what the guard decides (recmesh/tools/bench/online.py)",
    )
    bo.add_argument("--events", required=True, help="the canonical event log (recmesh events import)")
    bo.add_argument("--repository", required=True, help="its repository file (its [evaluation] is used)")
    bo.add_argument("--model-dir", required=True, help="a model directory with a model for it (copied)")
    arm = bo.add_mutually_exclusive_group()
    arm.add_argument("--level", type=int, choices=(1, 2, 3), default=3,
                     help="the other arm: the served model at this level (default 3)")  # fmt: skip
    arm.add_argument("--candidate", metavar="shuffled|inverted|copy|offline-only|VERSION",
                     help="the other arm: the served model with shuffled weights, scoring backwards, "
                     "its copy, the offline-only baseline trained beside it, or a version in "
                     "--model-dir")  # fmt: skip
    bo.add_argument(
        "--control",
        metavar="VERSION",
        help="the version control serves (default: the model directory's current one)",
    )
    bo.add_argument("--shadow", action="store_true",
                    help="with --candidate: score control's answers with it too (never served); the "
                    "AUC is held against the shadow's, on the same answers (--share 0: nobody served "
                    "it)")  # fmt: skip
    bo.add_argument("--no-guard", dest="guard", action="store_false",
                    help="leave [evaluation.guard] alone: the split runs to the end")  # fmt: skip
    bo.add_argument(
        "--share", type=float, default=50.0, help="percent of users in the other arm (default 50)"
    )
    bo.add_argument("--live-from", type=float, default=0.5, help="the share of the log that is the past "
                    "(default 0.5)")  # fmt: skip
    bo.add_argument(
        "--visit-gap-h", type=float, default=1.0, help="hours without an event that start a visit"
    )
    bo.add_argument("--every", type=int, default=10, help="another request after this many events of a "
                    "visit (0: only at its start; default 10)")  # fmt: skip
    bo.add_argument("--count", type=int, default=10, help="items per answer (default 10)")
    bo.add_argument("--blend", type=float, help="the ranker's recall blend (0: the model's order alone; "
                    "default: the learnt recall's tuned weight)")  # fmt: skip
    bo.add_argument("--json", action="store_true")
    bo.set_defaults(func=lazy("recmesh.tools.bench.online"))


def _add_features(bench: Any) -> None:
    bf_bench = bench.add_parser("features", help="ingest throughput, look-up latency, freshness, memory")
    bf_bench.add_argument("--events", type=int, default=100_000)
    bf_bench.add_argument("--lookups", type=int, default=1000)
    bf_bench.add_argument("--items", type=int, default=200)
    bf_bench.add_argument("--concurrency", type=int, default=8)
    bf_bench.add_argument("--rate", type=int, default=5000, help="events/s while measuring freshness")
    bf_bench.add_argument("--seconds", type=float, default=8.0)
    bf_bench.add_argument(
        "--served-rate", type=float, default=1.0, help="served-feature log rate of the compared service"
    )
    bf_bench.add_argument(
        "--repeat", type=positive_int, default=1,
        help="rounds (each a fresh Redis and broker); prints each target's median and range",
    )  # fmt: skip
    bf_bench.add_argument(
        "--redis-persistence", choices=("off", "rdb", "aof", "compare"), default="off",
        help="the embedded Redis keeps nothing (off), snapshots (rdb, `recmesh up`'s default) or an "
        "append-only file (aof, fsync every second), in RECMESH_STATE_DIR; compare: all three in each round, "
        "rotating, with rdb/off and aof/off ratios",
    )  # fmt: skip
    bf_bench.add_argument("--json", action="store_true")
    bf_bench.set_defaults(func=lazy("recmesh.tools.bench.features"))


def _add_import(bench: Any) -> None:
    bim = bench.add_parser(
        "import", help="a team-sized catalog and event log: catalog load, events import, ingest; memory"
    )
    bim.add_argument("--items", type=int, default=100_000)
    bim.add_argument("--users", type=int, default=50_000)
    bim.add_argument("--events", type=int, default=1_000_000)
    bim.add_argument(
        "--windows", choices=("tiled", "exact"), default="tiled",
        help="tiled: 30 s tiles for the 5 and 10 minute windows, 1 minute ones for the hour ones, event ids "
        "kept a minute; exact: every event kept as long as its window (the state before tiles)",
    )  # fmt: skip
    bim.add_argument(
        "--consumers", type=int, default=1,
        help="ingest consumers in one group (more than 1: separate processes, timed from the first batch "
        "applied)",
    )  # fmt: skip
    bim.add_argument("--json", action="store_true")
    bim.set_defaults(func=lazy("recmesh.tools.bench.importing"))


def _add_windows(bench: Any) -> None:
    bw = bench.add_parser(
        "windows", help="a hot item's state and look-up against a cold one's, windows tiled and exact"
    )
    bw.add_argument(
        "--hot-events", type=int, default=100_000, help="events of a hot item in its 7-day window"
    )
    bw.add_argument("--items", type=int, default=200, help="items per look-up (tiled)")
    bw.add_argument("--exact-items", type=int, default=20, help="items per look-up, windows exact")
    bw.add_argument("--lookups", type=int, default=200, help="look-ups per kind (blocks of 10, alternated)")
    bw.add_argument("--json", action="store_true")
    bw.set_defaults(func=lazy("recmesh.tools.bench.windows"))


def _add_recall(bench: Any) -> None:
    br = bench.add_parser("recall", help="a learnt recall source's look-up time and memory")
    br.add_argument("--model-dir", help="time the current recall version's sources too (default: none)")
    br.add_argument("--items", type=positive_int, default=100_000, help="items of the random sources")
    br.add_argument("--neighbours", type=positive_int, default=200, help="entries a row of the random table")
    br.add_argument("--lookups", type=positive_int, default=100, help="look-ups per block")
    br.add_argument("--repeat", type=positive_int, default=5, help="blocks per source, alternated")
    br.add_argument("--json", action="store_true")
    br.set_defaults(func=lazy("recmesh.tools.bench.recall"))


def _add_train(bench: Any) -> None:
    bt = bench.add_parser("train", help="recmesh train's time per event and peak memory as the log grows")
    bt.add_argument("--sizes", type=whole_numbers, default=[250_000, 1_000_000],
                    help="generated shop logs of about these many purchases (comma-separated)")  # fmt: skip
    bt.add_argument("--movielens", help="MovieLens-100k's canonical log too (make movielens)")
    bt.add_argument("--epochs", type=positive_int, default=4, help="passes over the training rows")
    bt.add_argument("--engines", type=_engines, default=["single"], metavar="single,dask:1,dask:2",
                    help="train each log once per engine (dask:N: a local cluster of N workers); "
                    "their rows' digests are compared")  # fmt: skip
    bt.add_argument("--jobs", type=whole_numbers, default=[1], metavar="1,2",
                    help="train each log once per value of recmesh train --jobs (2: learnt retrieval "
                    "built in a process beside the training)")  # fmt: skip
    bt.add_argument("--repeat", type=positive_int, default=1,
                    help="rounds of every configuration, alternated")  # fmt: skip
    bt.add_argument("--log-dir", help="keep the generated logs here, and reuse those already there; "
                    "each run's progress lines are kept beside its log")  # fmt: skip
    bt.add_argument("--shoppers", type=positive_int,
                    help="this many shoppers in every log, over as many days as its purchases need "
                    "(default: one per 30 purchases, over 180 days): memory by events, users held "
                    "the same")  # fmt: skip
    bt.add_argument("--json", action="store_true")
    bt.set_defaults(func=lazy("recmesh.tools.bench.train"))


def _engines(text: str) -> list[str]:
    from recmesh.tools.bench.train import engine_args

    engines = [e.strip() for e in text.split(",") if e.strip()]
    try:
        for engine in engines:
            engine_args(engine)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return engines or ["single"]


def _add_inference(bench: Any) -> None:
    bi = bench.add_parser("inference", help="dynamic batching on vs off at the same load; cold start")
    bi.add_argument("--model-dir", help="default: RECMESH_MODEL_DIR, or a small model trained for the run")
    bi.add_argument("--rows", type=int, default=1, help="rows per request")
    bi.add_argument("--concurrency", type=int, default=64)
    bi.add_argument("--seconds", type=float, default=5.0, help="seconds per configuration per round")
    bi.add_argument(
        "--repeat",
        type=positive_int,
        default=1,
        help="rounds, alternating the order of the configurations; prints medians and ranges",
    )
    bi.add_argument(
        "--max-delay-us", type=whole_numbers,
        help="batching on at each of these waits (e.g. 0,500; default: the service's "
        "RECMESH_BATCH_MAX_DELAY_US)",
    )  # fmt: skip
    bi.add_argument("--json", action="store_true")
    bi.set_defaults(func=lazy("recmesh.tools.bench.inference"))


def _add_degrade(bench: Any) -> None:
    bd = bench.add_parser(
        "degrade", help="degradation variants: AUC change, p99 scoring latency, memory saved"
    )
    bd.add_argument("--model-dir", help="default: RECMESH_MODEL_DIR, else a model trained for the run")
    bd.add_argument("--rows", type=int, default=200, help="rows per request")
    bd.add_argument("--repeats", type=int, default=500, help="requests per level")
    bd.add_argument("--json", action="store_true")
    bd.set_defaults(func=lazy("recmesh.tools.bench.degrade"))


def _add_embed(bench: Any) -> None:
    be = bench.add_parser("embed", help="CPU sentence-embedding throughput, batch 1 vs batch N")
    be.add_argument("--model-dir", help="with an exported encoder (default: export to a temp dir)")
    be.add_argument("--batch", type=int, default=32)
    be.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    be.add_argument("--seconds", type=float, default=5.0)
    be.add_argument("--json", action="store_true")
    be.set_defaults(func=lazy("recmesh.tools.bench.embed"))


def _add_ai_tools(bench: Any) -> None:
    ba = bench.add_parser(
        "ai-tools", help="per-call latency of /v2/ai-tool/* vs /v1/recommend (running mesh)"
    )
    ba.add_argument(
        "--url", default="http://127.0.0.1:8000", help="gateway URL (default http://127.0.0.1:8000)"
    )
    ba.add_argument("--n", type=int, default=100)
    ba.add_argument("--json", action="store_true")
    ba.set_defaults(func=lazy("recmesh.tools.bench.aitools"))


def _add_coldstart(bench: Any) -> None:
    bc = bench.add_parser(
        "coldstart", help="process start -> SERVING per service and model size; first request"
    )
    bc.add_argument("--json", action="store_true")
    bc.set_defaults(func=lazy("recmesh.tools.bench.coldstart"))


def _add_ranker(bench: Any) -> None:
    br = bench.add_parser("ranker", help="Rank latency p50/p95/p99 against a running ranker")
    br.add_argument("--addr", help="ranker address (default: RANKER_ADDR)")
    br.add_argument("--calls", type=int, default=300, help="Rank calls measured (default 300)")
    br.add_argument("--warmup", type=int, default=30, help="calls first, not measured (default 30)")
    br.add_argument("--slo-class", default="A", choices=("A", "B", "C"))
    br.add_argument("--count", type=int, default=10)
    br.add_argument("--users", type=int, default=2000, help="users <prefix>0..<prefix>(N-1)")
    br.add_argument(
        "--user-prefix", default="u", help="the users' id prefix (default u, the demo's; '' for ids 0..N-1)"
    )
    br.add_argument("--json", action="store_true")
    br.set_defaults(func=lazy("recmesh.tools.bench.ranker"))


def _add_graph(bench: Any) -> None:
    bg = bench.add_parser(
        "graph", help="the ranker's own Python per Rank: its graph over a running mesh's recorded answers"
    )
    bg.add_argument("--sample", type=positive_int, default=100, help="users whose answers are recorded")
    bg.add_argument("--users", type=positive_int, default=2000, help="users <prefix>0..<prefix>(N-1)")
    bg.add_argument(
        "--user-prefix", default="u", help="the users' id prefix (default u, the demo's; '' for ids 0..N-1)"
    )
    bg.add_argument("--passes", type=positive_int, default=10, help="passes over the sample per repeat")
    bg.add_argument("--repeat", type=positive_int, default=5, help="repeats (median and range printed)")
    bg.add_argument("--json", action="store_true")
    bg.set_defaults(func=lazy("recmesh.tools.bench.graph"))


def _add_e2e(bench: Any) -> None:
    be = bench.add_parser("e2e", help="recommend latency, goodput and shed per class as offered load rises")
    be.add_argument("--gateway", help="URL of a running gateway (default: start a mesh like `recmesh up`)")
    be.add_argument(
        "--rates", default="100,200,400,600,800,1200",
        help="offered requests/s, one step each (default %(default)s); every sweep first runs an "
        "unreported 2 s warm-up at 50/s and a 20/s class-A step (the unloaded figures)",
    )  # fmt: skip
    be.add_argument("--seconds", type=float, default=8.0, help="seconds per step (default 8)")
    be.add_argument(
        "--mix", default="A:0.3,B:0.2,C:0.5", help="CLASS:SHARE,... of the requests (default %(default)s)"
    )
    be.add_argument("--api-key", default="demo-interactive", help="x-api-key sent with class A requests")
    be.add_argument("--up-pid", type=int, help="with --gateway: pid of its `recmesh up`, for CPU per process")
    be.add_argument("--plot", default=".recmesh/bench-e2e.png", help="PNG of latency and goodput vs load")
    be.add_argument(
        "--no-baseline", dest="baseline", action="store_false",
        help="skip the floor (`recmesh bench floor`) run after the sweep for mesh/floor ratios",
    )  # fmt: skip
    be.add_argument(
        "--repeat", type=positive_int, default=1,
        help="rounds of the mesh's and the floor's sweeps, in alternating order; prints each ratio's median "
        "and range",
    )  # fmt: skip
    be.add_argument(
        "--against", metavar="VAR=VALUE[,VAR=VALUE]",
        help="also start a second mesh with these variables set (e.g. RECMESH_RANKER_ITEM_BLOCK=false), "
        "sweep it in every round in alternating order, and print the CPU per answer of each process of "
        "both and their ratio (median and range over the rounds)",
    )  # fmt: skip
    be.add_argument(
        "--against-tree", metavar="DIR",
        help="the second mesh runs the code of this recmesh checkout (e.g. `git worktree add DIR REV`) with "
        "this environment's packages: the same table, before against after",
    )  # fmt: skip
    be.add_argument("--profile", metavar="DIR", help="py-spy the mesh's services during the sweeps: "
                    "DIR/SERVICE.folded and their top frames (py-spy: a dev dependency)")  # fmt: skip
    be.add_argument("--json", action="store_true")
    be.set_defaults(func=lazy("recmesh.tools.bench.e2e"))


def _add_tls(bench: Any) -> None:
    bt = bench.add_parser(
        "tls", help="mutual TLS on vs off, same run: unloaded p50 and CPU per recommendation"
    )
    bt.add_argument(
        "--rates", default="100", help="offered requests/s after the 20/s class-A step (default 100)"
    )
    bt.add_argument("--seconds", type=float, default=10.0, help="seconds per step (default 10)")
    bt.add_argument("--rounds", type=int, default=2, help="meshes per mode, alternated on/off (default 2)")
    bt.add_argument("--mix", default="A:0.3,B:0.2,C:0.5", help="CLASS:SHARE,... (default %(default)s)")
    bt.add_argument("--api-key", default="demo-interactive", help="x-api-key sent with class A requests")
    bt.add_argument("--json", action="store_true")
    bt.set_defaults(func=lazy("recmesh.tools.bench.tls"))


def _add_floor(bench: Any) -> None:
    bf = bench.add_parser("floor", help="the mesh's calls with no work in them: a ceiling for this machine")
    bf.add_argument(
        "--rates", default="200,400,800,1200",
        help="offered requests/s, one step each (default %(default)s), after a warm-up and a 20/s step",
    )  # fmt: skip
    bf.add_argument("--seconds", type=float, default=5.0, help="seconds per step (default 5)")
    bf.add_argument("--json", action="store_true")
    bf.set_defaults(func=lazy("recmesh.tools.bench.floor"))
