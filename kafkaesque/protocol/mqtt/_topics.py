"""MQTT topic names and filters: validation, matching, shared subscriptions, and two tries.

The rules are those of MQTT 3.1.1 §4.7 and 5.0 §4.7/§4.8.2, the same in both versions:

* Names and filters are UTF-8, 1..65535 bytes, without U+0000 (MQTT-4.7.3-1..3); levels are split
  by ``/``; empty levels are legal and leading or trailing ``/`` is significant; matching is
  character by character, with no normalisation (MQTT-4.7.3-4).
* ``+`` fills exactly one whole level, possibly an empty one (MQTT-4.7.1-3); ``#`` is alone in the
  last level (MQTT-4.7.1-2) and matches the parent level too (``a/#`` matches ``a``).
* A filter whose first level is a wildcard never matches a name that starts with ``$``
  (MQTT-4.7.2-1): ``#`` does not see ``$SYS/x``, ``$SYS/#`` does.
* ``$share/{ShareName}/{filter}`` is a shared subscription (v5 §4.8.2): the share name is not empty
  and holds none of ``/ + #`` (v5 MQTT-4.8.2-1, -2); matching uses the inner filter.

``MqttSubscriptionTrie`` answers "who subscribed to a filter matching this topic name" (egress
fan-out); ``MqttTopicTrie`` answers "which stored topic names match this filter" (retained
messages on SUBSCRIBE). Both are iterative, so a topic with thousands of levels cannot exhaust
the stack, and neither is thread-safe: each belongs to one trio task or is guarded by its owner.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

MAX_TOPIC_BYTES: Final = 65535
SHARE_PREFIX: Final = "$share/"

# Below this many characters a str cannot exceed 65535 UTF-8 bytes (4 bytes per character at
# most), so the common case never encodes the string to measure it.
_SAFE_CHARS: Final = MAX_TOPIC_BYTES // 4

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class InvalidMqttTopicError(ValueError):
    """A topic name, filter or shared subscription breaks §4.7/§4.8; ``statement`` says which rule.

    The server answers per filter (SUBACK 0x80 in 3.1.1, 0x8F in v5) or per PUBLISH (v5 0x90).
    """

    def __init__(self, statement: str, detail: str) -> None:
        super().__init__(f"{statement} {detail}")
        self.statement = statement
        self.detail = detail


def _check_common(text: str, what: str) -> None:
    if not text:
        raise InvalidMqttTopicError("MQTT-4.7.3-1", f"a {what} must be at least one character long")
    if "\x00" in text:
        raise InvalidMqttTopicError("MQTT-4.7.3-2", f"a {what} must not contain U+0000")
    if not text.isascii():
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidMqttTopicError(
                "MQTT-1.5.3-1", f"a {what} must not contain surrogates (U+D800..U+DFFF)"
            ) from None
        if size > MAX_TOPIC_BYTES:
            raise InvalidMqttTopicError("MQTT-4.7.3-3", f"a {what} must not exceed 65535 bytes")
    elif len(text) > MAX_TOPIC_BYTES:
        raise InvalidMqttTopicError("MQTT-4.7.3-3", f"a {what} must not exceed 65535 bytes")


def validate_mqtt_topic_name(topic_name: str) -> None:
    """Raise ``InvalidMqttTopicError`` unless ``topic_name`` may be published to (§4.7).

    Names starting with ``$`` are syntactically valid; whether a client may publish to them is
    the broker's authorisation decision (MQTT-4.7.2-1 only constrains matching).
    """
    _check_common(topic_name, "topic name")
    if "+" in topic_name or "#" in topic_name:
        raise InvalidMqttTopicError("MQTT-4.7.1-1", "a topic name must not contain + or #")


def validate_mqtt_topic_filter(topic_filter: str) -> None:
    """Raise ``InvalidMqttTopicError`` unless ``topic_filter`` is a valid filter (§4.7).

    ``$share/...`` filters are checked only as plain filters here; use
    ``parse_shared_subscription`` for the shared-subscription rules.
    """
    _check_common(topic_filter, "topic filter")
    if "+" not in topic_filter and "#" not in topic_filter:
        return
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != last):
            raise InvalidMqttTopicError(
                "MQTT-4.7.1-2", "# must be the last character and alone in its level"
            )
        if "+" in level and level != "+":
            raise InvalidMqttTopicError("MQTT-4.7.1-3", "+ must occupy an entire level")


def is_valid_mqtt_topic_name(topic_name: str) -> bool:
    """True when ``validate_mqtt_topic_name`` would accept ``topic_name``."""
    try:
        validate_mqtt_topic_name(topic_name)
    except InvalidMqttTopicError:
        return False
    return True


def is_valid_mqtt_topic_filter(topic_filter: str) -> bool:
    """True when ``validate_mqtt_topic_filter`` would accept ``topic_filter``."""
    try:
        validate_mqtt_topic_filter(topic_filter)
    except InvalidMqttTopicError:
        return False
    return True


def has_mqtt_wildcards(topic_filter: str) -> bool:
    """True when the filter contains ``+`` or ``#`` (so it may match more than one name)."""
    return "+" in topic_filter or "#" in topic_filter


