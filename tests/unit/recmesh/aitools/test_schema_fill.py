"""The action template filler against schema constraints (recmesh/aitools/
schema_fill.py, regex_example.py): each keyword family by hand, then random
schemas (tests/schema_strategies.py) that must be filled with output that
validates, or refused naming a keyword of the schema."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from jsonschema import Draft202012Validator

from recmesh.aitools import actions
from recmesh.aitools.regex_example import NoExample, example
from recmesh.aitools.schema_fill import Filled, Unfillable
from tests.schema_strategies import output_schemas

CONTEXT = {"product": "recmesh Pro", "url": "https://example.org/trial?ref=mail"}


def _obj(props: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), **extra}


def _fill(schema: dict[str, Any], context: dict[str, Any] | None = None) -> Filled:
    actions.check_request([], schema)
    filled = actions.template_fill(schema, "drive_trial_conversion", CONTEXT if context is None else context)
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    errors = [e.message for e in validator.iter_errors(filled.value)]
    assert errors == [], (schema, filled.value)
    return filled


def _refused(schema: dict[str, Any]) -> Unfillable:
    actions.check_request([], schema)
    with pytest.raises(Unfillable) as caught:
        actions.template_fill(schema, "drive_trial_conversion", CONTEXT)
    return caught.value


# --- regular expressions -------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "min_len", "max_len"),
    [
        ("^/", 0, None), ("^/", 8, None), ("^[0-9]{6}$", 0, None), ("^[a-z]+(-[a-z]+)*$", 10, 12),
        (r"^https?://[a-z]+\.com/\w*$", 0, None), (r"(a|bc)+\1", 5, None), (r"^\d{3}-\d{4}$", 0, None),
        ("^.{3,5}$", 0, None), ("[^abc]+", 4, 4), ("^$", 0, None), ("^(?:[A-Z][a-z]+ ?){2,3}$", 0, None),
        (r"\bgo\b", 0, None), ("^[\u4e00-\u9fff]+$", 0, None), ("(?i)^start", 0, None),
        ("^(a)?(?(1)b|c)$", 0, None), ("x*", 0, 0), ("(a+)+$", 30, None), ("a{2,}?b", 0, None),
    ],
)  # fmt: skip
def test_regex_examples_match_within_the_lengths(pattern: str, min_len: int, max_len: int | None) -> None:
    text = example(pattern, min_len, max_len)
    assert re.search(pattern, text) and min_len <= len(text) <= (max_len if max_len is not None else 10**6)


def test_regex_variants_differ_and_impossible_patterns_say_so() -> None:
    assert [example("^[a-z]{2}$", variant=v) for v in range(3)] == ["aa", "ba", "ca"]
    for pattern, min_len, max_len in (("(?=x)y", 0, None), ("^a{2}$", 3, None), ("^$", 1, None),
                                      ("^[0-9]+$", 5, 2), ("^a{5000}$", 0, None)):  # fmt: skip
        with pytest.raises(NoExample):
            example(pattern, min_len, max_len)


# --- keyword by keyword ------------------------------------------------------------


def test_a_relative_link_pattern_gets_the_context_urls_path_or_a_placeholder() -> None:
    schema = _obj({"cta": _obj({"text": {"type": "string", "maxLength": 40},
                                "url": {"type": "string", "pattern": "^/"}})})  # fmt: skip
    with_url = _fill(schema)
    assert with_url.value["cta"] == {
        "text": "Start your free trial with recmesh Pro",
        "url": "/trial?ref=mail",
    }
    assert with_url.placeholders == []
    without = _fill(schema, {})
    assert without.value["cta"]["url"].startswith("/") and without.placeholders == ["/cta/url"]


def test_a_url_field_without_a_context_url_is_a_placeholder() -> None:
    filled = _fill(_obj({"cta": _obj({"text": {"type": "string"}, "url": {"type": "string"}})}), {})
    assert filled.value["cta"]["url"] == "https://example.com/start"
    assert filled.placeholders == ["/cta/url"]


def test_formats_are_valid_for_the_format_checker() -> None:
    formats = ["uri", "uri-reference", "email", "date", "date-time", "uuid", "time", "ipv4", "ipv6",
               "hostname", "idn-email"]  # fmt: skip
    checker = Draft202012Validator.FORMAT_CHECKER
    assert {"uri", "uri-reference", "date-time", "email", "date", "uuid"} <= set(checker.checkers)
    schema = _obj({f.replace("-", "_"): {"type": "string", "format": f} for f in formats})
    filled = _fill(schema, {"date_time": "not a date", "email": "nobody"})  # refused context values
    for f in formats:
        value = filled.value[f.replace("-", "_")]
        assert checker.conforms(value, f), (f, value)
    assert sorted(filled.placeholders) == sorted(f"/{f.replace('-', '_')}" for f in formats)
    # A format with a pattern: both hold.
    both = _fill(_obj({"link": {"type": "string", "format": "uri-reference", "pattern": "^/"}}), {})
    assert both.value["link"] == "/start"


def test_enum_const_and_lengths() -> None:
    filled = _fill(_obj({
        "channel": {"type": "string", "enum": ["email", "push"]},
        "tier": {"enum": [3, "gold", None], "type": ["string", "null"]},
        "version": {"const": {"v": [1, 2]}},
        "title": {"type": "string", "minLength": 50, "maxLength": 60},
        "code": {"type": "string", "maxLength": 4},
    }))  # fmt: skip
    assert filled.value["channel"] == "email" and filled.value["tier"] == "gold"
    assert filled.value["version"] == {"v": [1, 2]}
    assert 50 <= len(filled.value["title"]) <= 60 and filled.value["title"].startswith(
        "Start your free trial"
    )
    assert filled.value["code"] == "Star"
    assert _fill(_obj({"channel": {"enum": ["push", "email"]}}), {"channel": "email"}).value == {
        "channel": "email"
    }


def test_numeric_bounds_and_multiples() -> None:
    filled = _fill(_obj({
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "multipleOf": 0.25},
        "step": {"type": "integer", "minimum": 7, "multipleOf": 5},
        "below": {"type": "integer", "exclusiveMaximum": -3},
        "ratio": {"type": "number", "exclusiveMinimum": 0.1, "exclusiveMaximum": 0.2},
        "half": {"type": "integer", "multipleOf": 2.5, "minimum": 1},
        "count": {"type": "integer"},
    }), {"count": 12})  # fmt: skip
    assert filled.value == {"priority": 1, "score": 0.25, "step": 10, "below": -4,
                            "ratio": pytest.approx(0.15), "half": 5, "count": 12}  # fmt: skip


def test_nested_objects_and_arrays() -> None:
    schema = _obj(
        {
            "steps": {"type": "array", "minItems": 3, "maxItems": 3, "uniqueItems": True,
                      "items": _obj({"n": {"type": "integer", "minimum": 1}, "label": {"type": "string"}})},
            "tags": {"type": "array", "items": {"type": "string", "pattern": "^#[a-z]+$"}, "minItems": 2,
                     "uniqueItems": True},
            "pair": {"type": "array", "items": False,
                     "prefixItems": [{"type": "boolean"}, {"type": "string", "format": "date"}]},
            "flags": {"type": "array", "items": {"type": "boolean"}, "contains": {"const": False}},
            "meta": {"type": "object", "required": ["source"], "additionalProperties": {"type": "string"},
                     "properties": {}},
            "maybe": {"type": ["null", "integer"], "minimum": 3},
        },
        additionalProperties=False,
    )  # fmt: skip
    out = _fill(schema).value
    assert [s["n"] for s in out["steps"]] == [1, 2, 3]
    assert out["tags"] == ["#a", "#b"] and out["pair"][0] is True and out["flags"] == [False]
    assert set(out["meta"]) == {"source"} and out["maybe"] == 3


def test_refusals_name_the_keyword() -> None:
    booleans = {"type": "boolean"}
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"type": "string", "pattern": "(?=x)y"}, "pattern", "/a"),
        ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength", "/a"),
        ({"type": "string", "pattern": "^[0-9]{6}$", "minLength": 7}, "pattern", "/a"),
        ({"type": "string", "minLength": 10_000}, "minLength", "/a"),
        ({"type": "integer", "minimum": 1, "maximum": 2, "multipleOf": 5}, "multipleOf", "/a"),
        ({"type": "integer", "minimum": 3, "maximum": 2}, "minimum", "/a"),
        ({"type": "number", "exclusiveMinimum": 2, "maximum": 2}, "exclusiveMinimum", "/a"),
        ({"type": "array", "items": booleans, "minItems": 3, "uniqueItems": True}, "uniqueItems", "/a/2"),
        ({"type": "array", "minItems": 1000}, "minItems", "/a"),
        ({"type": "array", "prefixItems": [{"type": "null"}], "items": False, "minItems": 2}, "items", "/a"),
        ({"enum": []}, "enum", "/a"),
        ({"const": "\ud800"}, "const", "/a"),
        ({"type": "object", "required": ["x"], "additionalProperties": False}, "additionalProperties", "/a/"),
        ({"type": "object", "required": ["x", "y"], "maxProperties": 1}, "maxProperties", "/a"),
        ({"$ref": "#"}, "$ref", "/a"),
    ]  # fmt: skip
    for sub, keyword, where in cases:
        refused = _refused(_obj({"a": sub}))
        assert refused.keyword == keyword and refused.path.startswith(where), (sub, str(refused))
        assert f"cannot meet `{keyword}` at {where}" in str(refused)


def test_optional_properties_that_cannot_be_filled_are_left_out() -> None:
    never = {"type": "string", "pattern": "(?=x)y"}
    props = {"ok": {"type": "string"}, "never": never, "self": {"$ref": "#"}}
    schema = {"type": "object", "properties": props, "required": ["ok"]}
    assert set(_fill(schema).value) == {"ok"}  # and `self`, an optional recursion, is not expanded
    tree = {"type": "object", "$defs": {"node": {"type": "object", "properties": {"id": {"type": "integer"},
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["id"]}},
            "properties": {"root": {"$ref": "#/$defs/node"}}, "required": ["root"]}  # fmt: skip
    assert _fill(tree).value["root"]["id"] == 0


def test_template_fill_is_deterministic() -> None:
    schema = _obj(
        {"a": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, "b": {"type": "string", "format": "uuid"}}
    )
    assert actions.template_fill(schema, "x", {}) == actions.template_fill(schema, "x", {})


# --- random schemas ---------------------------------------------------------------

EXAMPLES = int(os.environ.get("RECMESH_PROPERTY_EXAMPLES", "600"))


def test_random_schemas_are_filled_with_valid_output_or_refused_by_keyword() -> None:
    """Random schemas (tests/schema_strategies.py): every one is checked (as the gateway does),
    then filled with output that validates with formats checked, or refused with
    a keyword that is in the schema. Counts print with `pytest -s`."""
    counts: Counter[str] = Counter()
    keywords: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
    @given(output_schemas())
    def check(schema: dict[str, Any]) -> None:
        counts["examples"] += 1
        actions.check_request([], schema)
        try:
            filled = actions.template_fill(schema, "drive_trial_conversion", CONTEXT)
        except Unfillable as refused:
            counts["refused"] += 1
            keywords[refused.keyword] += 1
            assert f'"{refused.keyword}"' in json.dumps(schema), (str(refused), schema)
            return
        assert actions.violations(filled.value, schema, []) == [], (schema, filled.value)
        for pointer in filled.placeholders:
            node: Any = filled.value
            for part in pointer.split("/")[1:]:
                node = (
                    node[int(part)]
                    if isinstance(node, list)
                    else node[part.replace("~1", "/").replace("~0", "~")]
                )
            assert isinstance(node, str), pointer
        counts["filled"] += 1

    check()
    print(f"\nrandom schemas: {dict(counts)}; refused by keyword: {dict(keywords.most_common())}")
    assert counts["examples"] >= EXAMPLES * 0.9
    # Most random schemas are satisfiable: a filler that refused them would fail here.
    assert counts["filled"] >= counts["examples"] * 0.7, counts
