"""The AI-tool call flow (services/gateway/ai_tool_calls.py) with a scripted stand-in
for the inference client: the LLM path cannot run here (no GPU), so what it
does with good, bad and missing outputs is checked against scripted replies."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pytest

from recmesh.clients.inference import Embedded, InferenceClient
from recmesh.errors import DeadlineExceeded, ResourceExhausted, Unprocessable
from recmesh.settings import AiToolSettings
from recmesh.slo import DEFAULT_CLASSES, ClassDecision, Entitlement, SloClass
from recmesh.v1 import inference_pb2 as pb
from services.gateway.ai_tool_calls import Action, AiTools, Summary, build_tool_gate
from services.gateway.edge import Caller, ClassPolicy, Edge

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string"}, "url": {"type": "string"}},
    "required": ["text", "url"],
}
GOOD = json.dumps({"text": "Start your trial", "url": "https://example.org"})
PRICEY = json.dumps({"text": "Start now for $5", "url": "https://example.org"})


@dataclass
class Scripted:
    """Replies in order; an exception in the script is raised."""

    generation_model: str = "tiny-llm"
    replies: list[Any] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)
    embed_error: Exception | None = None

    async def capabilities(self, cap_s: float = 2.0) -> pb.CapabilitiesResponse:
        return pb.CapabilitiesResponse(generation_model=self.generation_model)

    async def generate(
        self, prompt: str, max_tokens: int, json_schema: str = "", cap_s: float | None = None
    ) -> pb.GenerateResponse:
        self.prompts.append(prompt)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return pb.GenerateResponse(text=reply, model="tiny-llm", backend="vllm", prompt_tokens=50,
                                   completion_tokens=10)  # fmt: skip

    async def embed(self, texts: list[str], cap_s: float | None = None) -> Embedded:
        if self.embed_error is not None:
            raise self.embed_error
        rng = np.random.default_rng(0)
        m = rng.normal(size=(len(texts), 8)).astype(np.float32)
        return Embedded(
            m / np.linalg.norm(m, axis=1, keepdims=True), "m", "onnxruntime-cpu", [5] * len(texts)
        )


@dataclass
class Routed:
    """The tools as the /v2/ai-tool/* routes call them: the call checked, then
    admitted by the edge through the AI-tool gate, then run."""

    tools: AiTools
    edge: Edge

    async def action(
        self,
        intent: str,
        constraints: list[str],
        schema: dict[str, Any],
        context: dict[str, Any],
        slo: SloClass,
        tenant: str,
        token_budget: int | None,
    ) -> Action:
        call = self.tools.action_request(intent, constraints, schema, context)
        async with self.edge.admit(Caller(ClassDecision(slo, slo.name), tenant, token_budget)) as admitted:
            return await self.tools.action(call, admitted)

    async def summarize(
        self, text: str, max_sentences: int, slo: SloClass, tenant: str, token_budget: int | None
    ) -> Summary:
        call = self.tools.summary_request(text, max_sentences)
        async with self.edge.admit(Caller(ClassDecision(slo, slo.name), tenant, token_budget)) as admitted:
            return await self.tools.summarize(call, admitted)


def _tools(client: Scripted) -> Routed:
    settings = AiToolSettings()
    policy = ClassPolicy("B", {}, Entitlement("anonymous"))
    return Routed(AiTools(cast(InferenceClient, client), settings), Edge(policy, build_tool_gate(settings)))


B = DEFAULT_CLASSES["B"]
CONSTRAINTS = ["must_include_cta", "avoid_price_mention"]


async def test_valid_llm_output_is_served_as_is() -> None:
    out = await _tools(Scripted(replies=[GOOD])).action("trial", CONSTRAINTS, SCHEMA, {}, B, "t", None)
    assert (out.backend, out.attempts, out.degraded) == ("vllm", 1, [])
    assert out.output["text"] == "Start your trial" and out.tokens_used == 60


async def test_violating_output_is_retried_once_then_served() -> None:
    out = await _tools(Scripted(replies=[PRICEY, GOOD])).action(
        "trial", CONSTRAINTS, SCHEMA, {}, B, "t", None
    )
    assert out.backend == "vllm" and out.attempts == 2
    assert out.degraded == ["output_invalid:attempt_1"]


async def test_two_bad_outputs_fall_back_to_the_template_and_say_so() -> None:
    client = Scripted(replies=["not json", PRICEY])
    out = await _tools(client).action("trial", CONSTRAINTS, SCHEMA, {"url": "https://x.org"}, B, "t", None)
    assert out.backend == "template" and out.attempts == 2
    assert out.degraded == ["output_invalid:attempt_1", "output_invalid:attempt_2", "fallback:template"]
    assert out.output == {"text": "Start your free trial", "url": "https://x.org"}


async def test_generation_timeout_falls_back_without_retry() -> None:
    client = Scripted(replies=[DeadlineExceeded("fuse")])
    out = await _tools(client).action("trial", CONSTRAINTS, SCHEMA, {}, B, "t", None)
    assert out.attempts == 1
    # No URL in the context: the template's placeholder link is said to be one.
    assert out.degraded == ["generation_failed:DeadlineExceeded", "fallback:template", "placeholder:/url"]


async def test_token_budget_counts_the_output_allowance_when_an_llm_answers() -> None:
    tools = _tools(Scripted(replies=[GOOD]))
    with pytest.raises(Unprocessable, match="x-llm-token-budget is 100"):
        await tools.action("trial", CONSTRAINTS, SCHEMA, {}, B, "t", 100)  # prompt + 256 output tokens
    no_llm = _tools(Scripted(generation_model=""))
    assert (await no_llm.action("trial", CONSTRAINTS, SCHEMA, {}, B, "t", 200)).attempts == 0


async def test_summarize_prefers_generation_then_centrality_then_lead() -> None:
    text = "One fact here. Another fact there. A third fact. A fourth one."
    generated = await _tools(Scripted(replies=["A short summary."])).summarize(text, 2, B, "t", None)
    assert (generated.backend, generated.summary) == ("vllm", "A short summary.")
    failed = await _tools(Scripted(replies=[ResourceExhausted("busy")])).summarize(text, 2, B, "t", None)
    assert failed.backend == "extractive-centrality/onnxruntime-cpu"
    assert failed.degraded == ["generation_failed:ResourceExhausted"] and len(failed.sentences) == 2
    no_embed = Scripted(generation_model="", embed_error=ResourceExhausted("embed lane full"))
    lead = await _tools(no_embed).summarize(text, 2, B, "t", None)
    assert (lead.backend, lead.sentences, lead.summary) == (
        "extractive-lead",
        [0, 1],
        "One fact here. Another fact there.",
    )


async def test_a_retry_the_token_budget_cannot_cover_is_skipped() -> None:
    tools = _tools(Scripted(replies=[PRICEY, GOOD]))
    unbudgeted = await _tools(Scripted(replies=[PRICEY, GOOD])).action(
        "trial", CONSTRAINTS, SCHEMA, {}, B, "t", None
    )
    assert unbudgeted.attempts == 2
    # An attempt may cost its prompt (120 tokens) and the output allowance
    # (256), the template after it 31: 407 fit in 430, a second attempt after
    # the first one's 60 tokens (467) does not.
    out = await tools.action("trial", CONSTRAINTS, SCHEMA, {}, B, "t", 430)
    assert out.attempts == 1 and out.backend == "template" and out.tokens_used <= 430
    assert out.degraded == [
        "output_invalid:attempt_1", "retry_skipped:token_budget", "fallback:template", "placeholder:/url"
    ]  # fmt: skip


async def test_an_empty_generation_is_charged_with_the_embedding_after_it() -> None:
    text = "One fact here. Another fact there. A third fact."
    out = await _tools(Scripted(replies=["   "])).summarize(text, 1, B, "t", None)
    assert out.backend == "extractive-centrality/onnxruntime-cpu" and out.degraded == ["generation_empty"]
    assert out.tokens_used == 60 + 3 * 5, "the empty generation's 60 tokens and the 3 embedded sentences"


async def test_a_schema_the_template_cannot_fill_is_left_to_the_generator() -> None:
    # A look-behind: the template's regex generator cannot write it, an LLM can.
    odd: dict[str, Any] = {"type": "object", "properties": {"x": {"type": "string", "pattern": "(?<=a)b"}},
                           "required": ["x"]}  # fmt: skip
    out = await _tools(Scripted(replies=['{"x": "ab"}'])).action("trial", [], odd, {}, B, "t", None)
    assert (out.backend, out.output) == ("vllm", {"x": "ab"})
    with pytest.raises(Unprocessable, match=r"output_schema: cannot meet `pattern` at /x"):
        await _tools(Scripted(replies=['{"x": "b"}', '{"x": "b"}'])).action(
            "trial", [], odd, {}, B, "t", None
        )
