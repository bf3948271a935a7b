"""AI-tool calls at the gateway: summarize and structured actions.

Every call is checked first (`summary_request`, `action_request`: a 400
before anything is spent), then runs admitted by the edge (edge.py) in the
request's class budget (class B by default) and a slot of the AI-tool
admission gate (`build_tool_gate`: its own fixed concurrency limit and
per-class queues, apart from /v1/recommend's gate), and talks to the
inference service through its own client. The policies are pure (recmesh/aitools/); this module does the
I/O and says in every response which backend answered and which fallback was
taken, with the reason also on the span and in `recmesh_fallbacks_total`.

Backends, best first:
- summarize: vLLM generation (when the inference service has generative
  weights) -> extractive by sentence centrality over MiniLM embeddings ->
  the first sentences (when embeddings cannot be had in time).
- action: vLLM with JSON-schema guided decoding, output re-validated, retried
  once within budget -> the deterministic template filler (the documented
  fallback, and the only generator without an LLM). A string the filler made
  up only to satisfy the schema is listed in `degraded` as
  `placeholder:<JSON pointer>`; a schema it cannot satisfy is a 422 naming the
  keyword.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import structlog
from opentelemetry import trace

from recmesh.admission import AdmissionConfig, AdmissionGate
from recmesh.aitools import actions, summarize
from recmesh.aitools.schema_fill import Filled, Unfillable
from recmesh.aitools.tokens import BUDGET_REFUSED, TOKENS_USED, TokenCounter, charge
from recmesh.clients.inference import InferenceClient
from recmesh.errors import InvalidArgument, RecmeshError, Unprocessable
from recmesh.resilience import remaining_s
from recmesh.settings import AiToolSettings
from recmesh.telemetry import FALLBACKS, current_trace_id
from services.gateway.edge import Admitted

_log = structlog.get_logger("recmesh.gateway.aitools")

CAPABILITIES_TTL_S = 30.0


@dataclass
class ToolResult:
    backend: str
    model: str
    tokens_used: int
    slo_class: str
    trace_id: str
    degraded: list[str] = field(default_factory=list)


@dataclass
class Summary(ToolResult):
    summary: str = ""
    sentences: list[int] = field(default_factory=list)


@dataclass
class Action(ToolResult):
    output: dict[str, Any] = field(default_factory=dict)
    checks: list[str] = field(default_factory=list)  # what was verified server-side
    attempts: int = 0


@dataclass(frozen=True)
class SummaryRequest:
    """A summarize call that passed its checks."""

    sentences: list[str]
    max_sentences: int
    truncated: bool  # the text had more sentences than are read


@dataclass(frozen=True)
class ActionRequest:
    """An action call that passed its checks, with the LLM prompt it makes."""

    intent: str
    constraints: list[str]
    schema: dict[str, Any]
    context: dict[str, Any]
    prompt: str
    prompt_tokens: int


def build_tool_gate(settings: AiToolSettings) -> AdmissionGate:
    """A fixed limit (the AIMD bounds pinned to it) with per-class queues."""
    n = float(settings.concurrency)
    return AdmissionGate(
        AdmissionConfig(
            initial_limit=n,
            min_limit=n,
            max_limit=n,
            shares={"A": 1.0, "B": 1.0, "C": 0.5},
            queue_caps={str(k): v for k, v in settings.queue.items()},
        ),
        service="gateway_ai_tool",
    )


def _fallback(slo: str, reason: str, degraded: list[str], err: Exception | None = None) -> None:
    FALLBACKS.labels("gateway", reason, slo).inc()
    span = trace.get_current_span()
    span.set_attribute("recmesh.fallback_reason", reason)
    span.add_event("fallback", {"reason": reason, "error": str(err) if err else ""})
    _log.info("ai_tool_fallback", reason=reason, error=str(err) if err else None)
    degraded.append(reason)


@dataclass(frozen=True)
class _Spend:
    """An action call's token budget and what its steps may cost."""

    budget: int | None
    attempt_tokens: int  # one generation: the prompt and the output allowance
    template_tokens: int  # the template's answer, the fallback after any attempt

    def allows_another(self, spent: int) -> bool:
        """Whether one more attempt, and the template after it, still fit."""
        return self.budget is None or spent + self.attempt_tokens + self.template_tokens <= self.budget


def _summary_prompt(sentences: list[str], k: int) -> str:
    return f"Summarize in at most {k} sentences:\n" + " ".join(sentences)


