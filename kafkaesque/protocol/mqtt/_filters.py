"""Which log topics a subscription filter can receive messages from (pure functions).

A broker reads a log topic for its devices only while one of its subscriptions may match an
MQTT topic that the mapping routes there: a device subscribed to ``phones/p7/commands`` makes
the broker tail ``commands`` (rule ``phones/+/commands -> commands``), not ``readings``. The
answer may include a log topic that never delivers (an over-approximation costs a reader),
never miss one (that would lose deliveries).
"""

from __future__ import annotations

from ._mapping import TopicMapping
from ._topics import parse_shared_subscription


def filters_overlap(a: str, b: str) -> bool:
    """Whether some topic name matches both filters ``a`` and ``b``."""
    la, lb = a.split("/"), b.split("/")
    for i in range(max(len(la), len(lb))):
        x = la[i] if i < len(la) else None
        y = lb[i] if i < len(lb) else None
        if x == "#" or y == "#":
            return True
        if x is None or y is None:
            return False
        if "+" not in (x, y) and x != y:
            return False
    return True


def filter_covers(general: str, specific: str) -> bool:
    """Whether every topic name matching ``specific`` matches ``general`` too."""
    lg, ls = general.split("/"), specific.split("/")
    for i, g in enumerate(lg):
        if g == "#":
            return True
        if i >= len(ls):
            return False
        s = ls[i]
        if s == "#" or (g != "+" and (s == "+" or g != s)):
            return False
    return len(lg) == len(ls)


def inner_filter(topic_filter: str) -> str:
    """The filter itself, or the filter inside a ``$share/group/filter``."""
    shared = parse_shared_subscription(topic_filter)
    return topic_filter if shared is None else shared.topic_filter


def log_topics_for(mapping: TopicMapping, topic_filter: str) -> frozenset[str]:
    """The log topics holding messages that a subscription to ``topic_filter`` may receive.

    Every rule whose filter overlaps it names one (records appended by other clients, without an
    ``mqtt.topic`` header, are delivered on a topic matching their rule's filter); the fallback
    log topic is included unless some rule covers the filter entirely (first match wins, so no
    topic of the filter can fall through to it). A rule with a log topic template names none:
    its log topics are not known beforehand (the module docstring of ``_mapping``).
    """
    topic_filter = inner_filter(topic_filter)
    found = {
        r.log_topic
        for r in mapping.rules
        if r.template is None and filters_overlap(r.topic_filter, topic_filter)
    }
    if not any(filter_covers(r.topic_filter, topic_filter) for r in mapping.rules):
        found.add(mapping.default_log_topic)
    return frozenset(found)
