from __future__ import annotations

import pytest

from recmesh.errors import InvalidArgument
from recmesh.slo import DEFAULT_CLASSES, resolve_class


def test_header_names_the_class_case_insensitively() -> None:
    assert resolve_class("a", "B").name == "A"
    assert resolve_class(" C ", "B").budget_ms == DEFAULT_CLASSES["C"].budget_ms


def test_missing_header_gets_the_default() -> None:
    assert resolve_class(None, "B").name == "B"
    assert resolve_class("", "C").name == "C"


def test_unknown_class_is_the_callers_error() -> None:
    with pytest.raises(InvalidArgument, match="unknown x-slo-class 'Z'"):
        resolve_class("Z", "B")