@dataclass(frozen=True, slots=True)
class SharedSubscription:
    """A parsed ``$share/{share_name}/{topic_filter}``."""

    share_name: str
    topic_filter: str


def parse_shared_subscription(topic_filter: str) -> SharedSubscription | None:
    """Split a shared subscription filter, or return None for a filter that is not one.

    Raises ``InvalidMqttTopicError`` for a ``$share/`` filter with an empty share name or one
    holding ``+`` or ``#`` (v5 MQTT-4.8.2-1, -2), for a missing inner filter, and for an invalid
    inner filter (§4.7). Does not validate a non-shared filter.
    """
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    share_name, slash, inner = topic_filter[len(SHARE_PREFIX) :].partition("/")
    if not share_name:
        raise InvalidMqttTopicError("v5 MQTT-4.8.2-1", "a shared subscription needs a share name")
    if "+" in share_name or "#" in share_name:
        raise InvalidMqttTopicError("v5 MQTT-4.8.2-2", "a share name must not contain + or #")
    if not slash or not inner:
        raise InvalidMqttTopicError(
            "v5 MQTT-4.8.2-2", "a share name must be followed by / and a topic filter"
        )
    validate_mqtt_topic_filter(inner)
    return SharedSubscription(share_name, inner)


def mqtt_topic_matches(topic_filter: str, topic_name: str) -> bool:
    """True when the valid ``topic_filter`` matches the valid ``topic_name`` (§4.7).

    Neither argument is validated (call the ``validate_*`` functions first); a shared
    subscription must be unwrapped with ``parse_shared_subscription`` before matching.
    """
    if "+" not in topic_filter and "#" not in topic_filter:
        return topic_filter == topic_name
    if topic_name[:1] == "$" and topic_filter[0] in "+#":
        return False  # MQTT-4.7.2-1
    filter_levels = topic_filter.split("/")
    name_levels = topic_name.split("/")
    depth = len(name_levels)
    for index, level in enumerate(filter_levels):
        if level == "#":
            return True  # also when the name stopped at the parent level: a/# matches a
        if index >= depth:
            return False
        if level != "+" and level != name_levels[index]:
            return False
    return len(filter_levels) == depth


class _FilterNode(Generic[K, V]):
    """One level of ``MqttSubscriptionTrie``: exact children, the ``+`` child, and two sets of ends.

    ``subs`` holds the subscriptions whose filter ends at this node; ``hash_subs`` those whose
    filter is this node's path followed by ``/#`` (they match this level and everything below).
    """

    __slots__ = ("children", "hash_subs", "plus", "subs")

    def __init__(self) -> None:
        self.children: dict[str, _FilterNode[K, V]] = {}
        self.plus: _FilterNode[K, V] | None = None
        self.subs: dict[K, V] | None = None
        self.hash_subs: dict[K, V] | None = None

    def is_empty(self) -> bool:
        return not self.children and self.plus is None and not self.subs and not self.hash_subs


