"""Token accounting for AI-tool calls.

Tokens are counted with the served model's own tokenizer (tokenizer.json of
the packaged all-MiniLM-L6-v2, untruncated), so an estimate made before a call
and the count after it use the same unit. `charge` is the pure budget rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter
from tokenizers import Tokenizer

from recmesh.embedding.weights import packaged_model_dir

TOKENS_USED = Counter(
    "recmesh_ai_tool_tokens_total",
    "Tokens used by AI-tool calls, per caller.",
    ["tenant", "tool", "slo_class"],
)
BUDGET_REFUSED = Counter(
    "recmesh_ai_tool_budget_refused_total",
    "AI-tool calls refused for their token budget.",
    ["tenant", "tool"],
)


class TokenCounter:
    def __init__(self, tokenizer_json: Path | None = None) -> None:
        path = tokenizer_json or packaged_model_dir() / "tokenizer.json"
        self._tok = Tokenizer.from_file(str(path))
        self._tok.no_truncation()
        self._tok.no_padding()

    def count(self, text: str) -> int:
        return len(self._tok.encode(text).ids)


@dataclass(frozen=True)
class Charge:
    allowed: bool
    estimate: int
    budget: int | None

    @property
    def reason(self) -> str:
        return f"needs about {self.estimate} tokens; x-llm-token-budget is {self.budget}"


def charge(estimate: int, budget: int | None) -> Charge:
    """A call may run when it has no budget or its estimate fits in it."""
    return Charge(budget is None or estimate <= budget, estimate, budget)
