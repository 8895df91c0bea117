"""The source's options: parsed and checked once, on the driver, before anything is read.

The names and meanings follow Spark's built-in Kafka source (``subscribe``, ``startingOffsets``,
``failOnDataLoss``...), so a data engineer's habits carry over; ``bootstrap`` names the brokers.
Pure: no I/O here. Everything is checked at planning time, so a typo or a contradiction fails the
query before a task starts, with a message that names the option (``OptionError``).

Option names are case-insensitive, as Spark's are: Spark hands the source a case-insensitive map
whose keys it has already lower-cased, and a copy of it into a plain ``dict`` keeps only the
lower-cased keys. So lookups here go through ``_lowered`` and never by the camel-case spelling;
messages use the documented spelling.

Security options are Spark's Kafka source's without its ``kafka.`` prefix (``security.protocol``,
``sasl.mechanism``, ``sasl.username``, ``sasl.password``, ``ssl.truststore.location`` (PEM),
``ssl.keystore.location``, ``ssl.endpoint.identification.algorithm``): they are handed whole to
``kafkaesque.client.Security.from_options``, which names any it does not know, and the
``Security`` it makes travels in ``SourceOptions`` to every client the source opens, on the
driver and on the executors.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from kafkaesque.client import ClientConfig, TopicPartition, parse_bootstrap

EARLIEST = -2
"""In a per-partition offsets JSON, the partition's log start (as in Spark's Kafka source)."""
LATEST = -1
"""In a per-partition offsets JSON, the partition's end: the next offset to be committed."""

# As Kafka's max.partition.fetch.bytes. Larger fetches mean larger Arrow batches, which decoded
# and moved slower here (cache misses): 16 MiB cost a fifth of the rate.
DEFAULT_FETCH_MAX_BYTES = 1024 * 1024
DEFAULT_FAILOVER_TIMEOUT_MS = 60_000
MAX_FETCH_BYTES = 48 * 1024 * 1024  # below the client's 64 MiB reply limit, with headroom


class OptionError(ValueError):
    """An option is unknown, malformed, or contradicts another; the message names it."""


class Mode(Enum):
    """What kind of query the options are for: some options only make sense in one."""

    BATCH = "batch"
    STREAMING = "streaming"


# The options we read, by lower-cased name -> documented spelling.
_KNOWN = {
    name.lower(): name
    for name in (
        "bootstrap",
        "kafka.bootstrap.servers",
        "subscribe",
        "subscribePattern",
        "assign",
        "startingOffsets",
        "startingTimestamp",
        "startingOffsetsByTimestamp",
        "startingOffsetsByTimestampStrategy",
        "endingOffsets",
        "maxOffsetsPerTrigger",
        "minPartitions",
        "failOnDataLoss",
        "includeHeaders",
        "fetchMaxBytes",
        "useArrow",
        "failoverTimeoutMs",
    )
}

# Options of Spark's Kafka source that this one does not offer: named so the error says so
# rather than "unknown". Anything else starting with "kafka." is a Kafka consumer setting.
_KAFKA_ONLY = {
    name.lower(): name
    for name in (
        "endingOffsetsByTimestamp",
        "endingTimestamp",
        "minOffsetsPerTrigger",
        "maxTriggerDelay",
        "maxRecordsPerPartition",
        "groupIdPrefix",
        "kafkaConsumer.pollTimeoutMs",
        "fetchOffset.numRetries",
        "fetchOffset.retryIntervalMs",
    )
}


def _is_security(key: str) -> bool:
    """Whether a lower-cased option name is a security setting (``Security.from_options``)."""
    return key == "security.protocol" or key.startswith(("sasl.", "ssl."))


