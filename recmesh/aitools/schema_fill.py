"""A value for a JSON Schema (draft 2020-12), built from the schema's own
constraints: the generator under the action template filler (actions.py).

For each subschema the filler lists candidate values, best first, and keeps
the first one the subschema itself accepts (jsonschema, with its format
checker), so every value it returns validates by construction; the caller
validates the whole output once more anyway. Candidates, in order:

- values the caller suggests for the property (`Suggest`: context values and
  the template's text), fitted to `minLength` / `maxLength` when the string has
  no `pattern` or `format`;
- `const`, or the `enum` members in order;
- for strings, an example of the `format` (uri, uri-reference, email, date,
  date-time, time, uuid, hostname, ipv4, ipv6, …) and a string generated from
  the `pattern` (regex_example.py) within the length bounds;
- for numbers, the context's value, else zero when the bounds allow it, else
  the bound nearest zero walking inward (`minimum` / `maximum`, exclusive
  ones), on the grid of `multipleOf`;
- objects: the required properties, then the other declared ones while
  `maxProperties` allows (an optional property it cannot fill is left out),
  names to reach `minProperties` (`patternProperties`, `propertyNames`,
  `additionalProperties`), `dependentRequired`;
- arrays: `prefixItems`, then `items` up to `minItems` (at least one unless
  `maxItems` is 0), the first items made to satisfy `contains`, distinct items
  under `uniqueItems`;
- `type` unions in the order given, `null` last; `$ref` (inside the schema),
  `allOf` merged, `anyOf` / `oneOf` branch by branch, `if` / `then` / `else`.

A string made up only to satisfy a `format` or `pattern` (or none of the
caller's suggestions fitting) is a placeholder: its JSON pointer is reported,
so the response can say so. When no candidate fits, `Unfillable` names the
keyword that cannot be met and where. Work is bounded: strings of at most
4,096 characters and 1,000,000 in all, arrays and extra properties of at most
100, 20,000 candidate values considered per output, 32 nested levels (the
outermost array asking for many items is named when a bound is reached).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from recmesh.aitools.regex_example import MAX_LENGTH, NoExample, example

MAX_WORK = 20_000  # candidate values considered and values built, per output
MAX_CHARS = 1_000_000  # characters of the strings in one output
MAX_DEPTH = 32
MAX_ITEMS = 100
NUMBER_TRIES = 200

# (value, is_placeholder), best first, for a property (its name, a JSON type and
# its schema with `$ref` / `allOf` merged in).
Suggest = Callable[[str, str, Mapping[str, Any]], list[tuple[Any, bool]]]

PLACEHOLDER_URL = "https://example.com/start"
# Examples of each format, the n-th distinct one for n = 0, 1, ... (None: no more).
FORMAT_EXAMPLES: dict[str, Callable[[int], str | None]] = {
    "uri": lambda n: PLACEHOLDER_URL + (f"/{n}" if n else ""),
    "iri": lambda n: PLACEHOLDER_URL + (f"/{n}" if n else ""),
    "uri-reference": lambda n: (PLACEHOLDER_URL, "/start")[n] if n < 2 else f"/start/{n}",
    "iri-reference": lambda n: (PLACEHOLDER_URL, "/start")[n] if n < 2 else f"/start/{n}",
    "uri-template": lambda n: f"https://example.com/{{id}}/{n}" if n else "https://example.com/{id}",
    "email": lambda n: f"user{n or ''}@example.com",
    "idn-email": lambda n: f"user{n or ''}@example.com",
    "date": lambda n: (date(2026, 1, 1) + timedelta(days=n)).isoformat() if n < 10_000 else None,
    "date-time": lambda n: f"{datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=n):%Y-%m-%dT%H:%M:%SZ}",
    "time": lambda n: f"{n // 60 % 24:02d}:{n % 60:02d}:00Z" if n < 1440 else None,
    "duration": lambda n: f"P{n + 1}D",
    "uuid": lambda n: f"00000000-0000-4000-8000-{n:012d}",
    "hostname": lambda n: f"host{n}.example.com" if n else "example.com",
    "idn-hostname": lambda n: f"host{n}.example.com" if n else "example.com",
    "ipv4": lambda n: f"192.0.2.{n + 1}" if n < 254 else None,
    "ipv6": lambda n: f"2001:db8::{n + 1:x}",
    "json-pointer": lambda n: f"/start/{n}" if n else "/start",
    "relative-json-pointer": str,
    "regex": lambda n: f".{{{n}}}" if n else ".*",
}
_OBJECT_KEYS = ("properties", "required", "additionalProperties", "patternProperties", "minProperties",
                "maxProperties", "propertyNames", "dependentRequired", "dependentSchemas")  # fmt: skip
_ARRAY_KEYS = ("items", "prefixItems", "minItems", "maxItems", "contains", "uniqueItems")
_STRING_KEYS = ("pattern", "format", "minLength", "maxLength")
_NUMBER_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties", "minContains")
_UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties", "maxContains")


class Unfillable(Exception):
    """No value the filler can build meets `keyword` at `path` (a JSON pointer into the output)."""

    def __init__(self, keyword: str, path: str, reason: str) -> None:
        super().__init__(f"cannot meet `{keyword}` at {path or '/'}: {reason}")
        self.keyword = keyword
        self.path = path
        self.reason = reason


class _OverBudget(Unfillable):
    """The work bound was reached: not worth trying another branch or variant."""


@dataclass
class Filled:
    value: Any
    placeholders: list[str] = field(default_factory=list)  # JSON pointers of made-up strings
    # An object or array built for the variant asked (see _Filler._first).
    varied: bool = field(default=False, compare=False)


def _pointer(path: str, key: str | int) -> str:
    return f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _key(value: Any) -> str | None:
    """A value's identity for telling candidates apart; None when JSON cannot
    carry it as UTF-8 (a lone surrogate, a non-finite number)."""
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False).encode().decode()
    except (ValueError, UnicodeEncodeError):
        return None


def merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """`a` and `b` as one schema, for generation only (candidates are still checked
    against the original): bounds tighten, `required` unites, `type` intersects,
    nested schemas combine under `allOf`; otherwise the first one's value wins."""
    out = dict(a)
    for key, value in b.items():
        if key not in out:
            out[key] = value
        elif key in _LOWER_BOUNDS and _number(value) and _number(out[key]):
            out[key] = max(out[key], value)
        elif key in _UPPER_BOUNDS and _number(value) and _number(out[key]):
            out[key] = min(out[key], value)
        elif key == "required":
            out[key] = [*out[key], *(r for r in value if r not in out[key])]
        elif key == "type":
            mine = [out[key]] if isinstance(out[key], str) else list(out[key])
            theirs = [value] if isinstance(value, str) else list(value)
            both = [t for t in mine if t in theirs or (t == "integer" and "number" in theirs)]
            both += [t for t in theirs if t == "integer" and "number" in mine and t not in both]
            out[key] = both
        elif key in ("properties", "patternProperties", "dependentSchemas"):
            props = dict(out[key])
            for name, sub in value.items():
                props[name] = {"allOf": [props[name], sub]} if name in props else sub
            out[key] = props
        elif key in ("items", "contains", "additionalProperties", "propertyNames", "not"):
            out[key] = {"allOf": [out[key], value]}
    return out


