"""The ranking pipeline as a declared graph: its spec, validation and drawing.

A graph is data (TOML): nodes, each naming its `kind` (what it does, from the
ranker's kind registry), its `resource` (where it runs: cpu, gpu, ...), its
`budget_share` (the share of the class budget it may take), whether it is
`skippable` (it has a neutral fallback, so the ladder may drop it) and from
which ladder level it is skipped (`skip_at_level`), and its `inputs`. The
ranker ships a default graph (`default_graph.toml`); RECMESH_RANKER_PIPELINE
names another file, so changing the graph needs no code change.

`validate` refuses, with a message naming the node, a graph with a duplicate
or unknown node, an input nobody produces, an input of the wrong type for the
node's kind, a cycle, or not exactly one final node; the ranker calls it at
start, so a bad graph stops start-up. Everything here is pure.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.ranker.policy import SKIP_FINE_RANKING

Resource = Literal["cpu", "gpu", "accelerator", "io"]

DEFAULT_GRAPH = Path(__file__).with_name("default_graph.toml")


class PipelineGraphError(ValueError):
    """The declared ranking graph cannot run; the message says why and where."""


class NodeSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    kind: str
    resource: Resource = "cpu"
    budget_share: float = Field(gt=0.0, le=1.0)
    skippable: bool = False
    # The lowest ladder level at which a skippable node is skipped (default: the
    # last level, skip fine ranking).
    skip_at_level: int = Field(SKIP_FINE_RANKING, ge=1, le=SKIP_FINE_RANKING)
    inputs: tuple[str, ...] = ()


class GraphSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = ""
    nodes: tuple[NodeSpec, ...] = Field(alias="node", min_length=1)


@dataclass(frozen=True)
class KindSpec:
    """What a kind of node consumes and produces, by value type name."""

    produces: str
    # Each required type must come from at least one input ...
    requires: tuple[str, ...] = ()
    # ... and every input must be of a type listed here (required ones included).
    accepts: tuple[str, ...] = ()
    many: tuple[str, ...] = ()  # types that may come from several inputs


@dataclass(frozen=True)
class Graph:
    spec: GraphSpec
    order: tuple[str, ...]  # a topological order
    output: str

    @property
    def nodes(self) -> dict[str, NodeSpec]:
        return {n.name: n for n in self.spec.nodes}

    def consumers(self, name: str) -> list[str]:
        return [n.name for n in self.spec.nodes if name in n.inputs]


def parse(text: str, source: str = "<graph>") -> GraphSpec:
    try:
        return GraphSpec.model_validate(tomllib.loads(text))
    except tomllib.TOMLDecodeError as err:
        raise PipelineGraphError(f"{source}: not valid TOML: {err}") from err
    except ValidationError as err:
        raise PipelineGraphError(f"{source}: {err}") from err


def topological_order(nodes: Iterable[NodeSpec]) -> tuple[str, ...]:
    """Kahn's algorithm, stable in declaration order; raises on a cycle."""
    spec = list(nodes)
    pending = {n.name: set(n.inputs) for n in spec}
    order: list[str] = []
    while pending:
        ready = [n.name for n in spec if n.name in pending and not pending[n.name]]
        if not ready:
            cycle = ", ".join(sorted(pending))
            raise PipelineGraphError(f"the graph has a cycle among: {cycle}")
        for name in ready:
            del pending[name]
            order.append(name)
        for deps in pending.values():
            deps.difference_update(ready)
    return tuple(order)


