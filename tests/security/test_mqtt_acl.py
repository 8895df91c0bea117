"""kafkaesque.security._mqtt_acl: mosquitto's acl_file semantics, pure."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import example, given, settings

from kafkaesque.protocol.mqtt import mqtt_topic_matches
from kafkaesque.security._mqtt_acl import (
    MqttAcl,
    MqttAclError,
    filter_covers,
    filters_overlap,
)

FILE = """\
# anonymous clients
topic read public/#

user alice
topic readwrite phones/alice/#
topic deny phones/alice/secret
topic write logs/alice

user bob
topic read phones/+/status

pattern write phones/%c/spectrum
pattern read phones/%c/commands
pattern readwrite users/%u/#
"""


@pytest.fixture
def acl() -> MqttAcl:
    return MqttAcl.parse(FILE)


def test_anonymous_lines_come_before_any_user(acl: MqttAcl) -> None:
    assert acl.can_receive(None, "c1", "public/news")
    assert not acl.can_publish(None, "c1", "public/news")
    assert not acl.can_receive("alice", "c1", "public/news")  # a user does not get them


def test_user_lines_are_the_users_own(acl: MqttAcl) -> None:
    assert acl.can_publish("alice", "x", "phones/alice/temp")
    assert acl.can_receive("alice", "x", "phones/alice/temp")
    assert acl.can_publish("alice", "x", "logs/alice")
    assert not acl.can_receive("alice", "x", "logs/alice")  # write only
    assert not acl.can_publish("bob", "x", "phones/alice/temp")
    assert acl.can_receive("bob", "x", "phones/p7/status")
    assert not acl.can_publish("bob", "x", "phones/p7/status")
    assert not acl.can_publish("carol", "x", "phones/alice/temp")  # not listed: patterns only


def test_deny_is_checked_before_grants(acl: MqttAcl) -> None:
    assert not acl.can_publish("alice", "x", "phones/alice/secret")
    assert not acl.can_receive("alice", "x", "phones/alice/secret")
    assert not acl.can_subscribe("alice", "x", "phones/alice/#")  # would match the secret
    assert acl.can_subscribe("alice", "x", "phones/alice/temp")
    assert acl.can_subscribe("alice", "x", "phones/alice/+/deeper")


def test_patterns_substitute_the_client_id_and_user(acl: MqttAcl) -> None:
    assert acl.can_publish("carol", "p1", "phones/p1/spectrum")
    assert acl.can_publish(None, "p1", "phones/p1/spectrum")  # patterns apply to everyone
    assert not acl.can_publish("carol", "p1", "phones/p2/spectrum")
    assert acl.can_subscribe("carol", "p1", "phones/p1/commands")
    assert not acl.can_subscribe("carol", "p1", "phones/p2/commands")
    assert not acl.can_subscribe("carol", "p1", "phones/+/commands")
    assert acl.can_publish("carol", "c", "users/carol/a/b")
    assert acl.can_subscribe("carol", "c", "users/carol/#")
    assert not acl.can_publish(None, "c", "users//a")  # %u of an anonymous client: no match


@pytest.mark.parametrize("client_id", ["+", "#", "p1/x", "a+b"])
def test_a_client_id_with_wildcards_or_slashes_never_matches(acl: MqttAcl, client_id: str) -> None:
    assert not acl.can_publish("carol", client_id, f"phones/{client_id}/spectrum")
    assert not acl.can_publish("carol", client_id, "phones/p1/spectrum")
    assert not acl.can_subscribe("carol", client_id, "phones/+/commands")
    assert not acl.can_receive("carol", client_id, "phones/p1/commands")


def test_a_user_name_with_a_slash_never_matches(acl: MqttAcl) -> None:
    assert not acl.can_publish("a/b", "c", "users/a/b/x")


def test_an_empty_file_allows_nothing() -> None:
    acl = MqttAcl.parse("# nothing\n")
    assert not acl.can_publish(None, "c", "a")
    assert not acl.can_subscribe("u", "c", "#")
    assert not acl.can_receive("u", "c", "a")


def test_access_defaults_to_readwrite_and_topics_may_hold_spaces() -> None:
    acl = MqttAcl.parse("topic a b/c\n")
    assert acl.can_publish(None, "c", "a b/c")
    assert acl.can_receive(None, "c", "a b/c")


def test_a_shared_subscription_is_checked_by_its_filter(acl: MqttAcl) -> None:
    assert acl.can_subscribe("bob", "x", "$share/g/phones/+/status")
    assert not acl.can_subscribe("bob", "x", "$share/g/phones/#")
    assert not acl.can_subscribe("bob", "x", "$share//phones/+/status")


def test_wildcards_do_not_reach_dollar_topics() -> None:
    acl = MqttAcl.parse("topic read #\n")
    assert acl.can_subscribe(None, "c", "a/#")
    assert not acl.can_subscribe(None, "c", "$SYS/#")
    assert not acl.can_receive(None, "c", "$SYS/x")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bogus a/b\n", "line 1: expected 'topic', 'pattern' or 'user'"),
        ("topic read\n", "line 1: a topic filter is missing"),
        ("\ntopic\n", "line 2: a topic filter is missing"),
        ("topic read a/#/b\n", "line 1: 'a/#/b' is not a topic filter"),
        ("user\n", "line 1: 'user' needs a user name"),
    ],
)
def test_a_bad_line_is_refused_with_its_number(text: str, message: str) -> None:
    with pytest.raises(MqttAclError, match=message):
        MqttAcl.parse(text, source="acl.conf")


def test_load_reads_a_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "acl.conf"
    path.write_text(FILE)
    assert MqttAcl.load(str(path)) == MqttAcl.parse(FILE, source=str(path))
    with pytest.raises(MqttAclError, match="cannot read"):
        MqttAcl.load(str(tmp_path / "missing"))


@pytest.mark.parametrize(
    ("grant", "topic_filter", "covers", "overlap"),
    [
        ("a/#", "a", True, True),
        ("a/#", "a/b/c", True, True),
        ("a/+", "a/#", False, True),
        ("a/+", "a", False, False),
        ("a", "a/#", False, True),
        ("+/b", "a/b", True, True),
        ("a/b", "+/b", False, True),
        ("#", "+/+", True, True),
        ("#", "$SYS/x", False, False),
        ("$SYS/#", "$SYS/+", True, True),
        ("a/b", "a/c", False, False),
        ("a/+/c", "a/b/+", False, True),
    ],
)
def test_covers_and_overlaps(grant: str, topic_filter: str, covers: bool, overlap: bool) -> None:
    assert filter_covers(grant, topic_filter) is covers
    assert filters_overlap(grant, topic_filter) is overlap
    assert filters_overlap(topic_filter, grant) is overlap


# -- properties --------------------------------------------------------------------------------

LEVELS = ["a", "b", "$s", "", "p1", "alice"]
literal_levels = st.lists(st.sampled_from(LEVELS), min_size=1, max_size=4)


@st.composite
def filters(draw: st.DrawFn, placeholders: bool = False) -> str:
    choices = [*LEVELS, "+"] + (["%c", "%u"] if placeholders else [])
    levels = draw(st.lists(st.sampled_from(choices), min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels) or "a"  # (a filter, like a topic name, is never empty)


topics = literal_levels.map(lambda levels: "/".join(levels) or "a")


def _instances(topic_filter: str) -> list[str]:
    """Topic names the filter matches: each + and # replaced by a few level choices."""
    names = [""]
    for index, level in enumerate(topic_filter.split("/")):
        sep = "/" if index else ""
        if level == "+":
            names = [n + sep + x for n in names for x in LEVELS]
        elif level == "#":
            grown = [n + sep + x for n in names for x in ["a", "$s", "a/b", ""]]
            names = [*names, *grown] if index else grown
        else:
            names = [n + sep + level for n in names]
    return [n for n in names if n and mqtt_topic_matches(topic_filter, n)]


