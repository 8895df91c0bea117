"""MQTT topic names, filters and matching (§4.7, v5 §4.8.2) against a reference and the spec.

The reference matcher below is written straight from the spec's prose, by recursion over levels,
and shares no code with ``protocol.mqtt._topics``; hypothesis compares it with
``mqtt_topic_matches`` and with both tries on generated names and filters that favour the tricky
cases (``$``, empty levels, ``#`` matching its parent level).
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from kafkaesque.protocol.mqtt import (
    InvalidMqttTopicError,
    MqttSubscriptionTrie,
    MqttTopicTrie,
    SharedSubscription,
    is_valid_mqtt_topic_filter,
    is_valid_mqtt_topic_name,
    mqtt_topic_matches,
    parse_shared_subscription,
    validate_mqtt_topic_filter,
    validate_mqtt_topic_name,
)


def reference_matches(topic_filter: str, topic_name: str) -> bool:
    """§4.7 by the letter: level by level, + takes one level, # takes the rest (even none)."""
    if topic_name.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False  # MQTT-4.7.2-1

    def match(filter_levels: list[str], name_levels: list[str]) -> bool:
        if not filter_levels:
            return not name_levels
        head, rest = filter_levels[0], filter_levels[1:]
        if head == "#":
            return True  # the remaining levels, including none at all (a/# matches a)
        if not name_levels:
            return False
        if head == "+" or head == name_levels[0]:
            return match(rest, name_levels[1:])
        return False

    return match(topic_filter.split("/"), topic_name.split("/"))


# Few distinct level values, so that generated filters and names collide often.
_NAME_LEVELS = st.sampled_from(["a", "b", "", "$", "$SYS", "ab", "é", " "])
_FILTER_LEVELS = st.sampled_from(["a", "b", "", "$SYS", "+", "+", "é"])
topic_names = st.lists(_NAME_LEVELS, min_size=1, max_size=5).map("/".join).filter(bool)


@st.composite
def topic_filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(_FILTER_LEVELS, min_size=0, max_size=5))
    if levels == [""] or not levels or draw(st.booleans()):
        levels.append("#")
    return "/".join(levels)


# --- the spec's own examples (3.1.1 §4.7.1.2, §4.7.1.3, §4.7.2) ----------------------------


@pytest.mark.parametrize(
    ("topic_filter", "topic_name", "expected"),
    [
        # 4.7.1.2 multi-level wildcard
        ("sport/tennis/player1/#", "sport/tennis/player1", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
        ("sport/#", "sport", True),
        ("#", "sport/tennis", True),
        # 4.7.1.3 single-level wildcard
        ("sport/tennis/+", "sport/tennis/player1", True),
        ("sport/tennis/+", "sport/tennis/player2", True),
        ("sport/tennis/+", "sport/tennis/player1/ranking", False),
        ("sport/+", "sport", False),
        ("sport/+", "sport/", True),
        ("+/+", "/finance", True),
        ("/+", "/finance", True),
        ("+", "/finance", False),
        # 4.7.2 topics beginning with $
        ("#", "$SYS/monitor/Clients", False),
        ("+/monitor/Clients", "$SYS/monitor/Clients", False),
        ("$SYS/#", "$SYS/monitor/Clients", True),
        ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
        ("$SYS/#", "$SYS", True),
        # case and empty levels are significant (MQTT-4.7.3-4)
        ("ACCOUNTS", "Accounts", False),
        ("a/+/c", "a//c", True),
        ("/#", "/", True),
        ("a", "a/", False),
        # a wildcard that is not first does match levels starting with $
        ("a/+", "a/$b", True),
    ],
)
def test_spec_examples_4_7(topic_filter: str, topic_name: str, expected: bool) -> None:
    """MQTT-4.7.1-2, MQTT-4.7.1-3, MQTT-4.7.2-1: the worked examples of the specification."""
    assert mqtt_topic_matches(topic_filter, topic_name) is expected
    assert reference_matches(topic_filter, topic_name) is expected
    trie: MqttSubscriptionTrie[str, int] = MqttSubscriptionTrie()
    trie.add(topic_filter, "s", 1)
    assert (trie.match(topic_name) == [("s", 1)]) is expected
    names: MqttTopicTrie[int] = MqttTopicTrie()
    names.set(topic_name, 7)
    assert (names.match(topic_filter) == [(topic_name, 7)]) is expected


# --- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "topic_filter",
    ["#", "+", "sport/tennis/#", "+/tennis/#", "sport/+/player1", "/", "//", "a//+/", "$SYS/#"],
)
def test_valid_filters(topic_filter: str) -> None:
    """MQTT-4.7.1-2 / MQTT-4.7.1-3: wildcards that fill whole levels, # last."""
    validate_mqtt_topic_filter(topic_filter)
    assert is_valid_mqtt_topic_filter(topic_filter)


