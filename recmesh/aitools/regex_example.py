"""A string that matches a regular expression, for the action template filler.

JSON Schema's `pattern` is a search (unanchored) with the validator's regex
engine, Python's `re` here. The pattern is parsed with `re`'s own parser and
walked: literals, classes (`[...]`, `\\d`, `\\w`, `\\s`, negations), `.`, groups,
alternation, repeats (greedy, lazy, possessive), anchors and back-references
are generated; look-arounds and word boundaries are not, but the result is
always checked with `re.search`, so a string that does not match is never
returned: `NoExample` says why instead.

Lengths: the walk aims at a target length, handing each part of a sequence
its shortest form and then spreading the rest over the parts that can grow;
a result shorter than `min_len` is padded before or after, which keeps an
unanchored pattern matching.
"""

from __future__ import annotations

import functools
import importlib
import math
import re
from collections.abc import Iterator
from typing import Any

# `re._parser` (the former `sre_parse`) is the parser `re.compile` uses; importing
# `sre_parse` itself warns (deprecated) and typeshed has no stubs for either name.
_parser: Any = importlib.import_module("re._parser")
_c: Any = importlib.import_module("re._constants")

MAX_LENGTH = 4096
INF = math.inf
# Characters tried for a class or `.`, readable ones first; then the rest of the
# Basic Multilingual Plane below the surrogates (never a lone surrogate: it
# cannot be encoded as UTF-8 JSON).
_READABLE = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ-_./:@ "
_OTHERS = "".join(chr(c) for c in range(0xD800) if chr(c) not in _READABLE)
_ALL = _READABLE + _OTHERS
_PADDING = "x-0 ."


class NoExample(ValueError):
    """No string this generator builds matches the pattern within the lengths asked."""


def _category(cat: Any, ch: str) -> bool:
    c = _c
    if cat in (c.CATEGORY_DIGIT, c.CATEGORY_UNI_DIGIT):
        return ch.isdecimal()
    if cat in (c.CATEGORY_NOT_DIGIT, c.CATEGORY_UNI_NOT_DIGIT):
        return not ch.isdecimal()
    if cat in (c.CATEGORY_WORD, c.CATEGORY_UNI_WORD):
        return ch.isalnum() or ch == "_"
    if cat in (c.CATEGORY_NOT_WORD, c.CATEGORY_UNI_NOT_WORD):
        return not (ch.isalnum() or ch == "_")
    if cat in (c.CATEGORY_SPACE, c.CATEGORY_UNI_SPACE):
        return ch.isspace()
    if cat in (c.CATEGORY_NOT_SPACE, c.CATEGORY_UNI_NOT_SPACE):
        return not ch.isspace()
    return False  # line-break categories: only in a verbose corner; never generated


def _in_class(items: list[tuple[Any, Any]], ch: str) -> bool:
    negate = False
    hit = False
    for op, av in items:
        if op is _c.NEGATE:
            negate = True
        elif op is _c.LITERAL:
            hit = hit or ord(ch) == av
        elif op is _c.RANGE:
            hit = hit or av[0] <= ord(ch) <= av[1]
        elif op is _c.CATEGORY:
            hit = hit or _category(av, ch)
        else:  # RANGE_UNI_IGNORE and the like: not produced by the parser we call
            raise NoExample(f"unsupported class item {op}")
    return hit != negate


