"""Pure AI-tool policies: sentence split and centrality, the action schema
checks, the template generator and the token budget rule."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from recmesh.aitools import actions, summarize
from recmesh.aitools.tokens import TokenCounter, charge
from recmesh.errors import InvalidArgument

CTA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "cta": {
            "type": "object",
            "properties": {
                "text": {"type": "string", "maxLength": 40},
                "url": {"type": "string", "format": "uri"},
            },
            "required": ["text", "url"],
        },
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        "channel": {"type": "string", "enum": ["email", "push"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
    },
    "required": ["cta", "priority", "channel"],
    "additionalProperties": False,
}


def test_split_sentences_keeps_order_and_caps() -> None:
    text = 'First one. Second one! "Third?" he asked.\nFourth line\n\n...'
    sentences, truncated = summarize.split_sentences(text, 10)
    assert sentences == ["First one.", "Second one!", '"Third?"', "he asked.", "Fourth line"]
    assert not truncated
    assert summarize.split_sentences(text, 2) == (["First one.", "Second one!"], True)


def test_centrality_picks_the_central_sentences_in_text_order() -> None:
    a = np.array([1.0, 0.0, 0.0])
    b = np.array([0.9, 0.1, 0.0])
    outlier = np.array([0.0, 0.0, 1.0])
    matrix = np.stack([outlier, a, b, a]).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    scores = summarize.centrality(matrix)
    assert int(np.argmin(scores)) == 0
    assert summarize.pick(scores, 2) == [1, 3]
    assert summarize.pick(summarize.centrality(matrix[:1]), 3) == [0]
    assert summarize.lead(["x", "y", "z"], 2) == [0, 1]


def test_check_request_refuses_bad_schemas_and_unknown_constraints() -> None:
    with pytest.raises(InvalidArgument, match="unknown constraints"):
        actions.check_request(["be_nice"], CTA_SCHEMA)
    with pytest.raises(InvalidArgument, match="not valid JSON Schema"):
        actions.check_request([], {"type": "object", "properties": {"x": {"type": "strin"}}})
    with pytest.raises(InvalidArgument, match="must describe an object"):
        actions.check_request([], {"type": "string"})
    outside = {"type": "object", "properties": {"x": {"$ref": "https://example.com/x.json"}}}
    with pytest.raises(InvalidArgument, match=r"\$ref 'https://example.com/x.json' does not resolve"):
        actions.check_request([], outside)


def test_constraints_are_checked_on_every_string() -> None:
    assert actions.has_cta({"a": {"b": ["Start your trial"]}})
    assert not actions.has_cta({"a": "Our newest feature"})
    assert actions.mentions_price({"t": "Only $9.99"}) and actions.mentions_price({"t": "10 EUR a month"})
    assert actions.mentions_price({"t": "see pricing"})
    assert not actions.mentions_price({"t": "Start your free trial"})
    problems = actions.violations(
        {"cta": {"text": "Buy for $5"}}, CTA_SCHEMA, ["must_include_cta", "avoid_price_mention"]
    )
    assert "constraint:must_include_cta" in problems and "constraint:avoid_price_mention" in problems
    assert "schema:cta: 'url' is a required property (required)" in problems
    formats = {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}}}
    assert actions.violations({"when": "tomorrow"}, formats, []) == [
        "schema:when: 'tomorrow' is not a 'date-time' (format)"
    ]
    assert actions.violations({"x": "\ud800"}, {"type": "object"}, [])[0].startswith("output: not encodable")


def test_template_fill_satisfies_schema_and_constraints() -> None:
    context = {"product": "recmesh Pro", "url": "https://example.org/trial", "price": "$20"}
    filled = actions.template_fill(CTA_SCHEMA, "drive_trial_conversion", context)
    out = filled.value
    assert actions.violations(out, CTA_SCHEMA, ["must_include_cta", "avoid_price_mention"]) == []
    assert filled.placeholders == []  # every value came from the context or the template's text
    assert out["cta"] == {
        "text": "Start your free trial with recmesh Pro",
        "url": "https://example.org/trial",
    }
    assert out["priority"] == 1 and out["channel"] == "email" and len(out["tags"]) == 2
    assert filled == actions.template_fill(CTA_SCHEMA, "drive_trial_conversion", context)  # deterministic


def test_template_fill_strips_a_price_taken_from_context() -> None:
    schema = {"type": "object", "properties": {"headline": {"type": "string"}}, "required": ["headline"]}
    out = actions.template_fill(schema, "upsell", {"headline": "Save 20 USD today"})
    assert not actions.mentions_price(out.value)


def test_parse_output_names_the_json_error() -> None:
    assert actions.parse_output('{"a": 1}') == {"a": 1}
    with pytest.raises(ValueError, match="not JSON"):
        actions.parse_output("{oops")


def test_token_budget_rule_and_counter() -> None:
    assert charge(10, None).allowed and charge(10, 10).allowed
    refused = charge(11, 10)
    assert not refused.allowed and "11 tokens" in refused.reason
    counter = TokenCounter()
    assert counter.count("hello world") == 4  # [CLS] hello world [SEP]
    assert counter.count("word " * 1000) == 1002  # not truncated, unlike the encoder