@pytest.mark.parametrize(
    ("topic_filter", "statement"),
    [
        ("sport/tennis#", "MQTT-4.7.1-2"),
        ("sport/tennis/#/ranking", "MQTT-4.7.1-2"),
        ("##", "MQTT-4.7.1-2"),
        ("#/", "MQTT-4.7.1-2"),
        ("sport+", "MQTT-4.7.1-3"),
        ("+a/b", "MQTT-4.7.1-3"),
        ("", "MQTT-4.7.3-1"),
        ("a\x00b", "MQTT-4.7.3-2"),
        ("a" * 65536, "MQTT-4.7.3-3"),
        ("é" * 32768, "MQTT-4.7.3-3"),  # 65536 UTF-8 bytes in fewer characters
        ("a\ud800", "MQTT-1.5.3-1"),
    ],
)
def test_invalid_filters(topic_filter: str, statement: str) -> None:
    """Each invalid filter names the rule it breaks (MQTT-4.7.1-2/-3, MQTT-4.7.3-1..3)."""
    with pytest.raises(InvalidMqttTopicError) as info:
        validate_mqtt_topic_filter(topic_filter)
    assert info.value.statement == statement
    assert str(info.value).startswith(statement)
    assert not is_valid_mqtt_topic_filter(topic_filter)


@pytest.mark.parametrize(
    ("topic_name", "statement"),
    [
        ("a/+", "MQTT-4.7.1-1"),
        ("a/#", "MQTT-4.7.1-1"),
        ("", "MQTT-4.7.3-1"),
        ("\x00", "MQTT-4.7.3-2"),
        ("x" * 65536, "MQTT-4.7.3-3"),
    ],
)
def test_invalid_names(topic_name: str, statement: str) -> None:
    """Topic names carry no wildcard (MQTT-4.7.1-1) and obey MQTT-4.7.3-1..3."""
    with pytest.raises(InvalidMqttTopicError) as info:
        validate_mqtt_topic_name(topic_name)
    assert info.value.statement == statement
    assert not is_valid_mqtt_topic_name(topic_name)


@pytest.mark.parametrize("topic_name", ["/", "a b", "$SYS/x", "é/ü", "x" * 65535, "\ufeff"])
def test_valid_names(topic_name: str) -> None:
    """Spaces, $, empty levels, a BOM (MQTT-1.5.3-3) and exactly 65535 bytes are all legal."""
    validate_mqtt_topic_name(topic_name)


# --- shared subscriptions -----------------------------------------------------------------


def test_shared_subscription_parsing() -> None:
    """v5 §4.8.2: $share/{ShareName}/{filter}; other filters are not shared."""
    assert parse_shared_subscription("$share/g1/a/+/#") == SharedSubscription("g1", "a/+/#")
    assert parse_shared_subscription("$share/g/#") == SharedSubscription("g", "#")
    assert parse_shared_subscription("$share/g//") == SharedSubscription("g", "/")
    assert parse_shared_subscription("$SYS/#") is None
    assert parse_shared_subscription("$shared/g/a") is None
    assert parse_shared_subscription("a/$share/g/b") is None


