"""Structured actions (the design notes' prompt schema): an `intent`, named
`constraints`, an `output_schema` (JSON Schema) and a `context`.

- `check_request` refuses a schema that is not valid JSON Schema, whose root
  is not an object, or with a `$ref` that does not resolve inside it.
- `violations` validates an output against the schema (jsonschema, with its
  format checker) and checks every constraint; an empty list means the output
  may be served. Each schema problem names its keyword.
- `template_fill` is the deterministic generator used without an LLM: it fills
  each property from the context, the intent and fixed templates where the
  schema accepts those, and otherwise builds values from the schema's own
  constraints (schema_fill.py: pattern, format, enum, const, lengths, numeric
  bounds, nested objects and arrays), reporting which strings are placeholders;
  `Unfillable` names the keyword it cannot meet. It is also the documented
  fallback when an LLM's output fails twice.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from recmesh.aitools.schema_fill import PLACEHOLDER_URL, Filled, Unfillable, fill
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
    resource = DRAFT202012.create_resource(schema)
    resolver = Registry().with_resource(resource.id() or "", resource).resolver(resource.id() or "")
    for ref in _refs(schema):
        try:
            resolver.lookup(ref)
        except Unresolvable:
            raise InvalidArgument(
                f"output_schema: $ref {ref!r} does not resolve; only references inside the schema do"
            ) from None


_DATA_KEYWORDS = ("const", "enum", "default", "examples")  # values, not schemas


def _refs(schema: Any) -> Iterator[str]:
    if isinstance(schema, Mapping):
        for key, value in schema.items():
            if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                yield value
            elif key not in _DATA_KEYWORDS:
                yield from _refs(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _refs(value)


def violations(output: Any, schema: Mapping[str, Any], constraints: list[str]) -> list[str]:
    """What keeps `output` from being served: schema errors (with the keyword
    broken, formats checked), broken constraints, and values JSON cannot carry."""
    try:
        json.dumps(output, ensure_ascii=False, allow_nan=False).encode()
    except (ValueError, UnicodeEncodeError) as err:
        return [f"output: not encodable as JSON: {err}"]
    # An explicit registry: jsonschema would otherwise fetch an unknown $ref over the network.
    validator = Draft202012Validator(
        schema, registry=Registry(), format_checker=Draft202012Validator.FORMAT_CHECKER
    )
    try:
        found = [
            f"schema:{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message} ({e.validator})"
            for e in validator.iter_errors(output)
        ]
    except Unresolvable as err:
        return [f"schema: $ref does not resolve: {err}"]
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


_URLISH = ("url", "link", "href", "uri")
_URL_FORMATS = ("uri", "iri", "url", "uri-reference", "iri-reference")
_TEXTISH = ("text", "label", "cta", "button", "action", "headline", "title")


def _path_of(url: str) -> str | None:
    """The path (with query and fragment) of an absolute URL, for relative-link fields."""
    parts = urlsplit(url)
    if not (parts.scheme and parts.netloc):
        return None
    tail = (f"?{parts.query}" if parts.query else "") + (f"#{parts.fragment}" if parts.fragment else "")
    return (parts.path or "/") + tail


def _suggestions(
    intent: str, context: Mapping[str, Any]
) -> Callable[[str, str, Mapping[str, Any]], list[tuple[Any, bool]]]:
    """What the template would write for a property, best first, as (value, is_placeholder):
    the context's value under the property's name; for a link, the context's URL
    (and its path, for a relative link), else a placeholder URL; for other text,
    a call to action built from the intent and the product. Prices are stripped."""

    def suggest(name: str, kind: str, schema: Mapping[str, Any]) -> list[tuple[Any, bool]]:
        own = context.get(name) if name else None
        if kind in ("integer", "number"):
            is_number = isinstance(own, int | float) and not isinstance(own, bool)
            return [(own, False)] if is_number else []
        if kind == "boolean":
            return [(own, False)] if isinstance(own, bool) else []
        if kind != "string":
            return []
        lname = name.lower()
        if schema.get("format") in _URL_FORMATS or any(k in lname for k in _URLISH):
            found: list[tuple[Any, bool]] = []
            for key in (name, "url", "landing_url"):
                url = context.get(key)
                if isinstance(url, str) and url:
                    found.append((url, False))
                    path = _path_of(url)
                    if path:
                        found.append((path, False))
            return [*found, (PLACEHOLDER_URL, True)]
        if isinstance(own, str):
            text = own
        elif any(k in lname for k in _TEXTISH):
            text = cta_text(intent, context)
        else:
            text = f"{cta_text(intent, context)}: {_words(intent)}"
        if mentions_price(text):
            text = _PRICE.sub("", text).strip() or cta_text(intent, {})
        return [(text, False)]

    return suggest


def template_fill(schema: Mapping[str, Any], intent: str, context: Mapping[str, Any]) -> Filled:
    """The template's output for `schema` and the JSON pointers of its placeholder
    strings; `Unfillable` names the keyword no value it can build meets."""
    filled = fill(schema, _suggestions(intent, context))
    if not isinstance(filled.value, dict):
        raise Unfillable("type", "", "the output must be an object")
    return filled


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
