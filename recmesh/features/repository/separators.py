"""The separators inside a stored event member, and how a value is cleaned of them."""

from __future__ import annotations

# Separators inside a stored event member (services/feature/writer.py): fields,
# and the values of a multi-valued attribute. Values are cleaned of them (and of
# tabs and newlines, which frame the write script's argument) before they are stored.
FIELD_SEP = "\x1f"
VALUE_SEP = "\x1e"
_UNSAFE = str.maketrans({FIELD_SEP: " ", VALUE_SEP: " ", "\t": " ", "\n": " ", "\r": " "})


def clean(text: str) -> str:
    """A value as it can be stored inside an event member."""
    return text.translate(_UNSAFE)