@pytest.mark.parametrize(
    ("topic_filter", "statement"),
    [
        ("$share//a", "v5 MQTT-4.8.2-1"),
        ("$share/", "v5 MQTT-4.8.2-1"),
        ("$share/+/a", "v5 MQTT-4.8.2-2"),
        ("$share/g#/a", "v5 MQTT-4.8.2-2"),
        ("$share/g", "v5 MQTT-4.8.2-2"),
        ("$share/g/", "v5 MQTT-4.8.2-2"),
        ("$share/g/a/#/b", "MQTT-4.7.1-2"),
    ],
)
def test_invalid_shared_subscriptions(topic_filter: str, statement: str) -> None:
    """v5 MQTT-4.8.2-1/-2: a non-empty share name without / + #, then / and a valid filter."""
    with pytest.raises(InvalidMqttTopicError) as info:
        parse_shared_subscription(topic_filter)
    assert info.value.statement == statement


# --- differential: reference vs matcher vs tries --------------------------------------------


@given(topic_filter=topic_filters(), topic_name=topic_names)
def test_matcher_agrees_with_reference(topic_filter: str, topic_name: str) -> None:
    """mqtt_topic_matches == the spec's recursion, on generated valid pairs."""
    validate_mqtt_topic_filter(topic_filter)
    validate_mqtt_topic_name(topic_name)
    assert mqtt_topic_matches(topic_filter, topic_name) == reference_matches(
        topic_filter, topic_name
    )


@settings(max_examples=150)
@given(
    filters=st.lists(topic_filters(), min_size=1, max_size=25),
    names=st.lists(topic_names, min_size=1, max_size=25),
)
def test_subscription_trie_agrees_with_reference(filters: list[str], names: list[str]) -> None:
    """Every (filter, subscriber) the reference matches, and only those, come out of match()."""
    trie: MqttSubscriptionTrie[int, str] = MqttSubscriptionTrie()
    subscriptions = {(topic_filter, index % 3) for index, topic_filter in enumerate(filters)}
    for topic_filter, subscriber in subscriptions:
        trie.add(topic_filter, subscriber, topic_filter)
    assert len(trie) == len(subscriptions)
    for name in names:
        expected = sorted(
            (subscriber, topic_filter)
            for topic_filter, subscriber in subscriptions
            if reference_matches(topic_filter, name)
        )
        assert sorted(trie.match(name)) == expected
        assert trie.match_subscribers(name) == {subscriber for subscriber, _ in expected}


@settings(max_examples=150)
@given(
    filters=st.lists(topic_filters(), min_size=1, max_size=25),
    names=st.lists(topic_names, min_size=1, max_size=25),
)
def test_topic_trie_agrees_with_reference(filters: list[str], names: list[str]) -> None:
    """Retained lookup: match(filter) returns exactly the stored names the reference matches."""
    trie: MqttTopicTrie[int] = MqttTopicTrie()
    stored = {name: index for index, name in enumerate(names)}
    for name, index in stored.items():
        trie.set(name, index)
    assert len(trie) == len(stored)
    assert sorted(trie.items()) == sorted(stored.items())
    for topic_filter in filters:
        expected = sorted((n, i) for n, i in stored.items() if reference_matches(topic_filter, n))
        assert sorted(trie.match(topic_filter)) == expected


