"""The token budget rule and the token counter."""

from __future__ import annotations

from recmesh.aitools.tokens import TokenCounter, charge


def test_token_budget_rule_and_counter() -> None:
    assert charge(10, None).allowed and charge(10, 10).allowed
    refused = charge(11, 10)
    assert not refused.allowed and "11 tokens" in refused.reason
    counter = TokenCounter()
    assert counter.count("hello world") == 4  # [CLS] hello world [SEP]
    assert counter.count("word " * 1000) == 1002  # not truncated, unlike the encoder
