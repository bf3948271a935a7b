"""REST routes of the AI-tool endpoints (/v2/ai-tool/*), class B by default:
each call is checked, admitted by the edge (edge.py) through the AI-tool
gate, and run by `AiTools` (ai_tool_calls.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict, JsonValue

from recmesh.aitools.actions import CONSTRAINTS
from recmesh.jsontypes import JsonInt
from recmesh.metadata import SLO_HEADER
from services.gateway import openapi
from services.gateway.ai_tool_calls import AiTools
from services.gateway.edge import REFUSED, Admitted, Edge

Call = TypeVar("Call")
Out = TypeVar("Out")


class SummarizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(
        min_length=1,
        description="the text to summarize: at least one sentence with a letter or digit",
        # What the server checks (a sentence needs an alphanumeric character), documented.
        json_schema_extra={"pattern": r"[^\W_]"},
    )
    max_sentences: JsonInt = Field(3, ge=1, le=20)


class SummarizeOut(BaseModel):
    summary: str
    backend: str
    model: str
    sentences: list[int] = Field(description="indexes of the chosen sentences (extractive backends)")
    tokens_used: int
    slo_class: str
    trace_id: str
    degraded: list[str]


# What check_request (recmesh/aitools/actions.py) asks of output_schema, documented.
_AN_OBJECT_SCHEMA: JsonDict = {"properties": {"type": {"const": "object"}}, "required": ["type"]}
_CONSTRAINT_NAMES: list[JsonValue] = [*sorted(CONSTRAINTS)]


class ActionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    intent: str = Field(min_length=1, max_length=200, examples=["drive_trial_conversion"])
    constraints: list[str] = Field(
        default_factory=list,
        examples=[["must_include_cta", "avoid_price_mention"]],
        json_schema_extra={"items": {"type": "string", "enum": _CONSTRAINT_NAMES}},
    )
    output_schema: dict[str, Any] = Field(
        description="JSON Schema (draft 2020-12) of an object: the output validates against it",
        json_schema_extra=_AN_OBJECT_SCHEMA,
    )
    context: dict[str, Any] = Field(default_factory=dict)


class ActionOut(BaseModel):
    output: dict[str, Any]
    backend: str
    model: str
    checks: list[str] = Field(description="what the server verified on `output` before answering")
    attempts: int = Field(description="LLM attempts made (0 without a generative model)")
    tokens_used: int
    slo_class: str
    trace_id: str
    degraded: list[str]


async def _serve(
    request: Request,
    response: Response,
    edge: Edge,
    check: Callable[[], Call],
    run: Callable[[Call, Admitted], Awaitable[Out]],
) -> tuple[Out, list[str]]:
    """One tool call at the edge: the caller's class, the call's checks (a 400
    before admission), the call run admitted, the granted class in the
    `x-slo-class` header. The class is stamped on the request first as
    "invalid", so a refused header is still labelled in the latency metric.
    Returns the tool's answer and the class notes for its `degraded`."""
    request.state.slo_class = REFUSED
    caller = edge.http_caller(request.headers)
    request.state.slo_class = caller.slo.name
    call = check()
    async with edge.admit(caller) as admitted:
        out = await run(call, admitted)
    response.headers[SLO_HEADER] = caller.slo.name
    return out, caller.notes


def build_router(tools: AiTools, edge: Edge) -> APIRouter:
    async def summarize(body: SummarizeBody, request: Request, response: Response) -> SummarizeOut:
        """A summary of `text`: generated (vLLM) or the most central sentences."""
        call = partial(tools.summary_request, body.text, body.max_sentences)
        out, notes = await _serve(request, response, edge, call, tools.summarize)
        return SummarizeOut(
            summary=out.summary, backend=out.backend, model=out.model, sentences=out.sentences,
            tokens_used=out.tokens_used, slo_class=out.slo_class, trace_id=out.trace_id,
            degraded=[*notes, *out.degraded],
        )  # fmt: skip

    async def action(body: ActionBody, request: Request, response: Response) -> ActionOut:
        """A structured action: `output` validates against `output_schema` and meets the constraints."""
        call = partial(tools.action_request, body.intent, body.constraints, body.output_schema, body.context)
        out, notes = await _serve(request, response, edge, call, tools.action)
        return ActionOut(
            output=out.output, backend=out.backend, model=out.model, checks=out.checks, attempts=out.attempts,
            tokens_used=out.tokens_used, slo_class=out.slo_class, trace_id=out.trace_id,
            degraded=[*notes, *out.degraded],
        )  # fmt: skip

    router = APIRouter(prefix="/v2/ai-tool", tags=["ai-tool"])
    for path, handler, answer in (("/summarize", summarize, SummarizeOut), ("/action", action, ActionOut)):
        router.add_api_route(
            path, handler, methods=["POST"], response_model=answer,
            responses=openapi.AI_TOOL_RESPONSES, openapi_extra=openapi.operation(openapi.CLASS_HEADERS),
        )  # fmt: skip
    return router