class _Walk:
    """One generation pass. `variant` picks the variant-th acceptable character
    for the first class or `.`, so callers can ask for different strings."""

    def __init__(self, variant: int) -> None:
        self.groups: dict[int, str] = {}
        self.variant = variant
        self._varied = False
        self._widths: dict[int, tuple[int, float]] = {}  # by id of a parsed (sub)pattern

    # --- widths -------------------------------------------------------------

    def width(self, items: Any) -> tuple[int, float]:
        known = self._widths.get(id(items))
        if known is not None:
            return known
        lo, hi = 0, 0.0
        for op, av in items:
            a, b = self._width1(op, av)
            lo, hi = lo + a, hi + b
        self._widths[id(items)] = (lo, hi)
        return lo, hi

    def _width1(self, op: Any, av: Any) -> tuple[int, float]:
        c = _c
        if op in (c.LITERAL, c.NOT_LITERAL, c.ANY, c.IN):
            return 1, 1
        if op is c.BRANCH:
            widths = [self.width(b) for b in av[1]]
            return min(w[0] for w in widths), max(w[1] for w in widths)
        if op is c.SUBPATTERN:
            return self.width(av[3])
        if op is c.ATOMIC_GROUP:
            return self.width(av)
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            rlo, rhi, sub = av
            slo, shi = self.width(sub)
            top = INF if rhi >= c.MAXREPEAT else rhi * shi
            return rlo * slo, top
        if op is c.GROUPREF_EXISTS:
            yes = self.width(av[1])
            no = self.width(av[2]) if av[2] is not None else (0, 0.0)
            return min(yes[0], no[0]), max(yes[1], no[1])
        if op is c.GROUPREF:
            return 0, INF  # the group's text, whatever it turns out to be
        return 0, 0  # AT, ASSERT, ASSERT_NOT: zero-width

    # --- generation ---------------------------------------------------------

    def seq(self, items: Any, target: float) -> str:
        widths = [self._width1(op, av) for op, av in items]
        extra = max(0.0, target - sum(w[0] for w in widths))
        out = []
        for (op, av), (lo, hi) in zip(items, widths, strict=True):
            give = min(extra, hi - lo)
            extra -= give
            out.append(self._one(op, av, lo + give))
        return "".join(out)

    def _char(self, accept: Any) -> str:
        skip = 0
        if not self._varied:
            self._varied = True
            skip = self.variant
        for ch in _ALL:
            if accept(ch):
                if skip == 0:
                    return ch
                skip -= 1
        raise NoExample("a character class matches no character this generator can write")

    def _one(self, op: Any, av: Any, target: float) -> str:
        c = _c
        if op in (c.LITERAL, c.NOT_LITERAL, c.ANY, c.IN):
            return self._one_char(op, av)
        if op is c.BRANCH:
            return self._branch(av[1], target)
        if op is c.SUBPATTERN:
            group, _, _, sub = av
            text = self.seq(sub, target)
            if group is not None:
                self.groups[group] = text
            return text
        if op is c.ATOMIC_GROUP:
            return self.seq(av, target)
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            return self._repeat(av, target)
        if op in (c.GROUPREF, c.GROUPREF_EXISTS):
            return self._groupref(op, av, target)
        if op in (c.AT, c.ASSERT, c.ASSERT_NOT):
            return ""  # anchors hold by construction; look-arounds are checked afterwards
        raise NoExample(f"unsupported regular-expression construct {op}")

    def _one_char(self, op: Any, av: Any) -> str:
        """One character for LITERAL, NOT_LITERAL, ANY or IN."""
        c = _c
        if op is c.LITERAL:
            return chr(av)
        if op is c.NOT_LITERAL:
            return self._char(lambda ch: ord(ch) != av and ch != "\n")
        if op is c.ANY:
            return self._char(lambda ch: ch != "\n")
        return self._char(lambda ch: _in_class(av, ch))

    def _branch(self, branches: Any, target: float) -> str:
        widths = [self.width(b) for b in branches]
        fits = [i for i, (lo, hi) in enumerate(widths) if lo <= target <= hi]
        pick = fits[0] if fits else min(range(len(branches)), key=lambda i: abs(widths[i][0] - target))
        return self.seq(branches[pick], target)

    def _groupref(self, op: Any, av: Any, target: float) -> str:
        """GROUPREF (the group's text) or GROUPREF_EXISTS (the yes/no branch)."""
        if op is _c.GROUPREF:
            if av not in self.groups:
                raise NoExample(f"back-reference to group {av} before it matched")
            return self.groups[av]
        group, yes, no = av
        branch = yes if group in self.groups else no
        return self.seq(branch, target) if branch is not None else ""

    def _repeat(self, av: Any, target: float) -> str:
        rlo, rhi, sub = av
        rhi = INF if rhi >= _c.MAXREPEAT else rhi
        slo, shi = self.width(sub)
        count = rlo
        if target > rlo * slo and shi > 0:
            per = shi if shi < INF else max(slo, target, 1)
            count = max(rlo, math.ceil(target / per))
        count = int(min(count, rhi, MAX_LENGTH))
        if count == 0:
            return ""
        base, spare = divmod(int(min(target, MAX_LENGTH)), count)
        return "".join(self.seq(sub, base + (1 if i < spare else 0)) for i in range(count))


def _targets(lo: int, hi: float, min_len: int, max_len: float) -> Iterator[int]:
    """Lengths to aim at: the shortest allowed first."""
    seen: set[int] = set()
    for t in (max(lo, min_len), lo, min(hi, max_len), max(lo, min_len) + 1):
        if t < INF and 0 <= t <= MAX_LENGTH and t not in seen:
            seen.add(int(t))
            yield int(t)


@functools.lru_cache(maxsize=512)
def example(pattern: str, min_len: int = 0, max_len: int | None = None, variant: int = 0) -> str:
    """A string `re.search(pattern, s)` accepts with `min_len <= len(s) <= max_len`."""
    upper: float = INF if max_len is None else max_len
    if min_len > MAX_LENGTH:
        raise NoExample(f"asks for at least {min_len} characters; the generator writes at most {MAX_LENGTH}")
    if min_len > upper:
        raise NoExample(f"minLength {min_len} is above maxLength {max_len}")
    try:
        compiled = re.compile(pattern)
        parsed = _parser.parse(pattern)
    except re.error as err:
        raise NoExample(f"not a regular expression: {err}") from None
    lo, hi = _Walk(variant).width(parsed)
    if lo > MAX_LENGTH:
        raise NoExample(f"its shortest match has {lo} characters; the generator writes at most {MAX_LENGTH}")
    for target in _targets(lo, hi, min_len, upper):
        text = _Walk(variant).seq(parsed, target)
        short = max(0, min_len - len(text))
        candidates = [text] if not short else [text + p * short for p in _PADDING]
        candidates += [p * short + text for p in _PADDING] if short else []
        for candidate in candidates:
            if min_len <= len(candidate) <= upper and compiled.search(candidate):
                return candidate
    raise NoExample("no string this generator can build matches it within the length bounds")
