"""Which log topics a subscription may receive from: overlap and coverage of topic filters."""

from __future__ import annotations

import pytest

from kafkaesque.protocol.mqtt import TopicMapping, filter_covers, filters_overlap, log_topics_for


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ("a/b", "a/b", True),
        ("a/b", "a/c", False),
        ("a/+", "a/b", True),
        ("a/+", "a/b/c", False),
        ("a/#", "a/b/c", True),
        ("#", "x", True),
        ("a/+/c", "+/b/+", True),
        ("a", "a/b", False),
        ("a/#", "a", True),
    ],
)
def test_filters_overlap(a: str, b: str, overlap: bool) -> None:
    assert filters_overlap(a, b) is overlap
    assert filters_overlap(b, a) is overlap


@pytest.mark.parametrize(
    ("general", "specific", "covers"),
    [
        ("phones/+/commands", "phones/p7/commands", True),
        ("phones/+/commands", "phones/+/commands", True),
        ("phones/+/commands", "phones/#", False),
        ("phones/#", "phones/+/commands", True),
        ("#", "anything/#", True),
        ("a/b", "a/+", False),
        ("a/+", "a/b/c", False),
    ],
)
def test_filter_covers(general: str, specific: str, covers: bool) -> None:
    assert filter_covers(general, specific) is covers


RULES = TopicMapping.parse(
    "phones/+/spectrum -> readings key=1\nphones/+/commands -> commands key=1\n"
)


def test_a_device_command_subscription_reads_only_commands() -> None:
    assert log_topics_for(RULES, "phones/p7/commands") == {"commands"}


def test_a_dashboard_wildcard_reads_everything_it_may_match() -> None:
    assert log_topics_for(RULES, "phones/#") == {"readings", "commands", "mqtt"}
    assert log_topics_for(RULES, "other/topic") == {"mqtt"}


def test_shared_subscriptions_use_their_inner_filter() -> None:
    assert log_topics_for(RULES, "$share/g/phones/+/spectrum") == {"readings"}
