"""The Kafka APIs served, with the versions listed (shared/research/kafka-protocol.md says why
these: about the Kafka 2.1-2.3 level, with the low minimums old librdkafka looks for), and their
schemas, written from Kafka's message definitions (clients/src/main/resources/common/message/
*.json of Apache Kafka 4.x) for the versions listed: a field that exists only in other versions
is left out.
"""

from __future__ import annotations

from typing import Final

from ._admin_apis import ADMIN_APIS
from ._group_apis import GROUP_APIS
from ._schema import INT32_MIN, Api, Field, Schema, array

API_VERSIONS = Api(
    18,
    "ApiVersions",
    0,
    4,
    Schema(
        (
            Field("client_software_name", "string", since=3, default=""),
            Field("client_software_version", "string", since=3, default=""),
        ),
        flexible_since=3,
    ),
    Schema(
        (
            Field("error_code", "int16"),
            array(
                "api_keys",
                (
                    Field("api_key", "int16"),
                    Field("min_version", "int16"),
                    Field("max_version", "int16"),
                ),
            ),
            Field("throttle_time_ms", "int32", since=1),
        ),
        flexible_since=3,
    ),
)

METADATA = Api(
    3,
    "Metadata",
    0,
    8,
    Schema(
        (
            array("topics", (Field("name", "string"),), nullable_since=1),
            Field("allow_auto_topic_creation", "bool", since=4, default=True),
            Field("include_cluster_authorized_operations", "bool", since=8),
            Field("include_topic_authorized_operations", "bool", since=8),
        ),
        flexible_since=9,
    ),
    Schema(
        (
            Field("throttle_time_ms", "int32", since=3),
            array(
                "brokers",
                (
                    Field("node_id", "int32"),
                    Field("host", "string"),
                    Field("port", "int32"),
                    Field("rack", "string", since=1, nullable_since=1),
                ),
            ),
            Field("cluster_id", "string", since=2, nullable_since=2),
            Field("controller_id", "int32", since=1, default=-1),
            array(
                "topics",
                (
                    Field("error_code", "int16"),
                    Field("name", "string"),
                    Field("is_internal", "bool", since=1),
                    array(
                        "partitions",
                        (
                            Field("error_code", "int16"),
                            Field("partition_index", "int32"),
                            Field("leader_id", "int32", default=-1),
                            Field("leader_epoch", "int32", since=7, default=-1),
                            array("replica_nodes", "int32"),
                            array("isr_nodes", "int32"),
                            array("offline_replicas", "int32", since=5),
                        ),
                    ),
                    Field("topic_authorized_operations", "int32", since=8, default=INT32_MIN),
                ),
            ),
            Field("cluster_authorized_operations", "int32", since=8, default=INT32_MIN),
        ),
        flexible_since=9,
    ),
)

PRODUCE = Api(
    0,
    "Produce",
    0,
    8,
    Schema(
        (
            Field("transactional_id", "string", since=3, nullable_since=3),
            Field("acks", "int16"),
            Field("timeout_ms", "int32"),
            array(
                "topic_data",
                (
                    Field("name", "string"),
                    array(
                        "partition_data",
                        (Field("index", "int32"), Field("records", "records")),
                    ),
                ),
            ),
        ),
        flexible_since=9,
    ),
    Schema(
        (
            array(
                "responses",
                (
                    Field("name", "string"),
                    array(
                        "partition_responses",
                        (
                            Field("index", "int32"),
                            Field("error_code", "int16"),
                            Field("base_offset", "int64", default=-1),
                            Field("log_append_time_ms", "int64", since=2, default=-1),
                            Field("log_start_offset", "int64", since=5, default=-1),
                            array(
                                "record_errors",
                                (
                                    Field("batch_index", "int32"),
                                    Field("batch_index_error_message", "string", nullable_since=0),
                                ),
                                since=8,
                            ),
                            Field("error_message", "string", since=8, nullable_since=8),
                        ),
                    ),
                ),
            ),
            Field("throttle_time_ms", "int32", since=1),
        ),
        flexible_since=9,
    ),
)

FETCH = Api(
    1,
    "Fetch",
    4,
    11,
    Schema(
        (
            Field("replica_id", "int32", default=-1),
            Field("max_wait_ms", "int32"),
            Field("min_bytes", "int32"),
            Field("max_bytes", "int32", since=3, default=0x7FFFFFFF),
            Field("isolation_level", "int8", since=4),
            Field("session_id", "int32", since=7),
            Field("session_epoch", "int32", since=7, default=-1),
            array(
                "topics",
                (
                    Field("topic", "string"),
                    array(
                        "partitions",
                        (
                            Field("partition", "int32"),
                            Field("current_leader_epoch", "int32", since=9, default=-1),
                            Field("fetch_offset", "int64"),
                            Field("log_start_offset", "int64", since=5, default=-1),
                            Field("partition_max_bytes", "int32"),
                        ),
                    ),
                ),
            ),
            array(
                "forgotten_topics_data",
                (Field("topic", "string"), array("partitions", "int32")),
                since=7,
            ),
            Field("rack_id", "string", since=11, default=""),
        ),
        flexible_since=12,
    ),
    Schema(
        (
            Field("throttle_time_ms", "int32", since=1),
            Field("error_code", "int16", since=7),
            Field("session_id", "int32", since=7),
            array(
                "responses",
                (
                    Field("topic", "string"),
                    array(
                        "partitions",
                        (
                            Field("partition_index", "int32"),
                            Field("error_code", "int16"),
                            Field("high_watermark", "int64", default=-1),
                            Field("last_stable_offset", "int64", since=4, default=-1),
                            Field("log_start_offset", "int64", since=5, default=-1),
                            array(
                                "aborted_transactions",
                                (Field("producer_id", "int64"), Field("first_offset", "int64")),
                                since=4,
                                nullable_since=4,
                            ),
                            Field("preferred_read_replica", "int32", since=11, default=-1),
                            Field("records", "records"),
                        ),
                    ),
                ),
            ),
        ),
        flexible_since=12,
    ),
)

