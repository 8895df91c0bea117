"""The seed's JSON message envelope: how a PUBS message is read as a record.

Pure and total: the broker calls it for every PUBS line, and any message is a record (the
envelope's fields, or else the whole message as plain text).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

# ---------------------------------------------------------------------------------------------
# The seed's JSON message envelope.


@dataclass(frozen=True, slots=True)
class SeedMessage:
    """A PUBS message split into the record it stands for."""

    value: bytes
    key: bytes | None = None
    header: bytes | None = None


_SEED_FIELDS: Final = frozenset({"header", "key", "body"})


def parse_seed_message(message: bytes) -> SeedMessage:
    """Interpret a PUBS message as the seed did: its JSON envelope, or else plain text.

    The envelope is a JSON object ``{"Header": "...", "Key": "124", "Body": "Hello World!"}``
    whose ``Body`` is a string and whose optional ``Key`` (a string or an integer) and ``Header``
    (a string) may be null. Field names match case-insensitively, as Go's ``encoding/json`` (the
    seed's language) matches them. Anything else, including an object with other fields or a
    non-string body, is plain text: the whole message is the value and there is no key. Values
    come back UTF-8 encoded. Pure and total: never raises.
    """
    # Cheap test first: plain text (the common case) must not pay for a JSON parse.
    if message.lstrip()[:1] != b"{":
        return SeedMessage(message)
    try:
        obj = json.loads(message)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        return SeedMessage(message)
    except RecursionError:  # deeply nested brackets: plainly not the envelope
        return SeedMessage(message)
    if not isinstance(obj, dict):
        return SeedMessage(message)
    fields: dict[str, object] = {}
    for name, field_value in obj.items():
        folded = name.lower()
        if folded not in _SEED_FIELDS or folded in fields:
            return SeedMessage(message)
        fields[folded] = field_value
    body, key, header = fields.get("body"), fields.get("key"), fields.get("header")
    if not isinstance(body, str):
        return SeedMessage(message)
    if isinstance(key, int) and not isinstance(key, bool):
        key = str(key)
    if not (key is None or isinstance(key, str)) or not (header is None or isinstance(header, str)):
        return SeedMessage(message)
    return SeedMessage(
        value=body.encode("utf-8", "surrogatepass"),
        key=None if key is None else key.encode("utf-8", "surrogatepass"),
        header=None if header is None else header.encode("utf-8", "surrogatepass"),
    )