def validate(spec: GraphSpec, kinds: Mapping[str, KindSpec], source: str = "<graph>") -> Graph:
    names = [n.name for n in spec.nodes]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise PipelineGraphError(f"{source}: duplicate node names: {', '.join(dup)}")
    by_name = {n.name: n for n in spec.nodes}
    for node in spec.nodes:
        if node.kind not in kinds:
            raise PipelineGraphError(
                f"{source}: node '{node.name}' has unknown kind '{node.kind}' "
                f"(known: {', '.join(sorted(kinds))})"
            )
        missing = [i for i in node.inputs if i not in by_name]
        if missing:
            raise PipelineGraphError(
                f"{source}: node '{node.name}' reads {', '.join(missing)}, which no node produces"
            )
        if node.name in node.inputs:
            raise PipelineGraphError(f"{source}: node '{node.name}' reads its own output")
    order = topological_order(spec.nodes)
    for node in spec.nodes:
        kind = kinds[node.kind]
        got = [kinds[by_name[i].kind].produces for i in node.inputs]
        for want in kind.requires:
            if want not in got:
                raise PipelineGraphError(
                    f"{source}: node '{node.name}' ({node.kind}) needs an input producing '{want}'"
                )
        for i, typ in zip(node.inputs, got, strict=True):
            if typ not in kind.accepts:
                raise PipelineGraphError(
                    f"{source}: node '{node.name}' ({node.kind}) cannot take '{i}' ({typ}); "
                    f"it takes {', '.join(kind.accepts) or 'no inputs'}"
                )
            if got.count(typ) > 1 and typ not in kind.many:
                raise PipelineGraphError(f"{source}: node '{node.name}' takes more than one '{typ}' input")
    sinks = [n.name for n in spec.nodes if not any(n.name in m.inputs for m in spec.nodes)]
    if len(sinks) != 1:
        raise PipelineGraphError(
            f"{source}: the graph must end in exactly one node; these feed nothing: {', '.join(sinks)}"
        )
    return Graph(spec, order, sinks[0])


def load(path: Path | None, kinds: Mapping[str, KindSpec]) -> Graph:
    """The graph at `path` (default: the shipped one), validated."""
    target = path or DEFAULT_GRAPH
    try:
        text = target.read_text()
    except OSError as err:
        raise PipelineGraphError(f"cannot read the ranking graph {target}: {err}") from err
    return validate(parse(text, str(target)), kinds, str(target))


# --- drawing ----------------------------------------------------------------------


def levels(graph: Graph) -> list[list[str]]:
    """Nodes grouped by depth: the nodes of one group can run concurrently."""
    nodes = graph.nodes
    depth: dict[str, int] = {}
    for name in graph.order:
        depth[name] = 1 + max((depth[i] for i in nodes[name].inputs), default=-1)
    out: list[list[str]] = [[] for _ in range(max(depth.values()) + 1)]
    for name in graph.order:
        out[depth[name]].append(name)
    return out


def to_text(graph: Graph) -> str:
    nodes = graph.nodes
    lines = [f"ranking graph: {len(nodes)} nodes, output '{graph.output}'"]
    if graph.spec.description:
        lines.append(graph.spec.description)
    for depth, group in enumerate(levels(graph)):
        lines.append(f"stage {depth}" + (" (concurrent)" if len(group) > 1 else ""))
        for name in group:
            n = nodes[name]
            skip = f"skippable from L{n.skip_at_level}" if n.skippable else "required"
            src = ", ".join(n.inputs) or "-"
            lines.append(
                f"  {name:<16} {n.kind:<16} {n.resource:<4} {n.budget_share:>4.0%}  {skip:<20} <- {src}"
            )
    return "\n".join(lines)


_COLOURS = {"cpu": "lightblue", "gpu": "palegreen", "accelerator": "khaki", "io": "lightgrey"}


def to_dot(graph: Graph) -> str:
    lines = ["digraph ranking {", "  rankdir=LR;", "  node [shape=box, style=filled];"]
    for n in graph.spec.nodes:
        label = f"{n.name}\\n{n.kind}\\n{n.resource} {n.budget_share:.0%}"
        style = ', style="filled,dashed"' if n.skippable else ""
        lines.append(f'  {n.name} [label="{label}", fillcolor={_COLOURS[n.resource]}{style}];')
    for n in graph.spec.nodes:
        lines.extend(f"  {i} -> {n.name};" for i in n.inputs)
    lines.append("}")
    return "\n".join(lines)
