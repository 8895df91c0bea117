"""How ``consume`` and ``latest`` print records, and how ``produce -f`` reads them from lines.

A record format (``--format``/``-f``) is one of:

* ``json``: one JSON object a line, as ``rpk topic consume --format json`` prints:
  ``{"topic", "partition", "offset", "timestamp", "key", "value", "headers"}``; a key or value
  that is not UTF-8 is base64, said by ``"key_encoding"``/``"value_encoding": "base64"``; a
  missing key and an unknown timestamp (records read through a group) are ``null``;
* an rpk-style template, any text with ``%`` fields: ``%t`` topic, ``%p`` partition, ``%o``
  offset, ``%d`` timestamp (ms), ``%k`` key (empty when none), ``%v`` value, ``%h`` headers
  (``name=value`` pairs joined by ``,``), ``%%`` a ``%``; ``\\n``, ``\\t``, ``\\r``, ``\\\\`` are
  escapes, and nothing is added at the end (``-f '%k %v\\n'``, as rpk);
* a template with ``{topic}``, ``{partition}``, ``{offset}``, ``{key}`` (``-`` when none),
  ``{value}``, ``{timestamp}``, ``{headers}``, each record followed by a newline.

``produce -f`` takes a template of the rpk kind without its escapes' newline: ``%k`` the key,
``%v`` the value, ``%p`` the partition, ``%h`` the headers, literal text between them; each input
line must match it whole (``LineTemplate``).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kafkaesque.client import ConsumerRecord

from .client_options import ClientCommandError

JSON = "json"

_BRACES = re.compile(r"\{(topic|partition|offset|key|value|timestamp|headers)\}")
_PERCENT = re.compile(r"%(.)|\\(.)", re.DOTALL)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
_RECORD_FIELDS = "tpodkvh"
"""The ``%`` fields of a record template: topic, partition, offset, timestamp (date), key, value,
headers."""


def headers_text(headers: Sequence[tuple[str, bytes]]) -> bytes:
    """Headers as ``%h`` prints them and ``produce -f`` reads them: ``a=1,b=2``."""
    return b",".join(name.encode() + b"=" + value for name, value in headers)


def _text_or_base64(raw: bytes) -> tuple[str, bool]:
    try:
        return raw.decode(), False
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode(), True


def record_json(record: ConsumerRecord) -> bytes:
    """A record as one JSON object (see the module docstring)."""
    out: dict[str, object] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": None if record.timestamp < 0 else record.timestamp,
    }
    for field, raw in (("key", record.key), ("value", record.value)):
        if raw is None:
            out[field] = None
            continue
        text, encoded = _text_or_base64(raw)
        out[field] = text
        if encoded:
            out[f"{field}_encoding"] = "base64"
    out["headers"] = [
        {"key": name, "value": _text_or_base64(value)[0]} for name, value in record.headers
    ]
    return json.dumps(out, ensure_ascii=False).encode()


def _percent_parts(template: str, known: str, option: str) -> list[tuple[str, str]]:
    """``template`` cut into ``("text", literal)`` and ``("field", letter)`` parts, its escapes
    applied; ``ClientCommandError`` for a field letter not in ``known``."""
    parts: list[tuple[str, str]] = []
    at = 0
    for found in _PERCENT.finditer(template):
        parts.append(("text", template[at : found.start()]))
        at = found.end()
        field, escape = found.group(1), found.group(2)
        if escape is not None:
            parts.append(("text", _ESCAPES.get(escape, "\\" + escape)))
        elif field == "%":
            parts.append(("text", "%"))
        elif field in known:
            parts.append(("field", field))
        else:
            fields = " ".join(f"%{f}" for f in known)
            raise ClientCommandError(f"{option}: unknown field %{field} (known: {fields} %%)")
    parts.append(("text", template[at:]))
    return [part for part in parts if part != ("text", "")]


def record_formatter(template: str) -> Callable[[ConsumerRecord], bytes]:
    """What ``--format template`` prints for a record, as bytes (see the module docstring);
    ``ClientCommandError`` for an unknown ``%`` field."""
    if template == JSON:
        return lambda record: record_json(record) + b"\n"
    if "%" in template:
        return _percent_formatter(_percent_parts(template, _RECORD_FIELDS, "--format"))
    return _brace_formatter(template)


def _field(record: ConsumerRecord, letter: str) -> bytes:
    match letter:
        case "t":
            return record.topic.encode()
        case "p":
            return str(record.partition).encode()
        case "o":
            return str(record.offset).encode()
        case "d":
            return str(record.timestamp).encode()
        case "k":
            return record.key or b""
        case "v":
            return record.value or b""
        case _:
            return headers_text(record.headers)


def _percent_formatter(parts: list[tuple[str, str]]) -> Callable[[ConsumerRecord], bytes]:
    def render(record: ConsumerRecord) -> bytes:
        return b"".join(
            text.encode() if kind == "text" else _field(record, text) for kind, text in parts
        )

    return render


def _brace_formatter(template: str) -> Callable[[ConsumerRecord], bytes]:
    parts = _BRACES.split(template)

    def render(record: ConsumerRecord) -> bytes:
        out = bytearray()
        for i, part in enumerate(parts):
            if i % 2 == 0:
                out += part.encode()
            elif part == "key":
                out += b"-" if record.key is None else record.key
            elif part == "value":
                out += record.value or b""
            elif part == "headers":
                out += headers_text(record.headers)
            else:
                out += str(getattr(record, part)).encode()
        return bytes(out) + b"\n"

    return render


@dataclass(frozen=True, slots=True)
class ParsedLine:
    """What ``produce -f`` read from one line (None: the template has no such field)."""

    value: bytes
    key: bytes | None = None
    partition: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


_LINE_FIELDS = {"k": r"(?P<k>.*?)", "v": r"(?P<v>.*)", "p": r"(?P<p>\d+)", "h": r"(?P<h>.*?)"}


class LineTemplate:
    """``produce -f``: reads a record from each input line by an rpk-style template of ``%k``
    (key; empty: none), ``%v`` (value, required), ``%p`` (partition) and ``%h`` (headers,
    ``name=value`` joined by ``,``), each at most once, with literal text between them.
    ``ClientCommandError`` for a template it cannot use."""

    def __init__(self, template: str) -> None:
        self.template = template
        parts = _percent_parts(template.rstrip("\n"), "kvph", "-f")
        letters = [text for kind, text in parts if kind == "field"]
        if "v" not in letters or len(set(letters)) != len(letters):
            raise ClientCommandError(
                f"-f {template!r}: a line template needs %v once, and each of %k %p %h at most once"
            )
        self.fields = frozenset(letters)
        self._pattern = re.compile(
            "".join(
                re.escape(text) if kind == "text" else _LINE_FIELDS[text] for kind, text in parts
            ).encode(),
            re.DOTALL,
        )

    def parse(self, line: bytes) -> ParsedLine | None:
        """The record ``line`` holds, or None if it does not match the template (or names
        headers without ``=``)."""
        found = self._pattern.fullmatch(line)
        if found is None:
            return None
        fields = found.groupdict()
        headers: list[tuple[str, bytes]] = []
        for pair in (fields.get("h") or b"").split(b","):
            if pair:
                name, sep, value = pair.partition(b"=")
                if not sep:
                    return None
                headers.append((name.decode(errors="replace"), value))
        partition = fields.get("p")
        return ParsedLine(
            value=fields["v"],
            key=fields.get("k") or None,
            partition=None if partition is None else int(partition),
            headers=tuple(headers),
        )