class AiTools:
    def __init__(
        self,
        inference: InferenceClient,
        settings: AiToolSettings,
        counter: TokenCounter | None = None,
    ) -> None:
        self._inference = inference
        self._settings = settings
        self._counter = counter or TokenCounter()
        self._generation: tuple[float, str] | None = None  # (checked at, model name or "")

    async def _generation_model(self) -> str:
        """The inference service's generative model ("" for none), asked at most every 30 s."""
        now = time.monotonic()
        if self._generation is None or now - self._generation[0] > CAPABILITIES_TTL_S:
            try:
                caps = await self._inference.capabilities(cap_s=0.2)
                self._generation = (now, caps.generation_model)
            except RecmeshError:
                self._generation = (now, "")
        return self._generation[1]

    def _fuse_s(self) -> float:
        return self._settings.generation_timeout_ms / 1000

    def _charge(self, tenant: str, tool: str, estimate: int, budget: int | None) -> None:
        verdict = charge(estimate, budget)
        if not verdict.allowed:
            BUDGET_REFUSED.labels(tenant, tool).inc()
            raise Unprocessable(f"{tool}: {verdict.reason}")

    # --- summarize ----------------------------------------------------------

    def summary_request(self, text: str, max_sentences: int) -> SummaryRequest:
        if len(text) > self._settings.max_text_chars:
            raise InvalidArgument(f"text has {len(text)} characters; at most {self._settings.max_text_chars}")
        sentences, truncated = summarize.split_sentences(text, self._settings.max_sentences)
        if not sentences:
            raise InvalidArgument("text has no sentence to summarize")
        return SummaryRequest(sentences, max_sentences, truncated)

    async def summarize(self, request: SummaryRequest, admitted: Admitted) -> Summary:
        sentences, max_sentences = request.sentences, request.max_sentences
        slo, tenant = admitted.slo, admitted.caller.tenant
        # What the call may spend, counted before it runs: embedding each
        # sentence costs its tokens and the model's two special ones (as the
        # embed answer counts them); a generative model first, the prompt and
        # the output allowance on top (a failed or empty generation falls
        # back to embedding). The model is looked up once, so what runs is
        # what was charged.
        generator = await self._generation_model()
        estimate = sum(self._counter.count(s) for s in sentences)
        if generator:
            prompt_tokens = self._counter.count(_summary_prompt(sentences, max_sentences))
            estimate += prompt_tokens + self._settings.max_output_tokens
        self._charge(tenant, "summarize", estimate, admitted.caller.token_budget)
        result = await self._summarize(sentences, max_sentences, slo.name, generator)
        if request.truncated:
            result.degraded.append(f"text_truncated_to_{self._settings.max_sentences}_sentences")
        trace.get_current_span().set_attribute("recmesh.ai_tool.backend", result.backend)
        TOKENS_USED.labels(tenant, "summarize", slo.name).inc(result.tokens_used)
        return result

    async def _summarize(self, sentences: list[str], k: int, slo: str, generator: str) -> Summary:
        degraded: list[str] = []
        generated = 0  # tokens an empty generation still used
        if generator:
            prompt = _summary_prompt(sentences, k)
            try:
                out = await self._inference.generate(
                    prompt, self._settings.max_output_tokens, cap_s=self._fuse_s()
                )
                if out.text.strip():
                    return Summary(out.backend, out.model, out.prompt_tokens + out.completion_tokens, slo,
                                   current_trace_id(), degraded, out.text.strip())  # fmt: skip
                generated = out.prompt_tokens + out.completion_tokens
                _fallback(slo, "generation_empty", degraded)
            except RecmeshError as err:
                _fallback(slo, f"generation_failed:{type(err).__name__}", degraded, err)
        try:
            embedded = await self._inference.embed(sentences)
        except RecmeshError as err:
            if isinstance(err, InvalidArgument):
                raise
            _fallback(slo, f"embed_unavailable:{type(err).__name__}", degraded, err)
            picked = summarize.lead(sentences, k)
            tokens = generated + self._counter.count(" ".join(sentences))
            return Summary("extractive-lead", "none", tokens, slo, current_trace_id(), degraded,
                           " ".join(sentences[i] for i in picked), picked)  # fmt: skip
        picked = summarize.pick(summarize.centrality(embedded.matrix), k)
        tokens = generated + sum(embedded.tokens)
        return Summary(
            f"extractive-centrality/{embedded.backend}", embedded.model, tokens, slo,
            current_trace_id(), degraded, " ".join(sentences[i] for i in picked), picked,
        )  # fmt: skip

    # --- action -------------------------------------------------------------

    def action_request(
        self, intent: str, constraints: list[str], schema: dict[str, Any], context: dict[str, Any]
    ) -> ActionRequest:
        actions.check_request(constraints, schema)
        if len(json.dumps(context)) > self._settings.max_context_chars:
            raise InvalidArgument(f"context is over {self._settings.max_context_chars} characters as JSON")
        prompt = actions.llm_prompt(intent, constraints, schema, context)
        return ActionRequest(intent, constraints, schema, context, prompt, self._counter.count(prompt))

    async def action(self, request: ActionRequest, admitted: Admitted) -> Action:
        schema, context, constraints = request.schema, request.context, request.constraints
        slo, tenant, token_budget = admitted.slo, admitted.caller.tenant, admitted.caller.token_budget
        # The template's answer is what a call without (or after) a generative
        # model spends; each generation attempt the prompt and the output allowance.
        # Off the event loop: a large schema can take the filler ~0.3 s of CPU.
        template = await asyncio.to_thread(self._template, schema, request.intent, context)
        template_tokens = (
            self._counter.count(json.dumps(template.value)) if isinstance(template, Filled) else 0
        )
        generator = await self._generation_model()
        attempt_tokens = request.prompt_tokens + self._settings.max_output_tokens if generator else 0
        self._charge(tenant, "action", attempt_tokens + template_tokens, token_budget)
        result = await self._action(
            constraints, schema, template, request.prompt, generator, slo.name,
            _Spend(token_budget, attempt_tokens, template_tokens),
        )  # fmt: skip
        trace.get_current_span().set_attribute("recmesh.ai_tool.backend", result.backend)
        TOKENS_USED.labels(tenant, "action", slo.name).inc(result.tokens_used)
        return result

    @staticmethod
    def _template(schema: dict[str, Any], intent: str, context: dict[str, Any]) -> Filled | Unfillable:
        """The template's answer, or why it has none (a generator may still satisfy
        the schema; the fallback then answers 422 with the reason)."""
        try:
            return actions.template_fill(schema, intent, context)
        except Unfillable as err:
            return err

    async def _action(
        self,
        constraints: list[str],
        schema: dict[str, Any],
        template: Filled | Unfillable,
        prompt: str,
        generator: str,
        slo: str,
        spend: _Spend,
    ) -> Action:
        degraded: list[str] = []
        tokens = 0
        attempts = 0
        checks = ["json_schema", *constraints]
        if generator:
            while attempts < 2:
                left = remaining_s()
                if attempts and (left is None or left < 0.1):
                    _fallback(slo, "retry_skipped:budget", degraded)
                    break
                if attempts and not spend.allows_another(tokens):
                    _fallback(slo, "retry_skipped:token_budget", degraded)
                    break
                attempts += 1
                try:
                    out = await self._inference.generate(
                        prompt, self._settings.max_output_tokens, json.dumps(schema), cap_s=self._fuse_s()
                    )
                except RecmeshError as err:
                    _fallback(slo, f"generation_failed:{type(err).__name__}", degraded, err)
                    break
                tokens += out.prompt_tokens + out.completion_tokens
                try:
                    candidate = actions.parse_output(out.text)
                    problems = actions.violations(candidate, schema, constraints)
                except ValueError as err:
                    problems = [str(err)]
                if not problems:
                    return Action(out.backend, out.model, tokens, slo, current_trace_id(), degraded,
                                  candidate, checks, attempts)  # fmt: skip
                _fallback(slo, f"output_invalid:attempt_{attempts}", degraded)
                _log.info("ai_tool_output_invalid", attempt=attempts, problems=problems[:5])
            _fallback(slo, "fallback:template", degraded)
        if isinstance(template, Unfillable):
            raise Unprocessable(f"output_schema: {template}")
        output = template.value
        problems = actions.violations(output, schema, constraints)
        if problems:
            raise Unprocessable(f"no generator could satisfy output_schema and constraints: {problems[:5]}")
        if template.placeholders:
            FALLBACKS.labels("gateway", "template_placeholder", slo).inc()
            trace.get_current_span().set_attribute("recmesh.ai_tool.placeholders", template.placeholders)
            degraded.extend(f"placeholder:{p}" for p in template.placeholders)
        tokens += self._counter.count(json.dumps(output))
        backend = "template" if generator else "template (no generative model)"
        return Action(backend, "none", tokens, slo, current_trace_id(), degraded, output, checks, attempts)
