"""The canonical behaviour event (topic `user_behavior`, key = user_id).

Value: JSON {"event_id", "user_id", "item_id", "behavior", "event_time" (epoch
ms)} plus the numeric fields the repository declares in `events.values`, at
the top level (e.g. "rating": 4). The behaviour is one of the repository's
vocabulary or an alias of one (mapped on the way in); other extra fields are
allowed and ignored. The gateway validates on the way in (400 naming the
field), the ingest consumer on the way out (bad records go to the dead-letter
topic). `recmesh events import` maps a team's own records onto this form
(recmesh/features/importer.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from recmesh.errors import InvalidArgument
from recmesh.jsontypes import JsonInt

# 1e11 ms is 1973-03-03: history since then is accepted (MovieLens-100k is from
# 1997), while epoch *seconds* (1.7e9 today, below 1e11 until the year 5138) are not.
MIN_EVENT_TIME_MS = 100_000_000_000


MAX_EVENT_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z (and within 64 bits on the wire)

# Whitespace spelled out: `\s` means different sets to pydantic's Rust regex
# (U+0085), Python's re (U+001C-001F, U+0085) and the ECMA-262 dialect a JSON
# Schema pattern is read in (U+FEFF), so with `\s` the published schema and the
# validation disagreed on which ids are valid. This class is their union, and
# every control character (ids frame stored members and the write script's lines).
_SPACE = r"\x00-\x20\x7f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
EVENT_ID_PATTERN = rf"^[^{_SPACE}]+$"
# User and item ids go into Redis keys and members: no "{}" (the keys' cluster
# hash tags) or "|".
ENTITY_ID_PATTERN = rf"^[^|{{}}{_SPACE}]+$"


class EventSchema:
    """What a repository accepts as an event: its behaviour vocabulary (with
    aliases) and its numeric value fields."""

    def __init__(
        self, behaviors: tuple[str, ...], aliases: Mapping[str, str], values: tuple[str, ...]
    ) -> None:
        self.behaviors = behaviors
        self._canonical = {b: b for b in behaviors} | dict(aliases)
        self.values = values

    @property
    def accepted(self) -> list[str]:
        """Every behaviour name an event may carry: the vocabulary, then the aliases."""
        return list(self._canonical)

    def behavior(self, name: str) -> str:
        canonical = self._canonical.get(name)
        if canonical is None:
            known = ", ".join(self.behaviors)
            aliases = [a for a in self._canonical if a not in self.behaviors]
            also = f" (or the aliases {', '.join(aliases)})" if aliases else ""
            raise ValueError(f"unknown behaviour {name!r}: the repository declares {known}{also}")
        return canonical


class Event(BaseModel):
    # Extra fields are kept (a repository's numeric values travel at the top
    # level) but never written back: `to_dict` is the canonical form.
    model_config = ConfigDict(extra="allow", frozen=True)

    event_id: str = Field(min_length=1, max_length=128, pattern=EVENT_ID_PATTERN)
    user_id: str = Field(min_length=1, max_length=128, pattern=ENTITY_ID_PATTERN)
    item_id: str = Field(min_length=1, max_length=128, pattern=ENTITY_ID_PATTERN)
    behavior: str = Field(min_length=1, max_length=64)
    # Epoch milliseconds. Anything before 1973 (1e11 ms) is refused: it is
    # almost surely epoch *seconds*, which would land in 1970, outside every
    # window, and silently change nothing. Past the year 9999 it is no time at
    # all (and no longer fits the 64 bits the topic's JSON has).
    event_time: JsonInt = Field(
        le=MAX_EVENT_TIME_MS,
        description="epoch milliseconds",
        json_schema_extra={"minimum": MIN_EVENT_TIME_MS},
    )
    # The recommendation this event followed (its `request_id`), when the app sends it
    # back: attribution then joins exactly; without it, by user, item and time.
    request_id: str | None = Field(None, min_length=1, max_length=128, pattern=EVENT_ID_PATTERN)
    # The repository's numeric event fields present on this event (top level in
    # JSON; not a field of their own, so the published schema has no `values`).
    _values: dict[str, float] = PrivateAttr(default_factory=dict)

    @property
    def values(self) -> dict[str, float]:
        # The private attribute read where pydantic keeps it: `self._values`
        # goes through BaseModel.__getattr__ after a failed class look-up
        # (~2 µs an access, read for every event of every pass over a log).
        private = self.__pydantic_private__
        return private["_values"] if private is not None else self._values

    @classmethod
    def of_validated(
        cls, event_id: str, user_id: str, item_id: str, behavior: str, event_time: int,
        request_id: str | None, values: dict[str, float],
    ) -> Event:  # fmt: skip
        """An event from fields validated before (a table of a log read through
        `validate_event`), the very object `model_construct` makes with these
        fields and `values`, ~5x faster: what every pass over a log makes per event."""
        ev = cls.__new__(cls)
        init = object.__setattr__
        fields = {"event_id": event_id, "user_id": user_id, "item_id": item_id, "behavior": behavior,
                  "event_time": event_time, "request_id": request_id}  # fmt: skip
        init(ev, "__dict__", fields)
        init(ev, "__pydantic_fields_set__", set(_FIELDS))
        init(ev, "__pydantic_extra__", {})
        init(ev, "__pydantic_private__", {"_values": values})
        return ev

    def with_values(self, values: Mapping[str, float]) -> Event:
        copy = self.model_copy()
        copy._values = dict(values)
        return copy

    @field_validator("event_time")
    @classmethod
    def _milliseconds(cls, value: int) -> int:
        if value < MIN_EVENT_TIME_MS:
            raise ValueError(
                f"must be epoch milliseconds (>= {MIN_EVENT_TIME_MS}); {value} looks like seconds"
            )
        return value

    @field_validator("behavior")
    @classmethod
    def _known(cls, value: str, info: ValidationInfo) -> str:
        schema = _schema(info)
        return schema.behavior(value) if schema is not None else value

    def to_dict(self) -> dict[str, Any]:
        out = {
            "event_id": self.event_id, "user_id": self.user_id, "item_id": self.item_id,
            "behavior": self.behavior, "event_time": self.event_time, **self.values,
        }  # fmt: skip
        if self.request_id is not None:
            out["request_id"] = self.request_id
        return out

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())


_FIELDS = tuple(Event.model_fields)


def _schema(info: ValidationInfo) -> EventSchema | None:
    ctx = info.context
    return ctx.get("schema") if isinstance(ctx, dict) else None


def _values(obj: Mapping[str, Any], schema: EventSchema) -> dict[str, float]:
    out: dict[str, float] = {}
    for name in schema.values:
        raw = obj.get(name)
        if raw is None:
            continue
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
            raise InvalidArgument(f"{name}: must be a finite number, got {raw!r}")
        out[name] = float(raw)
    return out


def describe_validation_error(err: ValidationError, prefix: str = "") -> str:
    """A one-line message naming each bad field, e.g. 'events[3].behavior: ...'."""
    parts = []
    for e in err.errors():
        loc = prefix + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"])
        parts.append(f"{loc.lstrip('.')}: {e['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def validate_event(obj: Any, schema: EventSchema | None, prefix: str = "") -> Event:
    """A canonical event from a decoded JSON value; raises InvalidArgument naming the field."""
    if not isinstance(obj, dict):
        raise InvalidArgument(f"{prefix or 'event'} must be a JSON object")
    try:
        event = Event.model_validate(obj, context={"schema": schema})
    except ValidationError as err:
        raise InvalidArgument(describe_validation_error(err, prefix)) from None
    if schema is not None and schema.values:
        try:
            values = _values(obj, schema)
        except InvalidArgument as err:
            raise InvalidArgument(f"{prefix}.{err}".lstrip(".")) from None
        if values:
            # the event was made here and is not shared yet: its values set in place
            # (with_values copies the model: ~2 µs an event of every batch)
            private = event.__pydantic_private__
            if private is not None:
                private["_values"] = values
                return event
            return event.with_values(values)
    return event


def conform(event: Event, schema: EventSchema, prefix: str = "") -> Event:
    """An event parsed without a schema (e.g. by FastAPI), checked against one:
    the behaviour mapped onto the vocabulary, the declared values taken from its extra fields."""
    return validate_event({**event.to_dict(), **(event.model_extra or {})}, schema, prefix)


def parse_event(raw: bytes, schema: EventSchema | None) -> Event:
    """Decode and validate one record value; raises InvalidArgument with the reason."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise InvalidArgument(f"not JSON: {err}") from None
    return validate_event(obj, schema)
