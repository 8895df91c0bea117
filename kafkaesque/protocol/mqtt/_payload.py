"""The payload-reading parts of a mapping rule (pure): JSON paths, kept fields, log topic templates.

A *JSON path* is a small subset of JSONPath: ``$`` then one or more steps, each ``.name`` (an
object's member; a name is any run of characters but ``.``, ``[``, ``]``, ``{``, ``}``, ``,``
and blanks) or ``[N]`` (an array's N-th element, 0-based): ``$.device.id``, ``$.readings[0].t``.
No wildcards, filters, slices or quoted names.

A *log topic template* is a log topic name with placeholders: ``{N}`` is level N (0-based) of the
MQTT topic, ``{$.path}`` a string or number field of the JSON payload: ``sensors-{1}``,
``events-{$.kind}``. What it yields must be a valid log topic name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from ._converters import ConversionError

_NAME: Final = r"[^.\[\]{},\s]+"
_STEP: Final = re.compile(rf"\.({_NAME})|\[(\d+)\]")
_PLACEHOLDER: Final = re.compile(r"\{([^{}]*)\}")


class Missing:
    """The value of a path that leads nowhere in a document."""

    __slots__ = ()


MISSING: Final = Missing()


@dataclass(frozen=True, slots=True)
class JsonPath:
    """A parsed JSON path: ``text`` as written, ``steps`` member names and array indexes."""

    text: str
    steps: tuple[str | int, ...]

    @classmethod
    def parse(cls, text: str) -> JsonPath:
        """Parse ``$.a.b[0]``; ``ValueError`` naming what is wrong."""
        if not text.startswith("$"):
            raise ValueError(f"a JSON path starts with '$': {text!r}")
        steps: list[str | int] = []
        at = 1
        while at < len(text):
            step = _STEP.match(text, at)
            if step is None:
                raise ValueError(f"JSON path {text!r}: expected '.name' or '[N]' at {text[at:]!r}")
            name, index = step.groups()
            steps.append(name if name is not None else int(index))
            at = step.end()
        if not steps:
            raise ValueError(f"JSON path {text!r} names no field")
        return cls(text, tuple(steps))

    def get(self, document: Any) -> Any:
        """The value at this path in ``document``, or ``MISSING``."""
        value = document
        for step in self.steps:
            if isinstance(step, str):
                if not isinstance(value, dict) or step not in value:
                    return MISSING
            elif not isinstance(value, list) or step >= len(value):
                return MISSING
            value = value[step]
        return value


def field_path(text: str) -> JsonPath:
    """A kept field of ``fields=``: dotted member names (``b.c``; ``$.b.c`` also reads)."""
    path = JsonPath.parse(text if text.startswith("$") else "$." + text)
    if any(isinstance(step, int) for step in path.steps):
        raise ValueError(f"field {text!r}: fields= keeps members, not array elements")
    return path


def keep_fields(document: Any, fields: tuple[JsonPath, ...]) -> dict[str, Any]:
    """The object ``document`` with only ``fields`` (nested members keep their nesting; a field
    the document lacks is left out). ``ConversionError`` if ``document`` is not an object."""
    if not isinstance(document, dict):
        raise ConversionError("fields= needs a JSON object payload")
    kept: dict[str, Any] = {}
    for path in fields:
        value = path.get(document)
        if value is MISSING:
            continue
        into = kept
        *parents, last = path.steps
        for step in parents:
            assert isinstance(step, str)  # field_path allows names only
            nested = into.setdefault(step, {})
            if not isinstance(nested, dict):
                break  # a parent kept whole already holds this field
            into = nested
        else:
            assert isinstance(last, str)
            into[last] = value
    return kept


def scalar_text(value: Any, what: str) -> str:
    """A string or number field as text (a number as JSON writes it); ``ConversionError`` for
    a missing field, null, a boolean, an object or an array."""
    if value is MISSING:
        raise ConversionError(f"no {what}")
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value)
    raise ConversionError(f"{what} is not a string or a number")


TemplatePart = str | int | JsonPath  # literal text, an MQTT topic level, a payload field


def parse_template(text: str) -> tuple[TemplatePart, ...]:
    """The parts of a log topic template; ``ValueError`` for a bad placeholder."""
    parts: list[TemplatePart] = []
    at = 0
    for match in _PLACEHOLDER.finditer(text):
        if match.start() > at:
            parts.append(text[at : match.start()])
        inner = match.group(1)
        if inner.isdigit():
            parts.append(int(inner))
        elif inner.startswith("$"):
            parts.append(JsonPath.parse(inner))
        else:
            raise ValueError(f"placeholder {{{inner}}}: expected {{N}} or {{$.field}}")
        at = match.end()
    if at < len(text):
        parts.append(text[at:])
    return tuple(parts)