class MqttSubscriptionTrie(Generic[K, V]):
    """Topic filters -> subscribers, answering "who matches this topic name" quickly.

    A subscription is the pair (filter, subscriber) with a value (the broker keeps the granted QoS
    and v5 options there). Adding the same pair again replaces its value, as a repeated SUBSCRIBE
    replaces the subscription (MQTT-3.8.4-3). ``match`` costs one dict lookup for filters without
    wildcards (kept in a flat dict, the common case of per-device command topics) plus a walk of
    the wildcard trie bounded by the number of topic levels times the branching of ``+``.

    Shared subscriptions are the caller's to unwrap: insert the inner filter with a subscriber
    key that names the share group, and pick one member per group after ``match``.
    """

    __slots__ = ("_count", "_exact", "_root", "_wildcards")

    def __init__(self) -> None:
        self._exact: dict[str, dict[K, V]] = {}
        self._root: _FilterNode[K, V] = _FilterNode()
        self._count = 0
        self._wildcards = 0

    def __len__(self) -> int:
        """The number of (filter, subscriber) subscriptions held."""
        return self._count

    def add(self, topic_filter: str, subscriber: K, value: V) -> bool:
        """Subscribe ``subscriber`` to ``topic_filter``; True if new, False if it replaced one.

        Raises ``InvalidMqttTopicError`` for an invalid filter (nothing is stored then).
        """
        validate_mqtt_topic_filter(topic_filter)
        if not has_mqtt_wildcards(topic_filter):
            subs = self._exact.setdefault(topic_filter, {})
        else:
            node = self._root
            levels = topic_filter.split("/")
            multi = levels[-1] == "#"
            if multi:
                levels.pop()
            for level in levels:
                if level == "+":
                    if node.plus is None:
                        node.plus = _FilterNode()
                    node = node.plus
                else:
                    child = node.children.get(level)
                    if child is None:
                        child = node.children[level] = _FilterNode()
                    node = child
            if multi:
                if node.hash_subs is None:
                    node.hash_subs = {}
                subs = node.hash_subs
            else:
                if node.subs is None:
                    node.subs = {}
                subs = node.subs
        new = subscriber not in subs
        subs[subscriber] = value
        if new:
            self._count += 1
            self._wildcards += has_mqtt_wildcards(topic_filter)
        return new

    def remove(self, topic_filter: str, subscriber: K) -> bool:
        """Unsubscribe; True if the subscription existed. Prunes levels left empty."""
        if not has_mqtt_wildcards(topic_filter):
            subs = self._exact.get(topic_filter)
            if subs is None or subscriber not in subs:
                return False
            del subs[subscriber]
            if not subs:
                del self._exact[topic_filter]
            self._count -= 1
            return True
        levels = topic_filter.split("/")
        multi = levels[-1] == "#"
        if multi:
            levels.pop()
        path: list[tuple[_FilterNode[K, V], str]] = []  # (parent, level) down to the end node
        node = self._root
        for level in levels:
            child = node.plus if level == "+" else node.children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        subs = node.hash_subs if multi else node.subs
        if subs is None or subscriber not in subs:
            return False
        del subs[subscriber]
        self._count -= 1
        self._wildcards -= 1
        # Prune from the bottom so that unsubscribing everything returns the trie to empty.
        for parent, level in reversed(path):
            if not node.is_empty():
                break
            if level == "+":
                parent.plus = None
            else:
                del parent.children[level]
            node = parent
        return True

    def get(self, topic_filter: str, subscriber: K) -> V | None:
        """The value of one subscription, or None if it does not exist."""
        if not has_mqtt_wildcards(topic_filter):
            return self._exact.get(topic_filter, {}).get(subscriber)
        levels = topic_filter.split("/")
        multi = levels[-1] == "#"
        if multi:
            levels.pop()
        node: _FilterNode[K, V] | None = self._root
        for level in levels:
            assert node is not None
            node = node.plus if level == "+" else node.children.get(level)
            if node is None:
                return None
        assert node is not None
        subs = node.hash_subs if multi else node.subs
        return None if subs is None else subs.get(subscriber)

    def match(self, topic_name: str) -> list[tuple[K, V]]:
        """Every (subscriber, value) whose filter matches the valid ``topic_name``.

        One entry per matching subscription, in no particular order: a subscriber with
        overlapping filters appears once per filter, and the caller delivers once at the highest
        QoS or once per subscription (both are allowed, MQTT-3.3.5-1).
        """
        result: list[tuple[K, V]] = []
        exact = self._exact.get(topic_name)
        if exact:
            result.extend(exact.items())
        if not self._wildcards:
            return result
        root = self._root
        # MQTT-4.7.2-1: at the first level, + and # must not match a name starting with $.
        dollar = topic_name[:1] == "$"
        nodes = [root]
        for level in topic_name.split("/"):
            following: list[_FilterNode[K, V]] = []
            for node in nodes:
                wildcard_ok = not (dollar and node is root)
                if node.hash_subs and wildcard_ok:
                    result.extend(node.hash_subs.items())
                child = node.children.get(level)
                if child is not None:
                    following.append(child)
                if node.plus is not None and wildcard_ok:
                    following.append(node.plus)
            nodes = following
            if not nodes:
                return result
        for node in nodes:
            if node.subs:
                result.extend(node.subs.items())
            if node.hash_subs:  # a/# matches a
                result.extend(node.hash_subs.items())
        return result

    def match_subscribers(self, topic_name: str) -> set[K]:
        """The distinct subscribers with at least one filter matching ``topic_name``."""
        return {subscriber for subscriber, _ in self.match(topic_name)}


