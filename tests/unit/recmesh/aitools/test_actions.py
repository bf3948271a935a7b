"""Pure action policies: the action schema checks and the template generator."""

from __future__ import annotations

from typing import Any

import pytest

from recmesh.aitools import actions
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