LIST_OFFSETS = Api(
    2,
    "ListOffsets",
    1,
    5,
    Schema(
        (
            Field("replica_id", "int32", default=-1),
            Field("isolation_level", "int8", since=2),
            array(
                "topics",
                (
                    Field("name", "string"),
                    array(
                        "partitions",
                        (
                            Field("partition_index", "int32"),
                            Field("current_leader_epoch", "int32", since=4, default=-1),
                            Field("timestamp", "int64"),
                        ),
                    ),
                ),
            ),
        ),
        flexible_since=6,
    ),
    Schema(
        (
            Field("throttle_time_ms", "int32", since=2),
            array(
                "topics",
                (
                    Field("name", "string"),
                    array(
                        "partitions",
                        (
                            Field("partition_index", "int32"),
                            Field("error_code", "int16"),
                            Field("timestamp", "int64", default=-1),
                            Field("offset", "int64", default=-1),
                            Field("leader_epoch", "int32", since=4, default=-1),
                        ),
                    ),
                ),
            ),
        ),
        flexible_since=6,
    ),
)

CREATE_TOPICS = Api(
    19,
    "CreateTopics",
    2,
    4,
    Schema(
        (
            array(
                "topics",
                (
                    Field("name", "string"),
                    Field("num_partitions", "int32", default=-1),
                    Field("replication_factor", "int16", default=-1),
                    array(
                        "assignments",
                        (Field("partition_index", "int32"), array("broker_ids", "int32")),
                    ),
                    array(
                        "configs",
                        (Field("name", "string"), Field("value", "string", nullable_since=0)),
                    ),
                ),
            ),
            Field("timeout_ms", "int32"),
            Field("validate_only", "bool", since=1),
        ),
        flexible_since=5,
    ),
    Schema(
        (
            Field("throttle_time_ms", "int32", since=2),
            array(
                "topics",
                (
                    Field("name", "string"),
                    Field("error_code", "int16"),
                    Field("error_message", "string", since=1, nullable_since=0),
                ),
            ),
        ),
        flexible_since=5,
    ),
)

DELETE_TOPICS = Api(
    20,
    "DeleteTopics",
    1,
    3,
    Schema((array("topic_names", "string"), Field("timeout_ms", "int32")), flexible_since=4),
    Schema(
        (
            Field("throttle_time_ms", "int32", since=1),
            array("responses", (Field("name", "string"), Field("error_code", "int16"))),
        ),
        flexible_since=4,
    ),
)

INIT_PRODUCER_ID = Api(
    22,
    "InitProducerId",
    0,
    1,
    Schema(
        (
            Field("transactional_id", "string", nullable_since=0),
            Field("transaction_timeout_ms", "int32"),
        ),
        flexible_since=2,
    ),
    Schema(
        (
            Field("throttle_time_ms", "int32"),
            Field("error_code", "int16"),
            Field("producer_id", "int64", default=-1),
            Field("producer_epoch", "int16", default=-1),
        ),
        flexible_since=2,
    ),
)

OFFSET_FOR_LEADER_EPOCH = Api(
    23,
    "OffsetForLeaderEpoch",
    2,
    3,
    Schema(
        (
            Field("replica_id", "int32", since=3, default=-2),
            array(
                "topics",
                (
                    Field("topic", "string"),
                    array(
                        "partitions",
                        (
                            Field("partition", "int32"),
                            Field("current_leader_epoch", "int32", default=-1),
                            Field("leader_epoch", "int32"),
                        ),
                    ),
                ),
            ),
        ),
        flexible_since=4,
    ),
    Schema(
        (
            Field("throttle_time_ms", "int32"),
            array(
                "topics",
                (
                    Field("topic", "string"),
                    array(
                        "partitions",
                        (
                            Field("error_code", "int16"),
                            Field("partition", "int32"),
                            Field("leader_epoch", "int32", default=-1),
                            Field("end_offset", "int64", default=-1),
                        ),
                    ),
                ),
            ),
        ),
        flexible_since=4,
    ),
)

APIS: Final[dict[int, Api]] = {
    api.key: api
    for api in (
        *ADMIN_APIS,  # _admin_apis: SASL, ACLs, configs, partitions
        API_VERSIONS,
        METADATA,
        PRODUCE,
        FETCH,
        LIST_OFFSETS,
        CREATE_TOPICS,
        DELETE_TOPICS,
        INIT_PRODUCER_ID,
        OFFSET_FOR_LEADER_EPOCH,
        *GROUP_APIS,  # _group_apis: consumer groups
    )
}
"""The APIs served, by key."""