class _TopicNode(Generic[V]):
    """One level of ``MqttTopicTrie``; ``entry`` is (topic name, value) when a name ends here."""

    __slots__ = ("children", "entry")

    def __init__(self) -> None:
        self.children: dict[str, _TopicNode[V]] = {}
        self.entry: tuple[str, V] | None = None


class MqttTopicTrie(Generic[V]):
    """Topic names -> values, answering "which names match this filter" (retained messages).

    ``set`` replaces the value of a name; ``delete`` removes it (an empty retained payload,
    MQTT-3.3.1-10). ``match`` walks only the branches the filter can reach; ``#`` visits the
    whole subtree below its level, so ``SUBSCRIBE #`` is linear in the number of stored names.
    """

    __slots__ = ("_count", "_root")

    def __init__(self) -> None:
        self._root: _TopicNode[V] = _TopicNode()
        self._count = 0

    def __len__(self) -> int:
        """The number of stored topic names."""
        return self._count

    def __contains__(self, topic_name: object) -> bool:
        return isinstance(topic_name, str) and self._find(topic_name) is not None

    def _find(self, topic_name: str) -> tuple[str, V] | None:
        node: _TopicNode[V] | None = self._root
        for level in topic_name.split("/"):
            assert node is not None
            node = node.children.get(level)
            if node is None:
                return None
        assert node is not None
        return node.entry

    def set(self, topic_name: str, value: V) -> None:
        """Store ``value`` under ``topic_name``, replacing any previous value.

        Raises ``InvalidMqttTopicError`` for an invalid topic name.
        """
        validate_mqtt_topic_name(topic_name)
        node = self._root
        for level in topic_name.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _TopicNode()
            node = child
        if node.entry is None:
            self._count += 1
        node.entry = (topic_name, value)

    def get(self, topic_name: str) -> V | None:
        """The value stored under ``topic_name``, or None."""
        entry = self._find(topic_name)
        return None if entry is None else entry[1]

    def delete(self, topic_name: str) -> bool:
        """Remove ``topic_name``; True if it was stored. Prunes levels left empty."""
        path: list[tuple[_TopicNode[V], str]] = []
        node = self._root
        for level in topic_name.split("/"):
            child = node.children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        if node.entry is None:
            return False
        node.entry = None
        self._count -= 1
        for parent, level in reversed(path):
            if node.children or node.entry is not None:
                break
            del parent.children[level]
            node = parent
        return True

    def items(self) -> Iterator[tuple[str, V]]:
        """Every (topic name, value), in no particular order."""
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node.entry is not None:
                yield node.entry
            stack.extend(node.children.values())

    def match(self, topic_filter: str) -> list[tuple[str, V]]:
        """Every stored (topic name, value) that the valid ``topic_filter`` matches (§4.7).

        The filter is not validated; unwrap ``$share/`` filters first. Order is unspecified.
        """
        if not has_mqtt_wildcards(topic_filter):
            entry = self._find(topic_filter)
            return [] if entry is None else [entry]
        levels = topic_filter.split("/")
        depth = len(levels)
        result: list[tuple[str, V]] = []
        stack: list[tuple[_TopicNode[V], int]] = [(self._root, 0)]
        while stack:
            node, index = stack.pop()
            if index == depth:
                if node.entry is not None:
                    result.append(node.entry)
                continue
            level = levels[index]
            if level == "#":
                if node.entry is not None:  # a/# matches a (the root never holds an entry)
                    result.append(node.entry)
                below = [
                    child
                    for name, child in node.children.items()
                    if index or name[:1] != "$"  # MQTT-4.7.2-1
                ]
                while below:
                    sub = below.pop()
                    if sub.entry is not None:
                        result.append(sub.entry)
                    below.extend(sub.children.values())
            elif level == "+":
                for name, child in node.children.items():
                    if index or name[:1] != "$":  # MQTT-4.7.2-1
                        stack.append((child, index + 1))
            else:
                exact = node.children.get(level)
                if exact is not None:
                    stack.append((exact, index + 1))
        return result