@given(
    operations=st.lists(
        st.tuples(st.booleans(), topic_filters() | topic_names, st.integers(0, 2)), max_size=40
    ),
    probe=st.lists(topic_names, max_size=10),
)
def test_subscription_trie_add_remove_model(
    operations: list[tuple[bool, str, int]], probe: list[str]
) -> None:
    """Adds and removes in any order behave like a set of pairs; removing all leaves it empty."""
    trie: MqttSubscriptionTrie[int, int] = MqttSubscriptionTrie()
    model: dict[tuple[str, int], int] = {}
    for step, (add, topic_filter, subscriber) in enumerate(operations):
        if add:
            assert trie.add(topic_filter, subscriber, step) == (
                (topic_filter, subscriber) not in model
            )
            model[topic_filter, subscriber] = step
        else:
            existed = model.pop((topic_filter, subscriber), None) is not None
            assert trie.remove(topic_filter, subscriber) == existed
        assert len(trie) == len(model)
    for (topic_filter, subscriber), value in model.items():
        assert trie.get(topic_filter, subscriber) == value
    for name in probe:
        expected = sorted(
            (subscriber, value)
            for (topic_filter, subscriber), value in model.items()
            if reference_matches(topic_filter, name)
        )
        assert sorted(trie.match(name)) == expected
    for topic_filter, subscriber in list(model):
        assert trie.remove(topic_filter, subscriber)
    assert len(trie) == 0
    assert trie.match("a") == []
    root = trie._root  # pruning left no empty level behind
    assert root.is_empty() and not trie._exact


def test_subscription_trie_rejects_invalid_filters() -> None:
    """add() validates: an invalid filter raises and stores nothing (MQTT-4.7.1-2)."""
    trie: MqttSubscriptionTrie[str, int] = MqttSubscriptionTrie()
    with pytest.raises(InvalidMqttTopicError):
        trie.add("a/#/b", "s", 1)
    assert len(trie) == 0
    assert trie.remove("a/#/b", "s") is False
    assert trie.get("a/+", "s") is None


def test_subscription_trie_replaces_and_reports_overlaps() -> None:
    """A repeated SUBSCRIBE replaces the value (MQTT-3.8.4-3); overlaps come once per filter."""
    trie: MqttSubscriptionTrie[str, int] = MqttSubscriptionTrie()
    assert trie.add("a/+", "s", 0)
    assert not trie.add("a/+", "s", 1)
    assert trie.add("a/#", "s", 2)
    assert trie.add("a/b", "s", 0)
    assert trie.add("#", "t", 1)
    assert sorted(trie.match("a/b")) == [("s", 0), ("s", 1), ("s", 2), ("t", 1)]
    assert trie.get("a/+", "s") == 1
    assert trie.match("$a/b") == []


def test_topic_trie_set_get_delete() -> None:
    """Retained store: replace, delete (MQTT-3.3.1-10), prune, and the $ rule on # and +."""
    trie: MqttTopicTrie[str] = MqttTopicTrie()
    trie.set("a/b", "1")
    trie.set("a/b", "2")
    trie.set("a", "3")
    trie.set("$SYS/x", "4")
    assert len(trie) == 3
    assert trie.get("a/b") == "2"
    assert "a" in trie and "a/c" not in trie and 5 not in trie
    assert sorted(trie.match("#")) == [("a", "3"), ("a/b", "2")]
    assert trie.match("+/x") == []
    assert trie.match("$SYS/+") == [("$SYS/x", "4")]
    assert trie.delete("a/b")
    assert not trie.delete("a/b")
    assert not trie.delete("zz")
    assert trie.get("a/b") is None
    assert trie.delete("a") and trie.delete("$SYS/x")
    assert len(trie) == 0 and not trie._root.children
    with pytest.raises(InvalidMqttTopicError):
        trie.set("a/+", "x")


def test_deep_topics_do_not_exhaust_the_stack() -> None:
    """A 30000-level topic (legal: 65535 bytes) works in both tries: no recursion anywhere."""
    deep = "/".join(["x"] * 30000)
    subs: MqttSubscriptionTrie[str, int] = MqttSubscriptionTrie()
    subs.add("/".join(["+"] * 30000), "plus", 1)
    subs.add("x/#", "hash", 2)
    assert sorted(subs.match(deep)) == [("hash", 2), ("plus", 1)]
    assert subs.remove("/".join(["+"] * 30000), "plus")
    names: MqttTopicTrie[int] = MqttTopicTrie()
    names.set(deep, 1)
    assert names.match("#") == [(deep, 1)]
    assert names.match("/".join(["+"] * 30000)) == [(deep, 1)]
    assert list(names.items()) == [(deep, 1)]
    assert names.delete(deep)
