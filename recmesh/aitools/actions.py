"""Structured actions (the design notes' prompt schema): an `intent`, named
`constraints`, an `output_schema` (JSON Schema) and a `context`.

- `check_schema` refuses a schema that is not valid JSON Schema, or whose root
  is not an object.
- `violations` validates an output against the schema (jsonschema) and checks
  every constraint; an empty list means the output may be served.
- `template_fill` is the deterministic generator used without an LLM: it walks
  the schema and fills each property from the context, the intent and fixed
  templates, so its output satisfies the constraints by construction. It is
  also the documented fallback when an LLM's output fails twice.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from recmesh.errors import InvalidArgument

CTA_VERBS = ("start", "try", "get", "join", "sign up", "subscribe", "book", "discover", "explore",
             "claim", "activate", "continue", "download", "register", "shop", "learn more")  # fmt: skip
_PRICE = re.compile(
    r"[$€£¥]\s?\d|\d\s?[$€£¥]|\b\d+(?:[.,]\d+)?\s?(?:usd|eur|gbp|dollars?|euros?|pounds?)\b"
    r"|\b(?:price[sd]?|pricing|cost[s]?|discount|per month|/mo)\b",
    re.IGNORECASE,
)
_CTA = re.compile(r"^\s*(?:" + "|".join(re.escape(v) for v in CTA_VERBS) + r")\b", re.IGNORECASE)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def has_cta(output: Any) -> bool:
    """Some string in the output starts with a call-to-action verb."""
    return any(_CTA.match(s) for s in _strings(output))


def mentions_price(output: Any) -> bool:
    return any(_PRICE.search(s) for s in _strings(output))


CONSTRAINTS: dict[str, Callable[[Any], bool]] = {
    "must_include_cta": has_cta,
    "avoid_price_mention": lambda out: not mentions_price(out),
}


def check_request(constraints: list[str], schema: Mapping[str, Any]) -> None:
    unknown = sorted(set(constraints) - set(CONSTRAINTS))
    if unknown:
        raise InvalidArgument(f"unknown constraints {unknown}; known: {sorted(CONSTRAINTS)}")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as err:
        raise InvalidArgument(f"output_schema is not valid JSON Schema: {err.message}") from None
    if schema.get("type") != "object":
        raise InvalidArgument('output_schema must describe an object ("type": "object")')


def violations(output: Any, schema: Mapping[str, Any], constraints: list[str]) -> list[str]:
    found = [
        f"schema:{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
        for e in Draft202012Validator(schema).iter_errors(output)
    ]
    found += [f"constraint:{c}" for c in constraints if not CONSTRAINTS[c](output)]
    return found


def parse_output(text: str) -> Any:
    """An LLM's text as JSON; ValueError names what is wrong."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"output is not JSON: {err.msg} at {err.pos}") from None


# --- the template generator ---------------------------------------------------


def _words(intent: str) -> str:
    return re.sub(r"[_\-]+", " ", intent).strip()


_CTA_BY_INTENT = {
    "trial": "Start your free trial",
    "signup": "Sign up now",
    "subscribe": "Subscribe today",
    "download": "Download the app",
    "book": "Book your spot",
    "shop": "Shop the collection",
}


def cta_text(intent: str, context: Mapping[str, Any]) -> str:
    for key, text in _CTA_BY_INTENT.items():
        if key in intent.lower():
            base = text
            break
    else:
        base = "Get started"
    product = context.get("product") or context.get("item_title")
    return f"{base} with {product}" if isinstance(product, str) and product else base


def _string_for(name: str, spec: Mapping[str, Any], intent: str, context: Mapping[str, Any]) -> str:
    lname = name.lower()
    if "enum" in spec:
        return str(spec["enum"][0])
    if spec.get("format") in ("uri", "url", "iri") or "url" in lname or "link" in lname or "href" in lname:
        value = context.get(name) or context.get("url") or context.get("landing_url")
        return str(value) if value else "https://example.com/start"
    if name in context and isinstance(context[name], str):
        value = str(context[name])
    elif any(k in lname for k in ("text", "label", "cta", "button", "action", "headline", "title")):
        value = cta_text(intent, context)
    else:
        value = f"{cta_text(intent, context)}: {_words(intent)}"
    if mentions_price(value):
        value = _PRICE.sub("", value).strip() or cta_text(intent, {})
    lo, hi = int(spec.get("minLength", 0)), spec.get("maxLength")
    if hi is not None:
        value = value[: int(hi)].rstrip()
    return value.ljust(lo, ".")


def fill(schema: Mapping[str, Any], intent: str, context: Mapping[str, Any], name: str = "") -> Any:
    """A value for `schema` (object, array, string, number, integer, boolean, null, enum, const)."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema and schema.get("type") != "string":
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        props: Mapping[str, Any] = schema.get("properties", {})
        return {key: fill(sub, intent, context, key) for key, sub in props.items()}
    if kind == "array":
        items = schema.get("items", {"type": "string"})
        return [fill(items, intent, context, name) for _ in range(max(1, int(schema.get("minItems", 1))))]
    if kind in ("integer", "number"):
        value = context.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value) if kind == "integer" else float(value)
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        return int(low) + (1 if "exclusiveMinimum" in schema else 0) if kind == "integer" else float(low)
    if kind == "boolean":
        return bool(context.get(name, True))
    if kind == "null":
        return None
    return _string_for(name, schema, intent, context)


def template_fill(schema: Mapping[str, Any], intent: str, context: Mapping[str, Any]) -> dict[str, Any]:
    out = fill(schema, intent, context)
    return out if isinstance(out, dict) else {}


def llm_prompt(
    intent: str, constraints: list[str], schema: Mapping[str, Any], context: Mapping[str, Any]
) -> str:
    rules = {
        "must_include_cta": "include a call to action that starts with a verb such as 'Start' or 'Try'",
        "avoid_price_mention": "never mention prices, costs, currencies or discounts",
    }
    lines = [
        f"Intent: {_words(intent)}.",
        *(f"Rule: {rules[c]}." for c in constraints),
        f"Context: {json.dumps(context, sort_keys=True)}",
        f"Answer with one JSON object that follows this JSON Schema: {json.dumps(schema, sort_keys=True)}",
    ]
    return "\n".join(lines)
