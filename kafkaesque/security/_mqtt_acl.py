"""MQTT ACLs with mosquitto's ``acl_file`` semantics: who may publish, subscribe and receive.

The file (mosquitto.conf(5) ``acl_file``; https://mosquitto.org/documentation/plugins/acl-file)::

    # anonymous clients (no user name): the lines before any ``user`` line
    topic read public/#
    user alice
    topic readwrite phones/alice/#
    topic deny phones/alice/secret
    # every client, with %u the user name and %c the client id
    pattern write phones/%c/spectrum
    pattern read phones/%c/commands

``topic [read|write|readwrite|deny] <filter>`` (``readwrite`` when the access is left out)
applies to the anonymous clients before the first ``user <name>`` line and to that user after
it; ``pattern [read|write|readwrite|deny] <filter>`` applies to every client, wherever it stands,
with ``%u`` and ``%c`` replaced by the client's user name and client id. A substitution whose
value holds ``+``, ``#`` or ``/`` (or a ``%u`` for a client without a user name) never matches:
a client id may not widen its own grant. Deny lines are checked before grants; once a file is
set, only what it grants is allowed.

What a client may do:

* ``can_publish(user, client_id, topic)``: no deny line matches the topic, a write grant does;
* ``can_receive(user, client_id, topic)``: the same with a read grant (a delivery, live or
  retained);
* ``can_subscribe(user, client_id, filter)``: no deny line overlaps the filter (could match a
  topic it matches) and one read grant covers it (matches every topic it can match). So a
  granted subscription never matches a topic its client may not receive; the broker still
  checks each delivery with ``can_receive`` (the file may change, and ``pattern`` lines are
  per client). A shared subscription ``$share/<group>/<filter>`` is checked by its filter.

Pure: no I/O but ``MqttAcl.load``. Immutable once built, so safe to share between connections.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from kafkaesque.protocol.mqtt import (
    InvalidMqttTopicError,
    mqtt_topic_matches,
    parse_shared_subscription,
    validate_mqtt_topic_filter,
)

READ: Final = 1
WRITE: Final = 2
DENY: Final = 0
_ACCESS: Final = {"read": READ, "write": WRITE, "readwrite": READ | WRITE, "deny": DENY}
_PLACEHOLDER: Final = re.compile(r"%[uc]")
_UNSAFE: Final = frozenset("+#/")
_CACHED: Final = 1024


class MqttAclError(ValueError):
    """An ACL file that cannot be read or parsed; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class MqttAclEntry:
    """One ``topic`` or ``pattern`` line: ``access`` is READ, WRITE, both, or DENY (0)."""

    access: int
    topic_filter: str
    pattern: bool = False


@dataclass(frozen=True, slots=True)
class MqttAcl:
    """A parsed ACL file (see the module docstring).

    ``anonymous``: the entries for clients without a user name; ``users``: by user name;
    ``patterns``: for every client, before substitution.
    """

    anonymous: tuple[MqttAclEntry, ...] = ()
    users: tuple[tuple[str, tuple[MqttAclEntry, ...]], ...] = ()
    patterns: tuple[MqttAclEntry, ...] = ()

    @classmethod
    def load(cls, path: str) -> MqttAcl:
        """Read and parse the file ``path``; ``MqttAclError`` if it cannot be read or parsed."""
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise MqttAclError(f"{path}: cannot read the ACL file: {exc}") from exc
        return cls.parse(text, source=path)

    @classmethod
    def parse(cls, text: str, *, source: str = "<acl>") -> MqttAcl:
        """Parse ACL file text; ``MqttAclError("SOURCE line N: ...")`` on a bad line."""
        anonymous: list[MqttAclEntry] = []
        users: dict[str, list[MqttAclEntry]] = {}
        patterns: list[MqttAclEntry] = []
        current = anonymous
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            keyword, *more = line.split(None, 1)
            rest = more[0].strip() if more else ""
            where = f"{source} line {number}"
            if keyword == "user":
                if not rest:
                    raise MqttAclError(f"{where}: 'user' needs a user name")
                current = users.setdefault(rest, [])
            elif keyword in ("topic", "pattern"):
                entry = _entry(rest, pattern=keyword == "pattern", where=where)
                (patterns if entry.pattern else current).append(entry)
            else:
                raise MqttAclError(
                    f"{where}: expected 'topic', 'pattern' or 'user', not {keyword!r}"
                )
        return cls(
            tuple(anonymous),
            tuple((name, tuple(entries)) for name, entries in users.items()),
            tuple(patterns),
        )

    def for_client(self, user: str | None, client_id: str) -> ClientAcl:
        """The checks of one connected client, its entries substituted once (a broker asks
        for each message it delivers)."""
        return ClientAcl(tuple(self._entries(user, client_id)))

    # -- checks ---------------------------------------------------------------------------------

    def can_publish(self, user: str | None, client_id: str, topic: str) -> bool:
        """Whether ``client_id`` (connected as ``user``, None: anonymous) may publish to
        ``topic``."""
        return self._allowed(user, client_id, topic, WRITE)

    def can_receive(self, user: str | None, client_id: str, topic: str) -> bool:
        """Whether a message published to ``topic`` may be delivered to the client."""
        return self._allowed(user, client_id, topic, READ)

    def can_subscribe(self, user: str | None, client_id: str, topic_filter: str) -> bool:
        """Whether the client may subscribe to ``topic_filter``: see the module docstring."""
        return _may_subscribe(tuple(self._entries(user, client_id)), topic_filter)

    def _allowed(self, user: str | None, client_id: str, topic: str, access: int) -> bool:
        return _may(tuple(self._entries(user, client_id)), topic, access)

    def _entries(self, user: str | None, client_id: str) -> Iterable[MqttAclEntry]:
        """The client's entries, patterns substituted (those that cannot be are left out)."""
        if user is None:
            yield from self.anonymous
        else:
            for name, entries in self.users:
                if name == user:
                    yield from entries
        for entry in self.patterns:
            topic_filter = _substitute(entry.topic_filter, user, client_id)
            if topic_filter is not None:
                yield MqttAclEntry(entry.access, topic_filter, pattern=True)