@dataclass(frozen=True)
class Subscription:
    """Which partitions to read: exactly one of the three ways Spark's Kafka source offers.

    ``topics`` for ``subscribe`` (every partition of each), ``pattern`` for ``subscribePattern``
    (every partition of every topic whose whole name matches, internal ``__`` topics excepted),
    ``assigned`` for ``assign`` (exactly these partitions).
    """

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[TopicPartition, ...] = ()

    def describe(self) -> str:
        """How the user said it, for messages."""
        if self.pattern is not None:
            return f"subscribePattern {self.pattern!r}"
        if self.assigned:
            return "assign " + ",".join(f"{tp.topic}/{tp.partition}" for tp in self.assigned)
        return "subscribe " + ",".join(self.topics)

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` belongs to a pattern subscription (a whole-name match, as Java's
        ``Pattern.matcher(topic).matches()`` in Spark's Kafka source)."""
        if self.pattern is None:
            return topic in self.topics or any(tp.topic == topic for tp in self.assigned)
        return not topic.startswith("__") and re.fullmatch(self.pattern, topic) is not None


OffsetSpec = str | Mapping[TopicPartition, int]
"""``"earliest"``, ``"latest"``, or explicit offsets per partition (``EARLIEST``/``LATEST`` allowed
as values where the query kind allows them)."""

TimeSpec = int | Mapping[TopicPartition, int]
"""Where to start by time: one timestamp for every partition read (``startingTimestamp``), or one
per partition (``startingOffsetsByTimestamp``); milliseconds since the epoch."""


def time_option(spec: TimeSpec) -> str:
    """The option a ``TimeSpec`` came from, for messages."""
    return "startingTimestamp" if isinstance(spec, int) else "startingOffsetsByTimestamp"


@dataclass(frozen=True)
class SourceOptions:
    """Every option, parsed. Built by ``parse_options``; picklable (it travels to executors)."""

    bootstrap: str
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    fail_on_data_loss: bool
    include_headers: bool
    fetch_max_bytes: int
    use_arrow: bool
    failover_timeout_ms: int
    # Spark's precedence: startingTimestamp, then startingOffsetsByTimestamp, then
    # startingOffsets (which is ignored when either is given).
    starting_times: TimeSpec | None = None
    # startingOffsetsByTimestampStrategy: for a partition with no record at or after its time,
    # start at its end ("latest", True) or fail the query ("error", False).
    latest_if_no_time_match: bool = False
    # kafkaesque.client.Security from the security options; None: plaintext, no authentication.
    security: Any = None

    def client_config(self, **settings: Any) -> ClientConfig:
        """A ``ClientConfig`` with ``settings`` and this query's security."""
        return client_config(self.security, **settings)


def client_config(security: Any, **settings: Any) -> ClientConfig:
    """``ClientConfig(**settings)`` with ``security`` (a ``kafkaesque.client.Security``) if one.

    The client gets a copy: a ``Security`` keeps the TLS context it builds on first use, which
    does not pickle, and the one in the options travels to the executors."""
    if security is None:
        return ClientConfig(**settings)
    return ClientConfig(security=dataclasses.replace(security), **settings)


def _lowered(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def parse_options(options: Mapping[str, str], mode: Mode | None = None) -> SourceOptions:
    """Check ``options`` (Spark's options map, or any mapping, keys in any case) and parse them.

    ``mode`` None checks what holds for both kinds of query (the schema is asked for before Spark
    says which kind it plans); ``BATCH`` or ``STREAMING`` adds the checks of that kind. Raises
    ``OptionError`` naming the first option that is unknown, malformed or contradicted.
    """
    given = _lowered(options)
    for key in given:
        if key in _KNOWN or _is_security(key):
            continue
        if key.startswith("kafka.") and _is_security(key[len("kafka.") :]):
            raise OptionError(
                f"option {key!r}: kafkaesque names Spark's Kafka security options without the "
                f"kafka. prefix: {key[len('kafka.') :]!r}"
            )
        if key == "path":
            raise OptionError(
                "kafkaesque takes no path: call load() without one and name the topics with "
                "subscribe, subscribePattern or assign"
            )
        if key in _KAFKA_ONLY or key.startswith("kafka."):
            name = _KAFKA_ONLY.get(key, key)
            raise OptionError(
                f"option {name!r} of Spark's Kafka source is not supported by kafkaesque "
                "(see docs/spark.md for the options it has)"
            )
        raise OptionError(
            f"unknown option {key!r}; kafkaesque knows: " + ", ".join(sorted(_KNOWN.values()))
        )

    bootstrap = _bootstrap(given)
    subscription = _subscription(given)
    default_start = "latest" if mode is Mode.STREAMING else "earliest"
    starting = _offset_spec(given, "startingOffsets", default_start)
    ending = _offset_spec(given, "endingOffsets", "latest")
    _check_spec_partitions(subscription, "startingOffsets", starting)
    _check_spec_partitions(subscription, "endingOffsets", ending)
    starting_times = _time_spec(given)
    if isinstance(starting_times, Mapping):
        _check_spec_partitions(
            subscription,
            "startingOffsetsByTimestamp",
            starting_times,
            what="a timestamp",
            values="",
        )
    max_per_trigger = _positive_int(given, "maxOffsetsPerTrigger")
    parsed = SourceOptions(
        bootstrap=bootstrap,
        subscription=subscription,
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=max_per_trigger,
        min_partitions=_positive_int(given, "minPartitions"),
        fail_on_data_loss=_bool(given, "failOnDataLoss", True),
        include_headers=_bool(given, "includeHeaders", False),
        fetch_max_bytes=_positive_int(given, "fetchMaxBytes") or DEFAULT_FETCH_MAX_BYTES,
        use_arrow=_bool(given, "useArrow", True),
        failover_timeout_ms=(
            _positive_int(given, "failoverTimeoutMs") or DEFAULT_FAILOVER_TIMEOUT_MS
        ),
        starting_times=starting_times,
        latest_if_no_time_match=_time_strategy(given),
        security=_security(given),
    )
    if parsed.fetch_max_bytes > MAX_FETCH_BYTES:
        raise OptionError(f"fetchMaxBytes must be at most {MAX_FETCH_BYTES}")
    if mode is Mode.BATCH:
        _check_batch(given, parsed)
    elif mode is Mode.STREAMING and "endingoffsets" in given:
        raise OptionError(
            "endingOffsets is not valid in a streaming query (use a batch query, or "
            "trigger(availableNow=True) to stop at the end of what is there now)"
        )
    return parsed


def _bootstrap(given: dict[str, str]) -> str:
    ours, kafkas = given.get("bootstrap"), given.get("kafka.bootstrap.servers")
    if ours is not None and kafkas is not None and ours != kafkas:
        raise OptionError("bootstrap and kafka.bootstrap.servers name different brokers")
    value = ours if ours is not None else kafkas
    if value is None:
        raise OptionError('option "bootstrap" is required: the brokers, "host:port,host:port"')
    try:
        parse_bootstrap(value)
    except ValueError as exc:
        raise OptionError(f"option bootstrap: {exc}") from exc
    return value


def _security(given: dict[str, str]) -> Any:
    """``Security.from_options`` of the security options; None when none is given."""
    chosen = {key: value for key, value in given.items() if _is_security(key)}
    if not chosen:
        return None
    from kafkaesque.client import Security

    try:
        return Security.from_options(chosen)
    except ValueError as exc:
        raise OptionError(f"security options: {exc}") from exc


def _subscription(given: dict[str, str]) -> Subscription:
    chosen = [name for name in ("subscribe", "subscribepattern", "assign") if name in given]
    if len(chosen) != 1:
        named = ", ".join(_KNOWN[c] for c in chosen) if chosen else "none"
        raise OptionError(
            f"exactly one of subscribe, subscribePattern and assign must be given (got: {named})"
        )
    kind = chosen[0]
    value = given[kind]
    if kind == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
        if not topics:
            raise OptionError("option subscribe names no topic (a comma-separated list)")
        return Subscription(topics=topics)
    if kind == "subscribepattern":
        if not value.strip():
            raise OptionError("option subscribePattern is empty")
        try:
            re.compile(value)
        except re.error as exc:
            raise OptionError(f"option subscribePattern is not a valid regex: {exc}") from exc
        return Subscription(pattern=value)
    assigned = _assign_json(value)
    return Subscription(assigned=assigned)


def _json_by_topic(value: str, usage: str, kind: type) -> dict[str, Any]:
    """``value`` parsed as a JSON object of topics, each mapped to a non-empty ``kind``
    (list or object); ``OptionError`` with ``usage`` otherwise."""
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise OptionError(f"{usage}: {exc}") from exc
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(usage)
    for topic, item in parsed.items():
        if not isinstance(item, kind) or not item:
            raise OptionError(f"{usage} (topic {topic!r})")
    return parsed


def _is_offset(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _assign_json(value: str) -> tuple[TopicPartition, ...]:
    usage = 'option assign must be JSON like {"topicA": [0, 1], "topicB": [2]}'
    partitions: list[TopicPartition] = []
    for topic, numbers in _json_by_topic(value, usage, list).items():
        for number in numbers:
            if not _is_offset(number, 0):
                raise OptionError(f"{usage} (topic {topic!r}: {number!r} is no partition)")
            partitions.append(TopicPartition(topic, number))
    return tuple(sorted(set(partitions)))


def _offset_spec(given: dict[str, str], name: str, default: str) -> OffsetSpec:
    value = given.get(name.lower(), default).strip()
    if value.lower() in ("earliest", "latest"):
        return value.lower()
    usage = (
        f'option {name} must be "earliest", "latest" or JSON like '
        '{"topicA": {"0": 23, "1": -1}} (-2: earliest, -1: latest)'
    )
    offsets: dict[TopicPartition, int] = {}
    for topic, by_partition in _json_by_topic(value, usage, dict).items():
        for key, offset in by_partition.items():
            if not str(key).isdigit():
                raise OptionError(f"{usage} (topic {topic!r}: partition {key!r})")
            if not _is_offset(offset, EARLIEST):
                raise OptionError(f"{usage} (topic {topic!r} partition {key}: {offset!r})")
            offsets[TopicPartition(topic, int(key))] = offset
    return offsets


def _time_spec(given: dict[str, str]) -> TimeSpec | None:
    """``startingTimestamp`` if given, else ``startingOffsetsByTimestamp`` if given (Spark's
    precedence), else None."""
    single = given.get("startingtimestamp")
    if single is not None:
        text = single.strip()
        if not text.isdigit():
            raise OptionError(
                "option startingTimestamp must be a timestamp in milliseconds since the epoch "
                f'(digits, e.g. "1764144000000"), got {single!r}'
            )
        return int(text)
    value = given.get("startingoffsetsbytimestamp")
    if value is None:
        return None
    usage = (
        "option startingOffsetsByTimestamp must be JSON like "
        '{"topicA": {"0": 1764144000000, "1": 1764144000000}} (milliseconds since the epoch)'
    )
    times: dict[TopicPartition, int] = {}
    for topic, by_partition in _json_by_topic(value, usage, dict).items():
        for key, ts in by_partition.items():
            if not str(key).isdigit():
                raise OptionError(f"{usage} (topic {topic!r}: partition {key!r})")
            if not _is_offset(ts, 0):
                raise OptionError(f"{usage} (topic {topic!r} partition {key}: {ts!r})")
            times[TopicPartition(topic, int(key))] = ts
    return times


def _time_strategy(given: dict[str, str]) -> bool:
    """``startingOffsetsByTimestampStrategy``: True for ``latest``, False for ``error``."""
    value = given.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if value not in ("error", "latest"):
        raise OptionError(
            f'option startingOffsetsByTimestampStrategy must be "error" or "latest", got {value!r}'
        )
    return value == "latest"


def _check_spec_partitions(
    subscription: Subscription,
    name: str,
    spec: OffsetSpec,
    *,
    what: str = "an offset",
    values: str = " (-2 earliest, -1 latest)",
) -> None:
    # Partitions of a subscribe/assign are known now; a pattern's only once topics are listed
    # (checked when offsets are resolved).
    if isinstance(spec, str):
        return
    for tp in spec:
        if subscription.assigned and tp not in subscription.assigned:
            raise OptionError(
                f"option {name} names {tp.topic}/{tp.partition}, which assign does not"
            )
        if not subscription.matches(tp.topic):
            raise OptionError(
                f"option {name} names topic {tp.topic!r}, which {subscription.describe()} "
                "does not read"
            )
    if subscription.assigned:
        missing = [tp for tp in subscription.assigned if tp not in spec]
        if missing:
            raise OptionError(
                f"option {name} must give {what} for every assigned partition{values}; missing: "
                + ", ".join(f"{tp.topic}/{tp.partition}" for tp in missing)
            )


def _positive_int(given: dict[str, str], name: str) -> int | None:
    value = given.get(name.lower())
    if value is None:
        return None
    text = value.strip()
    if not text.isdigit() or int(text) < 1:
        raise OptionError(f"option {name} must be a positive integer, got {value!r}")
    return int(text)


def _bool(given: dict[str, str], name: str, default: bool) -> bool:
    value = given.get(name.lower())
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise OptionError(f"option {name} must be true or false, got {value!r}")


def _check_batch(given: dict[str, str], parsed: SourceOptions) -> None:
    # A batch query reads a fixed range: it cannot start at the end nor end at the start.
    for name, spec, word, value in (
        ("startingOffsets", parsed.starting, "latest", LATEST),
        ("endingOffsets", parsed.ending, "earliest", EARLIEST),
    ):
        if spec == word:
            raise OptionError(f'{name} "{word}" is not valid in a batch query')
        for tp, offset in spec.items() if isinstance(spec, Mapping) else ():
            if offset == value:
                raise OptionError(
                    f"{name} for {tp.topic}/{tp.partition} can't be {word} ({value}) in a "
                    "batch query"
                )
    if "maxoffsetspertrigger" in given:
        raise OptionError("maxOffsetsPerTrigger applies to streaming queries only")
