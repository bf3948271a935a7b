"""Random action output schemas for property tests, valid draft 2020-12 with
an object at the root. hypothesis-jsonschema's `from_schema` draws the leaf
schemas (where the constraints are) from small meta-schemas written here;
objects and arrays nest them with plain hypothesis strategies, because
`from_schema` over one nested meta-schema took about 10 s per draw here.

The meta-schema covers what the template filler must handle: strings with
`pattern` (a curated list, some impossible, and hypothesis-jsonschema's own
random regular expressions), `format`, `minLength` / `maxLength`; integers and
numbers with inclusive and exclusive bounds and `multipleOf`; `enum`, `const`,
type unions, `anyOf` / `oneOf` / `allOf`; objects with `properties`,
`required` (sometimes naming undeclared properties), `additionalProperties`,
`minProperties` / `maxProperties`; arrays with `items`, `prefixItems`,
`minItems` / `maxItems`, `uniqueItems`, `contains`. Nested three levels deep.
Bounds are
drawn independently, so contradictory schemas (minLength above maxLength, a
multipleOf with no multiple in range) come up too: those must be a 422.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

NAMES = ["text", "url", "title", "code", "email", "count", "tags", "when", "id", "a", "b"]
FORMATS = ["uri", "uri-reference", "email", "date", "date-time", "uuid", "time", "ipv4", "ipv6",
           "hostname", "x-custom"]  # fmt: skip
PATTERNS = [
    "^/", "^[0-9]{6}$", "^[a-z]+(-[a-z]+)*$", "^https://", r"^\d{3}-\d{4}$", "[A-Z]{2,4}",
    r"^(a|bc)+\1$", "^.{3}$", r"\bgo\b", "^[^@]+@[^@]+$", "(?=x)y", "^$", "^(?:[a-f0-9]{2}:){2}[a-f0-9]{2}$",
    "(?i)^start", "^[\u4e00-\u9fff]{2}$",
]  # fmt: skip
TYPES = ["string", "integer", "number", "boolean", "null"]

_small_int = {"type": "integer", "minimum": 0, "maximum": 12}
_bound = {"type": "number", "minimum": -50, "maximum": 50}
_scalar = {
    "anyOf": [
        {"type": "string", "maxLength": 8},
        {"type": "integer", "minimum": -5, "maximum": 5},
        {"type": "boolean"},
        {"type": "null"},
    ]
}


def _closed(props: dict[str, Any], kind: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"type": kind, **props}, "required": ["type"],
            "additionalProperties": False}  # fmt: skip


STRING = _closed(
    {
        "minLength": _small_int,
        "maxLength": {"type": "integer", "minimum": 0, "maximum": 30},
        "pattern": {"anyOf": [{"enum": PATTERNS}, {"type": "string", "format": "regex"}]},
        "format": {"enum": FORMATS},
    },
    {"const": "string"},
)
NUMBER = _closed(
    {
        "minimum": _bound,
        "maximum": _bound,
        "exclusiveMinimum": _bound,
        "exclusiveMaximum": _bound,
        "multipleOf": {"enum": [1, 2, 3, 5, 0.5, 0.25, 2.5]},
    },
    {"enum": ["integer", "number"]},
)
UNION = _closed(
    {"minLength": _small_int, "minimum": _bound, "maximum": _bound},
    {"type": "array", "items": {"enum": TYPES}, "minItems": 1, "maxItems": 3, "uniqueItems": True},
)
BOOLEAN_OR_NULL = _closed({}, {"enum": ["boolean", "null"]})
ENUM = {"type": "object", "properties": {"enum": {"type": "array", "items": _scalar, "maxItems": 4}},
        "required": ["enum"], "additionalProperties": False}  # fmt: skip
CONST = {
    "type": "object",
    "properties": {"const": _scalar},
    "required": ["const"],
    "additionalProperties": False,
}


def _scalars() -> st.SearchStrategy[dict[str, Any]]:
    metas: list[dict[str, Any]] = [STRING, NUMBER, UNION, BOOLEAN_OR_NULL, ENUM, CONST]
    return st.one_of(*(from_schema(m) for m in metas))


def _leaves() -> st.SearchStrategy[dict[str, Any]]:
    combos = st.builds(
        lambda key, subs: {key: subs},
        st.sampled_from(["anyOf", "oneOf", "allOf"]),
        st.lists(_scalars(), min_size=1, max_size=3),
    )
    return st.one_of(_scalars(), combos)


def _objects(child: st.SearchStrategy[Any], root: bool = False) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"type": st.just("object")},
        optional={
            "properties": st.dictionaries(st.sampled_from(NAMES), child, max_size=4),
            "required": st.lists(st.sampled_from(NAMES), max_size=3, unique=True),
            "additionalProperties": st.one_of(st.booleans(), child),
            "minProperties": st.integers(0, 4),
            "maxProperties": st.integers(1 if root else 0, 6),
        },
    )


def _arrays(child: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"type": st.just("array")},
        optional={
            "items": child,
            "prefixItems": st.lists(child, min_size=1, max_size=2),
            "minItems": st.integers(0, 5),
            "maxItems": st.integers(0, 6),
            "uniqueItems": st.booleans(),
            "contains": child,
        },
    )


def _roots() -> st.SearchStrategy[dict[str, Any]]:
    leaf = _leaves()
    level1 = st.one_of(leaf, _objects(leaf), _arrays(leaf))
    level2 = st.one_of(leaf, _objects(level1), _arrays(level1))
    return _objects(level2, root=True)


_ROOTS = _roots()


@st.composite
def output_schemas(draw: st.DrawFn) -> dict[str, Any]:
    """Valid draft 2020-12 schemas with an object at the root. (A composite, so the
    strategy's repr, which hypothesis builds when a draw is discarded, is short:
    spelling out every meta-schema takes 34 kB, a warning, and most of the time.)"""
    return draw(_ROOTS)
