"""The user-behaviour event contract (topic `user_behavior`, key = user_id).

Value: JSON {"event_id", "user_id", "item_id", "behavior", "event_time"
(epoch ms)}; extra fields are allowed and ignored. The gateway validates on the
way in (400 naming the field), the ingest consumer on the way out (bad records
go to the dead-letter topic).
"""

from __future__ import annotations

from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from recmesh.errors import InvalidArgument
from recmesh.jsontypes import JsonInt

Behavior = Literal["view", "click", "add_to_cart", "purchase"]
BEHAVIORS: tuple[str, ...] = ("view", "click", "add_to_cart", "purchase")


MIN_EVENT_TIME_MS = 1_000_000_000_000
MAX_EVENT_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z (and within 64 bits on the wire)

# Whitespace spelled out: `\s` means different sets to pydantic's Rust regex
# (U+0085), Python's re (U+001C-001F, U+0085) and the ECMA-262 dialect a JSON
# Schema pattern is read in (U+FEFF), so with `\s` the published schema and the
# validation disagreed on which ids are valid. This class is their union.
_SPACE = r"\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
EVENT_ID_PATTERN = rf"^[^{_SPACE}]+$"
# User and item ids go into Redis keys and members: no "{}" (the keys' cluster
# hash tags) or "|" (the members' field separator).
ENTITY_ID_PATTERN = rf"^[^|{{}}{_SPACE}]+$"


class Event(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    event_id: str = Field(min_length=1, max_length=128, pattern=EVENT_ID_PATTERN)
    user_id: str = Field(min_length=1, max_length=128, pattern=ENTITY_ID_PATTERN)
    item_id: str = Field(min_length=1, max_length=128, pattern=ENTITY_ID_PATTERN)
    behavior: Behavior
    # Epoch milliseconds. Anything before 2001-09-09 (1e12 ms) is refused: it
    # is almost surely epoch *seconds*, which would land 50 years in the past,
    # outside every window, and silently change nothing. Past the year 9999 it
    # is no time at all (and no longer fits the 64 bits the topic's JSON has).
    event_time: JsonInt = Field(
        le=MAX_EVENT_TIME_MS,
        description="epoch milliseconds",
        json_schema_extra={"minimum": MIN_EVENT_TIME_MS},
    )

    @field_validator("event_time")
    @classmethod
    def _milliseconds(cls, value: int) -> int:
        if value < MIN_EVENT_TIME_MS:
            raise ValueError(
                f"must be epoch milliseconds (>= {MIN_EVENT_TIME_MS}); {value} looks like seconds"
            )
        return value

    def to_json(self) -> bytes:
        return orjson.dumps(self.model_dump())


def describe_validation_error(err: ValidationError, prefix: str = "") -> str:
    """A one-line message naming each bad field, e.g. 'events[3].behavior: ...'."""
    parts = []
    for e in err.errors():
        loc = prefix + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"])
        parts.append(f"{loc.lstrip('.')}: {e['msg']}")
    return "; ".join(parts)


def parse_event(raw: bytes) -> Event:
    """Decode and validate one record value; raises InvalidArgument with the reason."""
    try:
        return Event.model_validate_json(raw)
    except ValidationError as err:
        first = err.errors()[0]
        if first["type"] == "json_invalid":
            raise InvalidArgument(f"not JSON: {first['msg']}") from None
        if first["type"] == "model_type":
            raise InvalidArgument("event must be a JSON object") from None
        raise InvalidArgument(describe_validation_error(err)) from None
