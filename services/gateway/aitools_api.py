"""REST routes of the AI-tool endpoints (/v2/ai-tool/*), class B by default."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from recmesh.resilience import request_scope
from recmesh.slo import (
    TIMEOUT_DOC,
    TOKEN_BUDGET_HEADER,
    ClassDecision,
    parse_token_budget,
)
from services.gateway.aitools import AiTools
from services.gateway.recommend import ClassPolicy


class SummarizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, description="the text to summarize")
    max_sentences: int = Field(3, ge=1, le=20, strict=True)


class SummarizeOut(BaseModel):
    summary: str
    backend: str
    model: str
    sentences: list[int] = Field(description="indexes of the chosen sentences (extractive backends)")
    tokens_used: int
    slo_class: str
    trace_id: str
    degraded: list[str]


class ActionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    intent: str = Field(min_length=1, max_length=200, examples=["drive_trial_conversion"])
    constraints: list[str] = Field(
        default_factory=list, examples=[["must_include_cta", "avoid_price_mention"]]
    )
    output_schema: dict[str, Any] = Field(
        description="JSON Schema (an object) the output must validate against"
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


def _caller(request: Request, policy: ClassPolicy) -> tuple[ClassDecision, str, int | None]:
    """The granted class, the tenant and the token budget of a tool call. The
    class is stamped on the request first as "invalid", so a refused header is
    still labelled in the latency metric."""
    request.state.slo_class = "invalid"
    decision = policy.decide(request.headers)
    request.state.slo_class = decision.slo.name
    tenant = policy.entitlement(request.headers).tenant
    return decision, tenant, parse_token_budget(request.headers.get(TOKEN_BUDGET_HEADER))


def build_router(tools: AiTools, policy: ClassPolicy) -> APIRouter:
    router = APIRouter(prefix="/v2/ai-tool", tags=["ai-tool"])
    budget_doc = "LLM token budget; tokens used are counted per caller"

    @router.post("/summarize", response_model=SummarizeOut)
    async def summarize(
        body: SummarizeBody,
        request: Request,
        response: Response,
        x_slo_class: Annotated[str | None, Header(description="SLO class: A, B or C")] = None,
        x_llm_token_budget: Annotated[str | None, Header(description=budget_doc)] = None,
        x_request_timeout_ms: Annotated[int | None, Header(gt=0, description=TIMEOUT_DOC)] = None,
    ) -> SummarizeOut:
        decision, tenant, budget = _caller(request, policy)
        with request_scope(decision.slo.name, x_request_timeout_ms / 1000 if x_request_timeout_ms else None):
            out = await tools.summarize(body.text, body.max_sentences, decision.slo, tenant, budget)
        response.headers["x-slo-class"] = decision.slo.name
        return SummarizeOut(
            summary=out.summary, backend=out.backend, model=out.model, sentences=out.sentences,
            tokens_used=out.tokens_used, slo_class=out.slo_class, trace_id=out.trace_id,
            degraded=[*decision.notes, *out.degraded],
        )  # fmt: skip

    @router.post("/action", response_model=ActionOut)
    async def action(
        body: ActionBody,
        request: Request,
        response: Response,
        x_slo_class: Annotated[str | None, Header(description="SLO class: A, B or C")] = None,
        x_llm_token_budget: Annotated[str | None, Header(description=budget_doc)] = None,
        x_request_timeout_ms: Annotated[int | None, Header(gt=0, description=TIMEOUT_DOC)] = None,
    ) -> ActionOut:
        decision, tenant, budget = _caller(request, policy)
        with request_scope(decision.slo.name, x_request_timeout_ms / 1000 if x_request_timeout_ms else None):
            out = await tools.action(
                body.intent, body.constraints, body.output_schema, body.context, decision.slo, tenant, budget
            )
        response.headers["x-slo-class"] = decision.slo.name
        return ActionOut(
            output=out.output, backend=out.backend, model=out.model, checks=out.checks, attempts=out.attempts,
            tokens_used=out.tokens_used, slo_class=out.slo_class, trace_id=out.trace_id,
            degraded=[*decision.notes, *out.degraded],
        )  # fmt: skip

    return router