class _Filler:
    def __init__(self, root: Mapping[str, Any], suggest: Suggest) -> None:
        resource = DRAFT202012.create_resource(root)
        registry: Registry[Any] = Registry().with_resource(resource.id() or "", resource)
        self._resolver = registry.resolver(base_uri=resource.id() or "")
        # Draft 2020-12's checker: a bare FormatChecker() checks `time` as draft 3 did.
        checker = Draft202012Validator.FORMAT_CHECKER
        self._validator = Draft202012Validator(root, registry=registry, format_checker=checker)
        self._checked_formats = set(checker.checkers)
        self._suggest = suggest
        self._expanding: list[str] = ["#"]  # the `$ref`s being filled, outermost first
        self._work = 0
        self._chars = 0
        # (schema id, value) -> (schema, errors): variants ask for the same checks
        # again; holding the schema keeps its id from being reused.
        self._verdicts: dict[tuple[int, str], tuple[Any, list[ValidationError]]] = {}

    # --- checking -----------------------------------------------------------

    def _spend(self, path: str, keyword: str, chars: int = 0) -> None:
        self._work += 1
        self._chars += chars
        if self._work > MAX_WORK:
            raise _OverBudget(keyword, path, f"building it takes more than {MAX_WORK:,} values")
        if self._chars > MAX_CHARS:
            raise _OverBudget(keyword, path, f"its strings take more than {MAX_CHARS:,} characters")

    def _errors(self, schema: Any, value: Any) -> list[ValidationError]:
        key = (id(schema), _key(value) or "")
        if key not in self._verdicts:
            self._verdicts[key] = (schema, list(self._validator.evolve(schema=schema).iter_errors(value)))
        return self._verdicts[key][1]

    def _first(
        self, schema: Any, path: str, candidates: Iterator[Filled], variant: int, keyword: str
    ) -> Filled:
        """The variant-th distinct candidate the schema accepts (an object or array
        built for the variant counts as it); else the keyword the first refused one
        broke."""
        refused: list[ValidationError] = []
        accepted: set[str] = set()
        unencodable = False
        for candidate in candidates:
            self._spend(path, keyword)
            key = _key(candidate.value)
            unencodable = unencodable or key is None
            if key is None or key in accepted:
                continue
            errors = self._errors(schema, candidate.value)
            if not errors:
                if len(accepted) == variant or candidate.varied:
                    if isinstance(candidate.value, str):
                        self._spend(path, "maxLength", len(candidate.value))
                    return candidate
                accepted.add(key)
            elif not refused:
                refused = errors
        if variant and accepted:
            raise Unfillable(keyword, path, f"only {len(accepted)} distinct values found")
        if unencodable and not refused:
            given = next((k for k in ("const", "enum") if isinstance(schema, dict) and k in schema), keyword)
            raise Unfillable(given, path, "JSON cannot carry its value as UTF-8 (a lone surrogate)")
        if refused:
            err = best_match(refused)
            assert err is not None
            where = "".join(_pointer("", p) for p in err.absolute_path)
            raise Unfillable(str(err.validator), path + where, err.message)
        raise Unfillable(keyword, path, "no value the filler can build")

    # --- schemas --------------------------------------------------------------

    def _flatten(self, schema: Mapping[str, Any], path: str, depth: int) -> dict[str, Any]:
        """`$ref`s followed and `allOf`s merged into one schema for generation."""
        if depth > MAX_DEPTH:
            raise Unfillable("$ref", path, f"references nest deeper than {MAX_DEPTH}")
        out = {k: v for k, v in schema.items() if k not in ("$ref", "$dynamicRef", "allOf")}
        for key in ("$ref", "$dynamicRef"):
            if key in schema:
                try:
                    target = self._resolver.lookup(schema[key]).contents
                except Unresolvable:
                    raise Unfillable(key, path, f"{schema[key]!r} cannot be resolved") from None
                out = merge(out, self._flatten_any(target, path, depth + 1, key))
        for sub in schema.get("allOf", []):
            out = merge(out, self._flatten_any(sub, path, depth + 1, "allOf"))
        return out

    def _flatten_any(self, schema: Any, path: str, depth: int, via: str) -> dict[str, Any]:
        if schema is True:
            return {}
        if schema is False:
            raise Unfillable(via, path, "a `false` schema allows no value")
        return self._flatten(schema, path, depth)

    def value(self, schema: Any, path: str, name: str, depth: int, variant: int = 0, via: str = "") -> Filled:
        if depth > MAX_DEPTH:
            raise Unfillable(via or "properties", path, f"schemas nest deeper than {MAX_DEPTH}")
        if schema is False:
            raise Unfillable(via or "false", path, "a `false` schema allows no value")
        if schema is True:
            schema = {}
        flat = self._flatten(schema, path, depth)
        for key in ("anyOf", "oneOf"):
            if key in flat:
                rest = {k: v for k, v in flat.items() if k != key}
                merged = [merge(rest, b) if isinstance(b, dict) else b for b in flat[key]]
                # Each branch's first value, then each one's second, ... as variants need.
                branches = (self._branch(b, path, name, depth, v) for v in range(variant + 1) for b in merged)
                return self._first(schema, path, (f for f in branches if f is not None), variant, key)
        if "if" in flat:
            rest = {k: v for k, v in flat.items() if k not in ("if", "then", "else")}
            options = []
            if isinstance(flat["if"], dict) and isinstance(flat.get("then", {}), dict):
                options.append(merge(merge(rest, flat["if"]), flat.get("then", {})))
            if isinstance(flat.get("else", {}), dict):
                options.append(merge(rest, flat.get("else", {})))
            tries = (self._branch(o, path, name, depth) for o in options)
            return self._first(schema, path, (f for f in tries if f is not None), variant, "if")
        refs = [schema[k] for k in ("$ref", "$dynamicRef") if isinstance(schema.get(k), str)]
        self._expanding += refs
        try:
            candidates = self._candidates(flat, path, name, depth, variant)
            return self._first(schema, path, candidates, variant, "type")
        finally:
            del self._expanding[len(self._expanding) - len(refs) :]

    def _branch(self, schema: Any, path: str, name: str, depth: int, variant: int = 0) -> Filled | None:
        try:
            found = self.value(schema, path, name, depth + 1, variant)
        except _OverBudget:
            raise
        except Unfillable:
            return None
        return Filled(found.value, found.placeholders)  # a plain candidate of the branching schema

    def _types(self, flat: Mapping[str, Any]) -> list[str]:
        kind = flat.get("type")
        if isinstance(kind, str):
            return [kind]
        if isinstance(kind, list):
            return [k for k in kind if k != "null"] + (["null"] if "null" in kind else [])
        inferred = [t for t, keys in (("object", _OBJECT_KEYS), ("array", _ARRAY_KEYS),
                                      ("string", _STRING_KEYS), ("number", _NUMBER_KEYS))
                    if any(k in flat for k in keys)]  # fmt: skip
        return inferred or ["string", "integer", "boolean", "null", "object", "array"]

    def _candidates(
        self, flat: Mapping[str, Any], path: str, name: str, depth: int, variant: int
    ) -> Iterator[Filled]:
        if "const" in flat:
            yield Filled(flat["const"])
            return
        types = self._types(flat)
        if "enum" in flat:
            if not flat["enum"]:
                raise Unfillable("enum", path, "the enum is empty")
            for kind in types:
                yield from (Filled(v) for v, _ in self._suggest(name, kind, flat) if v in flat["enum"])
            yield from (Filled(v) for v in flat["enum"])
            return
        # A variant is the variant-th distinct value accepted (see _first); objects
        # and arrays are built for the variant, varying their first member.
        for kind in types:
            if kind == "object":
                yield self._object(flat, path, depth, variant)
            elif kind == "array":
                yield self._array(flat, path, name, depth, variant)
            elif kind == "string":
                yield from self._strings(flat, path, name, variant)
            elif kind in ("integer", "number"):
                yield from self._numbers(flat, path, name, kind)
            elif kind == "boolean":
                yield from (Filled(v) for v, _ in self._suggest(name, "boolean", flat) if isinstance(v, bool))
                yield from (Filled(True), Filled(False))
            elif kind == "null":
                yield Filled(None)

    # --- strings --------------------------------------------------------------

    def _strings(self, flat: Mapping[str, Any], path: str, name: str, variant: int) -> Iterator[Filled]:
        lo = int(flat.get("minLength", 0))
        hi = flat.get("maxLength")
        self._check_lengths(lo, hi, path)
        pattern, fmt = flat.get("pattern"), flat.get("format")
        known = fmt in FORMAT_EXAMPLES  # others are annotations: any string will do
        free = pattern is None and not known
        upper = None if hi is None else int(hi)

        def fitted(text: str) -> str:
            if hi is not None:
                text = text[: int(hi)].rstrip()
            return text.ljust(lo, ".")

        # The template's text only where the schema check can tell a bad one.
        trusted = not known or fmt in self._checked_formats
        suggested = [
            (t, ph) for t, ph in self._suggest(name, "string", flat) if isinstance(t, str) and trusted
        ]
        yield from self._suggested_strings(suggested, path, free, fitted, variant)
        yield from self._format_strings(fmt, path, variant)
        if pattern is not None:
            yield from self._pattern_strings(pattern, lo, upper, path, variant)
        if free and not suggested:
            for n in range(variant + 3):
                yield self._string(fitted(f"value {n + 1}" if n else "value"), path, True)

    @staticmethod
    def _check_lengths(lo: int, hi: Any, path: str) -> None:
        if lo > MAX_LENGTH:
            raise Unfillable("minLength", path, f"asks for {lo} characters; at most {MAX_LENGTH} are written")
        if hi is not None and lo > hi:
            raise Unfillable("minLength", path, f"minLength {lo} is above maxLength {hi}")

    def _suggested_strings(
        self,
        suggested: list[tuple[str, bool]],
        path: str,
        free: bool,
        fitted: Callable[[str], str],
        variant: int,
    ) -> Iterator[Filled]:
        """The template's texts, also fitted to the length bounds (and numbered) when the string is free."""
        for text, placeholder in suggested:
            yield self._string(text, path, placeholder)
            if free:
                yield self._string(fitted(text), path, placeholder)
        if free and suggested:  # more variants of the template's text
            text, placeholder = suggested[0]
            for n in range(1, variant + 3):
                yield self._string(fitted(f"{text} {n + 1}"), path, placeholder)

    def _format_strings(self, fmt: Any, path: str, variant: int) -> Iterator[Filled]:
        examples = FORMAT_EXAMPLES.get(str(fmt))
        for n in range(variant + 3 if examples else 0):
            made = examples(n) if examples else None
            if made is not None:
                yield self._string(made, path, True)

    def _pattern_strings(
        self, pattern: str, lo: int, upper: int | None, path: str, variant: int
    ) -> Iterator[Filled]:
        for n in range(variant + 3):
            try:
                yield self._string(example(pattern, lo, upper, n), path, True)
            except NoExample as err:
                if n == 0:
                    raise Unfillable("pattern", path, str(err)) from None
                return  # no further variant

    @staticmethod
    def _string(text: str, path: str, placeholder: bool) -> Filled:
        return Filled(text, [path] if placeholder else [])

    # --- numbers --------------------------------------------------------------

    def _numbers(self, flat: Mapping[str, Any], path: str, name: str, kind: str) -> Iterator[Filled]:
        for value, _ in self._suggest(name, kind, flat):
            if _number(value) and math.isfinite(value):
                yield Filled(int(value) if kind == "integer" and float(value).is_integer() else value)
        step = flat.get("multipleOf")
        lo = max((flat[k] for k in ("minimum", "exclusiveMinimum") if _number(flat.get(k))), default=None)
        hi = min((flat[k] for k in ("maximum", "exclusiveMaximum") if _number(flat.get(k))), default=None)
        if any(b is not None and not math.isfinite(b) for b in (lo, hi, step)):
            return
        if lo is not None and hi is not None and lo > hi:
            low = "exclusiveMinimum" if flat.get("exclusiveMinimum") == lo else "minimum"
            raise Unfillable(low, path, f"the lower bound {lo} is above the upper bound {hi}")
        for v in self._number_values(kind, path, lo, hi, step):
            if not math.isfinite(v):
                continue
            if kind == "number":
                yield Filled(v)
            elif float(v).is_integer():
                yield Filled(int(v))

    def _number_values(self, kind: str, path: str, lo: Any, hi: Any, step: Any) -> Iterator[float]:
        """Numbers to try within finite, consistent bounds (the schema check drops what misses)."""
        # Zero when the bounds allow it (it is a multiple of anything), else the
        # bound nearest zero, walking inward.
        start, direction = 0.0, 1
        if lo is not None and lo > 0:
            start = float(lo)
        elif hi is not None and hi < 0:
            start, direction = float(hi), -1
        if step:
            if not math.isfinite(start / step):
                return iter(())
            if lo is not None and hi is not None and math.ceil(lo / step) * step > hi:
                raise Unfillable("multipleOf", path, f"no multiple of {step} lies in [{lo}, {hi}]")
            k = math.floor(start / step) if direction < 0 else math.ceil(start / step)
            return ((k + direction * i) * step for i in range(NUMBER_TRIES))
        if kind == "integer":
            first = math.floor(start) if direction < 0 else math.ceil(start)
            return (float(first + direction * i) for i in range(NUMBER_TRIES))
        return self._reals(start, direction, lo, hi)

    @staticmethod
    def _reals(start: float, direction: int, lo: Any, hi: Any) -> Iterator[float]:
        yield start
        if lo is not None and hi is not None:
            yield (lo + hi) / 2  # inside a narrow (open) interval
        for i in range(1, NUMBER_TRIES):
            yield start + direction * i

    # --- objects --------------------------------------------------------------

    def _property_schema(self, flat: Mapping[str, Any], key: str, path: str) -> Any:
        subs: list[Any] = []
        if key in flat.get("properties", {}):
            subs.append(flat["properties"][key])
        subs += [s for p, s in flat.get("patternProperties", {}).items() if _search(p, key)]
        if not subs:
            extra = flat.get("additionalProperties", True)
            if extra is False:
                why = f"{key!r} is required but additional properties are not allowed"
                raise Unfillable("additionalProperties", _pointer(path, key), why)
            subs.append(extra)
        return subs[0] if len(subs) == 1 else {"allOf": subs}

    def _object(self, flat: Mapping[str, Any], path: str, depth: int, variant: int) -> Filled:
        props: Mapping[str, Any] = flat.get("properties", {})
        required = [r for r in flat.get("required", []) if isinstance(r, str)]
        most = flat.get("maxProperties", math.inf)
        if len(required) > most:
            why = f"{len(required)} properties are required, at most {most}"
            raise Unfillable("maxProperties", path, why)
        out: dict[str, Any] = {}
        placeholders: list[str] = []
        names = flat.get("propertyNames")

        def add(key: str, optional: bool) -> None:
            if optional and self._recurses(props.get(key)):
                return  # an optional recursion (a linked list's next) stops at once
            if names is not None and self._errors(names, key):
                if optional:
                    return
                raise Unfillable("propertyNames", _pointer(path, key), f"{key!r} is not an allowed name")
            try:
                sub = self._property_schema(flat, key, path)
                filled = self.value(sub, _pointer(path, key), key, depth + 1, 0 if out else variant)
            except _OverBudget:
                raise
            except Unfillable:
                if optional:
                    return
                raise
            out[key] = filled.value
            placeholders.extend(filled.placeholders)

        for key in required:
            if key not in out:
                add(key, optional=False)
        for key in props:
            if key not in out and len(out) < most:
                add(key, optional=True)
        self._dependencies(flat, out, add)
        least = flat.get("minProperties", 0)
        if least > MAX_ITEMS:
            raise Unfillable("minProperties", path, f"asks for {least} properties; at most {MAX_ITEMS}")
        patterns = list(flat.get("patternProperties", {}))
        n = 0
        while len(out) < least and n < least + 20:
            extra = self._extra_name(patterns, n)
            n += 1
            if extra is not None and extra not in out:
                add(extra, optional=True)
        return Filled(out, placeholders, varied=True)

    def _recurses(self, schema: Any) -> bool:
        """A reference to a schema being filled further out."""
        return isinstance(schema, dict) and schema.get("$ref") in self._expanding

    @staticmethod
    def _dependencies(flat: Mapping[str, Any], out: dict[str, Any], add: Callable[[str, bool], None]) -> None:
        for key, needs in flat.get("dependentRequired", {}).items():
            if key in out:
                for need in needs:
                    if need not in out:
                        add(need, False)

    @staticmethod
    def _extra_name(patterns: list[str], n: int) -> str | None:
        """The n-th name tried to reach minProperties: from patternProperties first."""
        if n < len(patterns):
            try:
                return example(patterns[n], 1, 40)
            except NoExample:
                return None
        return f"extra_{n + 1 - len(patterns)}"

    # --- arrays ---------------------------------------------------------------

    def _array(self, flat: Mapping[str, Any], path: str, name: str, depth: int, variant: int) -> Filled:
        prefix: list[Any] = list(flat.get("prefixItems", []))
        items = flat.get("items", {})
        least = int(flat.get("minItems", 0))
        most = flat.get("maxItems", math.inf)
        if least > MAX_ITEMS:
            raise Unfillable("minItems", path, f"asks for {least} items; at most {MAX_ITEMS} are written")
        # One item at least (a sample of what the array holds), unless the items
        # recurse into a schema being filled (a tree's children stop here).
        count = int(min(max(least, len(prefix), 0 if self._recurses(items) else 1), most))
        if items is False and count > len(prefix):
            raise Unfillable("items", path, f"needs {count} items but allows {len(prefix)}")
        contains = flat.get("contains")
        holding = int(flat.get("minContains", 1)) if contains is not None else 0
        count = max(count, min(holding, int(min(most, MAX_ITEMS))))
        unique = bool(flat.get("uniqueItems"))
        out: list[Any] = []
        placeholders: list[str] = []
        for i in range(count):
            sub = prefix[i] if i < len(prefix) else items
            if i < holding:
                sub = {"allOf": [sub, contains]}
            where = _pointer(path, i)
            via = "prefixItems" if i < len(prefix) else "items"
            try:
                if not unique:
                    filled = self.value(sub, where, name, depth + 1, variant if i == 0 else 0, via)
                else:
                    filled = self._distinct(sub, where, name, depth, i + (variant if i == 0 else 0), via, out)
            except _OverBudget as over:
                if least > 1:  # the outermost array that asks for many items is the one to name
                    raise _OverBudget("minItems", path, over.reason) from None
                raise
            out.append(filled.value)
            placeholders.extend(filled.placeholders)
        return Filled(out, placeholders, varied=True)

    def _distinct(
        self, sub: Any, where: str, name: str, depth: int, first: int, via: str, taken: list[Any]
    ) -> Filled:
        """An item unlike those taken: its variant `first` (the i-th distinct value), then others."""
        seen = {_key(t) for t in taken}
        for n, v in enumerate([*range(first, first + 5), *range(first)]):
            try:
                filled = self.value(sub, where, name, depth + 1, v, via)
            except _OverBudget:
                raise
            except Unfillable:
                if n == 0 and v == 0:
                    raise
                continue
            if _key(filled.value) not in seen:
                return filled
        raise Unfillable("uniqueItems", where, f"no value unlike the {len(taken)} before it")


def _search(pattern: str, text: str) -> bool:
    return re.search(pattern, text) is not None


def fill(schema: Mapping[str, Any], suggest: Suggest) -> Filled:
    """A value that validates against `schema` (with format checks), and the
    pointers of the placeholder strings in it; `Unfillable` when none is found."""
    return _Filler(schema, suggest).value(schema, "", "", 0)
