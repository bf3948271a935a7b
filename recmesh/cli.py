"""The `recmesh` command line. Commands that train or measure take --json and
then print their figures as one JSON object on their last line."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recmesh.commands import print_figures
from recmesh.errors import InvalidArgument, RecmeshError


def _cmd_up(args: argparse.Namespace) -> int:
    from recmesh.settings import UpSettings
    from recmesh.up import run

    return asyncio.run(run(UpSettings(), args.demo_events))


def _ranking_dir() -> Path:
    from recmesh.settings import UpSettings

    return UpSettings().state_dir / "ranking"


def _cmd_train(args: argparse.Namespace) -> int:
    from recmesh.commands.data import catalog_tables, repository
    from recmesh.settings import InferenceSettings
    from recmesh.training.train import TrainConfig, build_dataset, train

    fs = repository(args)
    model_dir = Path(args.model_dir) if args.model_dir else InferenceSettings().model_dir
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else print
    cfg = TrainConfig(seed=args.seed, sessions=args.sessions, epochs=args.epochs)
    dataset = None
    split = None
    if args.ranking and not args.events:
        raise InvalidArgument(
            "--ranking needs the event log (--events LOG) to hold users' last examples out of"
        )
    if args.events:
        from recmesh.features.eventlog import sorted_events

        users, items = catalog_tables(fs, args.users, args.items)
        say(f"replaying {args.events} through repository {fs.name!r} ({fs.version}) for training rows ...")
        events = sorted_events(Path(args.events), fs.event_schema)
        if args.ranking:
            from recmesh.features.backfill import LabelRule
            from recmesh.training.ranking import leave_last_out

            split = leave_last_out(LabelRule.of(fs), list(events), args.ranking_users, args.seed)
            say(
                f"leave-last-out: {len(split.targets)} users' last positive examples held out "
                f"({split.held_out_events} events; {split.users_with_a_positive} users have one)"
            )
            events = iter(split.training)
            model_dir = _ranking_dir() / "models"
        dataset = build_dataset(fs, events, users, items)
        dataset.source = {
            "events": str(Path(args.events).resolve()),
            "users": args.users,
            "items": args.items,
            **({"held_out": {"users": len(split.targets), "events": split.held_out_events,
                             "seed": args.seed}} if split else {}),
        }  # fmt: skip
    elif not fs.demo:
        raise InvalidArgument(f"repository {fs.name!r}: give your event log with --events LOG")
    card = train(cfg, model_dir, fs, dataset, progress=say)
    figures = {
        "version": card["version"],
        **card["metrics"],
        "rows": card["training_data"]["rows"],
        "train_seconds": card["train_seconds"],
    }
    if split is not None:
        from recmesh.bench import ranking

        say(
            f"ranking the held-out examples with the served mesh (model {card['version']} in {model_dir}) ..."
        )
        figures["ranking"] = ranking.run(fs, split, model_dir, _ranking_dir() / "mesh", args.k, say)
        say(ranking.table(figures["ranking"]))
        say(f"(the model in {model_dir} never saw the held-out examples; train without --ranking "
            "for the model to serve)")  # fmt: skip
    print_figures(figures, args.json, f"model {card['version']}: AUC {figures['auc_holdout']} "
                  f"(offline-only {figures['auc_holdout_offline_only']})")  # fmt: skip
    return 0


def _cmd_init(args: argparse.Namespace) -> int:
    """Topics and the catalog for a mesh whose Redis and Kafka run elsewhere."""
    from recmesh.commands.data import _refuse_demo, load_catalog_files, repository
    from recmesh.embedded import ensure_topics
    from recmesh.settings import UpSettings
    from recmesh.up import Mesh

    settings = UpSettings()
    if settings.redis_url is None or settings.kafka_bootstrap is None:
        print("recmesh init: set REDIS_URL and KAFKA_BOOTSTRAP", file=sys.stderr)
        return 2
    fs = repository(args)
    _refuse_demo(fs, args, "recmesh init")
    mesh = Mesh(settings)

    async def init() -> dict[str, Any]:
        await ensure_topics(mesh.kafka, mesh.topics(), timeout_s=args.wait)
        return await load_catalog_files(fs, mesh.redis_url, None, None, print)

    figures = asyncio.run(init())
    print(f"topics created; catalog of repository {fs.name!r} loaded: {figures['users']} users, "
          f"{figures['items']} items")  # fmt: skip
    return 0


def _cmd_health(args: argparse.Namespace) -> int:
    """Exit 0 when the target is ready: gRPC health SERVING, or HTTP 200."""
    if args.http:
        import httpx

        try:
            status = httpx.get(args.http, timeout=args.timeout).status_code
        except httpx.HTTPError as err:
            print(f"recmesh health: {args.http} unreachable: {err!r}", file=sys.stderr)
            return 1
        if status != 200:
            print(f"recmesh health: {args.http} answered {status}", file=sys.stderr)
        return 0 if status == 200 else 1
    from recmesh.clients import GrpcClient

    async def check() -> bool:
        client = GrpcClient(args.grpc, "health")
        try:
            return await client.health(args.timeout)
        finally:
            await client.close()

    if asyncio.run(check()):
        return 0
    print(f"recmesh health: {args.grpc} is not SERVING (or not reachable)", file=sys.stderr)
    return 1


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


def _lazy(module: str) -> Callable[[argparse.Namespace], int]:
    """A command whose module (and its heavy imports) loads only when it runs."""

    def run(args: argparse.Namespace) -> int:
        main: Callable[[argparse.Namespace], int] = importlib.import_module(module).main
        return main(args)

    return run


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (else a usage error naming the value)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recmesh", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start the whole mesh on this machine")
    up.add_argument("--demo-events", type=int, default=3000, help="demo events to send once ready (0: none)")
    up.set_defaults(func=_cmd_up)

    tr = sub.add_parser(
        "train", help="train the model family on your event log (or the demo's) and export ONNX + model card"
    )
    tr.add_argument("--events", help="canonical JSON-lines event log (events import --to log); "
                    "without it, the demo repository trains on generated demo sessions")  # fmt: skip
    tr.add_argument("--users", help="users file (default: the repository's users.source)")
    tr.add_argument("--items", help="items file (default: the repository's items.source)")
    tr.add_argument("--repository", help="the repository file (default: RECMESH_REPOSITORY, else the demo's)")
    tr.add_argument("--model-dir", help="default: RECMESH_MODEL_DIR or .recmesh/models")
    tr.add_argument("--seed", type=int, default=42)
    tr.add_argument("--sessions", type=int, default=6000, help="demo sessions (without --events)")
    tr.add_argument("--epochs", type=int, default=4, help="passes over the training rows")
    tr.add_argument(
        "--ranking",
        action="store_true",
        help="also measure ranking quality: hold each user's last positive example out, train on "
        "the rest (into <state>/ranking/models, not the served model dir), replay it into a mesh "
        "and report HR@k and NDCG@k of the served ranking, recall alone and popularity",
    )
    tr.add_argument(
        "--ranking-users",
        type=int,
        help="with --ranking: hold out this many users (seeded draw; "
        "default every user with a positive example)",
    )
    tr.add_argument("--k", type=int, default=10, help="with --ranking: the cut-off of HR@k and NDCG@k")
    tr.add_argument("--json", action="store_true", help="print figures as JSON on the last line")
    tr.set_defaults(func=_cmd_train)

    from recmesh.commands.data import add_commands as add_data_commands
    from recmesh.commands.models import add_commands as add_model_commands

    add_data_commands(sub)
    add_model_commands(sub)

    init = sub.add_parser("init", help="create topics and load the catalog (external Redis/Kafka)")
    init.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the broker")
    init.add_argument("--repository", help="the repository file (default: RECMESH_REPOSITORY)")
    init.add_argument("--demo", action="store_true", help="allow loading the demo repository's catalog")
    init.set_defaults(func=_cmd_init)

    health = sub.add_parser("health", help="probe a service: exit 0 when ready")
    target = health.add_mutually_exclusive_group(required=True)
    target.add_argument("--grpc", help="host:port of a gRPC service (grpc.health.v1)")
    target.add_argument("--http", help="URL that must answer 200, e.g. the gateway's /readyz")
    health.add_argument("--timeout", type=float, default=2.0)
    health.set_defaults(func=_cmd_health)

    bench = sub.add_parser("bench", help="benchmarks that print figures").add_subparsers(
        dest="bench_command", required=True
    )
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
    bf_bench.add_argument("--json", action="store_true")
    bf_bench.set_defaults(func=_lazy("recmesh.bench.features"))

    bim = bench.add_parser(
        "import", help="a team-sized catalog and event log: catalog load, events import, ingest; memory"
    )
    bim.add_argument("--items", type=int, default=100_000)
    bim.add_argument("--users", type=int, default=50_000)
    bim.add_argument("--events", type=int, default=1_000_000)
    bim.add_argument("--json", action="store_true")
    bim.set_defaults(func=_lazy("recmesh.bench.importing"))

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
    bi.add_argument("--max-delay-us", help="batching on at each of these waits (e.g. 0,500; default: the "
                    "service's RECMESH_BATCH_MAX_DELAY_US)")  # fmt: skip
    bi.add_argument("--json", action="store_true")
    bi.set_defaults(func=_lazy("recmesh.bench.inference"))

    bd = bench.add_parser(
        "degrade", help="degradation variants: AUC change, p99 scoring latency, memory saved"
    )
    bd.add_argument("--model-dir", help="default: RECMESH_MODEL_DIR, else a model trained for the run")
    bd.add_argument("--rows", type=int, default=200, help="rows per request")
    bd.add_argument("--repeats", type=int, default=500, help="requests per level")
    bd.add_argument("--json", action="store_true")
    bd.set_defaults(func=_lazy("recmesh.bench.degrade"))

    be = bench.add_parser("embed", help="CPU sentence-embedding throughput, batch 1 vs batch N")
    be.add_argument("--model-dir", help="with an exported encoder (default: export to a temp dir)")
    be.add_argument("--batch", type=int, default=32)
    be.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    be.add_argument("--seconds", type=float, default=5.0)
    be.add_argument("--json", action="store_true")
    be.set_defaults(func=_lazy("recmesh.bench.embed"))

    ba = bench.add_parser(
        "ai-tools", help="per-call latency of /v2/ai-tool/* vs /v1/recommend (running mesh)"
    )
    ba.add_argument(
        "--url", default="http://127.0.0.1:8000", help="gateway URL (default http://127.0.0.1:8000)"
    )
    ba.add_argument("--n", type=int, default=100)
    ba.add_argument("--json", action="store_true")
    ba.set_defaults(func=_lazy("recmesh.bench.aitools"))

    bc = bench.add_parser(
        "coldstart", help="process start -> SERVING per service and model size; first request"
    )
    bc.add_argument("--json", action="store_true")
    bc.set_defaults(func=_lazy("recmesh.bench.coldstart"))

    br = bench.add_parser("ranker", help="Rank latency p50/p95/p99 against a running ranker")
    br.add_argument("--addr", help="ranker address (default: RANKER_ADDR)")
    br.add_argument("--calls", type=int, default=300, help="Rank calls measured (default 300)")
    br.add_argument("--warmup", type=int, default=30, help="calls first, not measured (default 30)")
    br.add_argument("--slo-class", default="A", choices=("A", "B", "C"))
    br.add_argument("--count", type=int, default=10)
    br.add_argument("--users", type=int, default=2000, help="demo users u0..u(N-1)")
    br.add_argument("--json", action="store_true")
    br.set_defaults(func=_lazy("recmesh.bench.ranker"))

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
    be.add_argument("--profile", metavar="DIR", help="py-spy the mesh's services during the sweeps: "
                    "DIR/SERVICE.folded and their top frames (py-spy: a dev dependency)")  # fmt: skip
    be.add_argument("--json", action="store_true")
    be.set_defaults(func=_lazy("recmesh.bench.e2e"))

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
    bt.set_defaults(func=_lazy("recmesh.bench.tls"))

    bf = bench.add_parser("floor", help="the mesh's calls with no work in them: a ceiling for this machine")
    bf.add_argument(
        "--rates", default="200,400,800,1200",
        help="offered requests/s, one step each (default %(default)s), after a warm-up and a 20/s step",
    )  # fmt: skip
    bf.add_argument("--seconds", type=float, default=5.0, help="seconds per step (default 5)")
    bf.add_argument("--json", action="store_true")
    bf.set_defaults(func=_lazy("recmesh.bench.floor"))

    tr_rep = sub.add_parser("trace-report", help="latency attribution per component from span files")
    tr_rep.add_argument("files", nargs="+", help="JSON-lines span files (RECMESH_SPANS_FILE)")
    tr_rep.add_argument("--slo-class", help="only traces of this class")
    tr_rep.add_argument("--json", action="store_true")
    tr_rep.set_defaults(func=_lazy("recmesh.tracereport"))

    pipe = sub.add_parser("pipeline", help="the ranker's declared ranking graph").add_subparsers(
        dest="pipeline_command", required=True
    )
    show = pipe.add_parser("show", help="validate and print the ranking graph (text or Graphviz dot)")
    show.add_argument("--file", help="a graph TOML (default: RECMESH_RANKER_PIPELINE or the shipped one)")
    show.add_argument("--format", choices=("text", "dot"), default="text")
    show.set_defaults(func=_cmd_pipeline_show)

    from recmesh.embedding.cli import add_commands as add_embed_commands

    add_embed_commands(sub)

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