@st.composite
def acl_files(draw: st.DrawFn) -> str:
    lines = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["topic", "pattern", "user"]))
        if kind == "user":
            lines.append(f"user {draw(st.sampled_from(['alice', 'bob']))}")
            continue
        access = draw(st.sampled_from(["read", "write", "readwrite", "deny", ""]))
        topic_filter = draw(filters(placeholders=kind == "pattern"))
        lines.append(f"{kind} {access} {topic_filter}".replace("  ", " "))
    return "\n".join(lines) + "\n"


users = st.sampled_from([None, "alice", "bob"])
client_ids = st.sampled_from(["p1", "a", "+", "x/y"])


@settings(max_examples=400, deadline=None)
@given(acl_files(), users, client_ids, filters())
@example("topic read #\ntopic deny a/b\n", None, "p1", "a/+")
@example("pattern read a/%c/#\npattern deny a/p1/b\n", "bob", "p1", "a/+/+")
def test_a_granted_subscription_receives_every_topic_it_matches(
    text: str, user: str | None, client_id: str, topic_filter: str
) -> None:
    acl = MqttAcl.parse(text)
    if acl.can_subscribe(user, client_id, topic_filter):
        for topic in _instances(topic_filter):
            assert acl.can_receive(user, client_id, topic), (topic_filter, topic)


@settings(max_examples=300, deadline=None)
@given(filters(), filters(), topics)
def test_covers_and_overlap_agree_with_matching(a: str, b: str, topic: str) -> None:
    if filter_covers(a, b) and mqtt_topic_matches(b, topic):
        assert mqtt_topic_matches(a, topic)
    if mqtt_topic_matches(a, topic) and mqtt_topic_matches(b, topic):
        assert filters_overlap(a, b)


@settings(max_examples=300, deadline=None)
@given(acl_files(), users, client_ids, topics)
def test_a_topic_is_its_own_subscription(
    text: str, user: str | None, client_id: str, topic: str
) -> None:
    acl = MqttAcl.parse(text)
    assert acl.can_subscribe(user, client_id, topic) == acl.can_receive(user, client_id, topic)
    client = acl.for_client(user, client_id)
    for _ in range(2):  # the second time from its cache
        assert client.can_publish(topic) == acl.can_publish(user, client_id, topic)
        assert client.can_receive(topic) == acl.can_receive(user, client_id, topic)
        assert client.can_subscribe(topic) == acl.can_subscribe(user, client_id, topic)
