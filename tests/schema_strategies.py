"""Random action output schemas for property tests, valid draft 2020-12 with
an object at the root, drawn with plain hypothesis strategies: the leaf
schemas (where the constraints are) from six flat families (string, number,
type union, boolean / null, enum, const), which objects and arrays nest.

They cover what the template filler must handle: strings with `pattern` (a
curated list, some impossible, and random regular expressions), `format`,
`minLength` / `maxLength`; integers and numbers with inclusive and exclusive
bounds and `multipleOf`; `enum`, `const`, type unions, `anyOf` / `oneOf` /
`allOf`; objects with `properties`, `required` (sometimes naming undeclared
properties), `additionalProperties`, `minProperties` / `maxProperties`; arrays
with `items`, `prefixItems`, `minItems` / `maxItems`, `uniqueItems`,
`contains`. Nested three levels deep. Bounds are drawn independently, so
contradictory schemas (minLength above maxLength, a multipleOf with no
multiple in range) come up too: those must be a 422.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from hypothesis import strategies as st

NAMES = ["text", "url", "title", "code", "email", "count", "tags", "when", "id", "a", "b"]
FORMATS = ["uri", "uri-reference", "email", "date", "date-time", "uuid", "time", "ipv4", "ipv6",
           "hostname", "x-custom"]  # fmt: skip
PATTERNS = [
    "^/", "^[0-9]{6}$", "^[a-z]+(-[a-z]+)*$", "^https://", r"^\d{3}-\d{4}$", "[A-Z]{2,4}",
    r"^(a|bc)+\1$", "^.{3}$", r"\bgo\b", "^[^@]+@[^@]+$", "(?=x)y", "^$", "^(?:[a-f0-9]{2}:){2}[a-f0-9]{2}$",
    "(?i)^start", "^[\u4e00-\u9fff]{2}$",
]  # fmt: skip
TYPES = ["string", "integer", "number", "boolean", "null"]


def _compiles(pattern: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # "possible nested set": dropped too
        try:
            re.compile(pattern)
        except (re.error, FutureWarning):
            return False
    return True


# Random regular expressions: one to three fragments, each `.`, a character class, or a
# fragment repeated (`+`, `?`, `*`). The class is drawn without fullmatch, so arbitrary
# text (any code point, newlines, regex syntax) comes with it; what does not compile is dropped.
_REGEXES: st.SearchStrategy[str] = st.deferred(
    lambda: (
        st.lists(
            st.one_of(
                st.just("."),
                st.from_regex(r"\[\^?[A-Za-z0-9]+\]"),
                _REGEXES.map("{}+".format),
                _REGEXES.map("{}?".format),
                _REGEXES.map("{}*".format),
            ),
            min_size=1,
            max_size=3,
        )
        .map("".join)
        .filter(_compiles)
    )
)

_small_int = st.integers(0, 12)
# JSON numbers in [-50, 50] (floats; -0.0 as 0.0)
_bound = st.floats(-50, 50, allow_nan=False).map(lambda n: n or 0.0)
_scalar = st.one_of(st.text(max_size=8), st.integers(-5, 5), st.booleans(), st.none())


def _closed(
    kind: st.SearchStrategy[Any], **optional: st.SearchStrategy[Any]
) -> st.SearchStrategy[dict[str, Any]]:
    """`{"type": kind}` and any of the `optional` keywords, nothing else."""
    return st.fixed_dictionaries({"type": kind}, optional=optional)


STRING = _closed(
    st.just("string"),
    minLength=_small_int,
    maxLength=st.integers(0, 30),
    pattern=st.one_of(st.sampled_from(PATTERNS), _REGEXES),
    format=st.sampled_from(FORMATS),
)
NUMBER = _closed(
    st.sampled_from(["integer", "number"]),
    minimum=_bound,
    maximum=_bound,
    exclusiveMinimum=_bound,
    exclusiveMaximum=_bound,
    multipleOf=st.sampled_from([1, 2, 3, 5, 0.5, 0.25, 2.5]),
)
UNION = _closed(
    st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True),
    minLength=_small_int,
    minimum=_bound,
    maximum=_bound,
)
BOOLEAN_OR_NULL = _closed(st.sampled_from(["boolean", "null"]))
ENUM = st.fixed_dictionaries({"enum": st.lists(_scalar, max_size=4)})
CONST = st.fixed_dictionaries({"const": _scalar})


def _scalars() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(STRING, NUMBER, UNION, BOOLEAN_OR_NULL, ENUM, CONST)


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