class ClientAcl:
    """``MqttAcl``'s checks for one client (``MqttAcl.for_client``); remembers the answers of
    the last ``_CACHED`` topics it was asked about for each check."""

    __slots__ = ("_entries", "_publish", "_receive")

    def __init__(self, entries: tuple[MqttAclEntry, ...]) -> None:
        self._entries = entries
        self._publish: dict[str, bool] = {}
        self._receive: dict[str, bool] = {}

    def can_publish(self, topic: str) -> bool:
        return self._cached(self._publish, topic, WRITE)

    def can_receive(self, topic: str) -> bool:
        return self._cached(self._receive, topic, READ)

    def can_subscribe(self, topic_filter: str) -> bool:
        return _may_subscribe(self._entries, topic_filter)

    def _cached(self, cache: dict[str, bool], topic: str, access: int) -> bool:
        found = cache.get(topic)
        if found is None:
            if len(cache) >= _CACHED:
                cache.clear()
            found = cache[topic] = _may(self._entries, topic, access)
        return found


def _may(entries: tuple[MqttAclEntry, ...], topic: str, access: int) -> bool:
    if any(e.access == DENY and mqtt_topic_matches(e.topic_filter, topic) for e in entries):
        return False
    return any(e.access & access and mqtt_topic_matches(e.topic_filter, topic) for e in entries)


def _may_subscribe(entries: tuple[MqttAclEntry, ...], topic_filter: str) -> bool:
    try:
        shared = parse_shared_subscription(topic_filter)
    except InvalidMqttTopicError:
        return False
    if shared is not None:
        topic_filter = shared.topic_filter
    if any(e.access == DENY and filters_overlap(e.topic_filter, topic_filter) for e in entries):
        return False
    return any(e.access & READ and filter_covers(e.topic_filter, topic_filter) for e in entries)


def _entry(rest: str, *, pattern: bool, where: str) -> MqttAclEntry:
    if not rest:
        raise MqttAclError(f"{where}: a topic filter is missing")
    first, *after = rest.split(None, 1)
    access = _ACCESS.get(first)
    if access is None:
        access, topic_filter = READ | WRITE, rest
    else:
        topic_filter = after[0].strip() if after else ""
    if not topic_filter:
        raise MqttAclError(f"{where}: a topic filter is missing")
    try:
        validate_mqtt_topic_filter(topic_filter)
    except InvalidMqttTopicError as exc:
        raise MqttAclError(f"{where}: {topic_filter!r} is not a topic filter: {exc}") from exc
    return MqttAclEntry(access, topic_filter, pattern)


def _substitute(topic_filter: str, user: str | None, client_id: str) -> str | None:
    """``topic_filter`` with %u and %c replaced; None when a value may not be put there."""
    if "%" not in topic_filter:
        return topic_filter
    failed = False

    def value(match: re.Match[str]) -> str:
        nonlocal failed
        found = user if match.group() == "%u" else client_id
        if found is None or _UNSAFE.intersection(found):
            failed = True
            return ""
        return found

    substituted = _PLACEHOLDER.sub(value, topic_filter)
    return None if failed else substituted


def filter_covers(grant: str, topic_filter: str) -> bool:
    """Whether every topic name ``topic_filter`` matches is matched by ``grant`` (both valid
    filters; §4.7 matching, with the rule that a wildcard first level does not match a
    ``$`` topic)."""
    g = grant.split("/")
    f = topic_filter.split("/")
    if f[0].startswith("$") and g[0] in ("+", "#"):
        return False  # f matches only $ topics there, which g's wildcard does not (MQTT-4.7.2-1)
    i = 0
    while True:
        if i < len(g) and g[i] == "#":
            return True  # the rest of any name, even none
        if i == len(f):
            return i == len(g)
        if f[i] == "#" or i == len(g):
            return False  # f matches names that go on where g ends, or that g's level refuses
        if f[i] == "+":
            if g[i] != "+":
                return False
        elif g[i] != "+" and g[i] != f[i]:
            return False
        i += 1


def filters_overlap(a: str, b: str) -> bool:
    """Whether some topic name is matched by both filters ``a`` and ``b`` (both valid)."""
    x = a.split("/")
    y = b.split("/")
    wild = ("+", "#")
    if (x[0] in wild and y[0].startswith("$")) or (y[0] in wild and x[0].startswith("$")):
        return False  # a wildcard first level matches no $ topic (MQTT-4.7.2-1)
    i = 0
    while True:
        if (i < len(x) and x[i] == "#") or (i < len(y) and y[i] == "#"):
            return True
        if i == len(x) or i == len(y):
            return len(x) == len(y)
        if x[i] != y[i] and x[i] != "+" and y[i] != "+":
            return False
        i += 1
